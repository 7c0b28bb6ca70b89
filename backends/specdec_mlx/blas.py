"""MLX on Linux: use an OpenBLAS instead of the reference BLAS bundled in the wheel.

The ``mlx[cpu]`` wheel for Linux links its matrix products against the reference BLAS it bundles
(``mlx_cpu.libs/libblas-*.so``), which computes a product of k rows k times as slowly as one
row: a 16-token verification tree costs about 12 one-token steps, and no speculation can pay.
MLX resolves ``cblas_sgemm`` and its kin when its library loads, looking in the process's global
scope first. So, when the mlx backend is first asked for, before ``mlx.core`` is imported,
``prefer_system_blas`` loads an OpenBLAS found on the system into the global scope, and MLX then
binds to it: the same effect as ``LD_PRELOAD=.../libblas.so.3`` without asking the user for it.

The OpenBLAS comes from PyPI by default: the ``mlx`` extra installs ``ngsolve-openblas`` on
x86-64 Linux, a plain OpenBLAS build (standard ``cblas_*`` names, unlike numpy's and
``scipy-openblas32``'s prefixed ones) that needs ``libgfortran.so.5``, which it looks for beside
itself. ``load_pip_openblas`` gives it the libgfortran the ``mlx[cpu]`` wheel bundles: it loads
that one first, then the OpenBLAS through a link in a private temporary folder that also holds a
``libgfortran.so.5`` link to it (the loader sees the same file, already loaded), and removes the
folder. Where that package is missing, a system OpenBLAS is loaded instead.
A library in the global scope also takes the BLAS calls of every native library loaded after it
that names the same functions: torch's wheels build MKL into ``libtorch_cpu.so`` and call it by
its exported names (``sgemm_``, ``cblas_sgemm_batch``), which bind, when the library loads, to
the first definition in the global scope. A torch loaded after the OpenBLAS therefore ran its
float32 products on it: more slowly than on MKL, and its batched products (attention's) in
OpenBLAS 0.3.33's ``cblas_sgemm_batch``, which crashed the process (SIGSEGV in its small-matrix
path). So ``keep_torch_on_its_blas`` first loads torch's native library (without importing
torch, which would take seconds), whose calls then stay bound to its own MKL whatever is loaded
later; MLX alone binds to the OpenBLAS. It is still done only in processes that use the mlx
backend, never at import or plugin registration, and a BLAS preloaded by the user
(``LD_PRELOAD``) takes torch's calls as before.

OpenBLAS starts as many threads as the machine has cores, and they wait on one another: beside a
process that kept one of two cores busy, SmolLM2-135M decoded plainly at 5.2 tokens/s on two
threads and 9.5 on one (0.3 against 5.1 on a machine busier still). So, as the torch backend
fits its threads (``specdec_torch.threads``), ``fit_blas_threads`` gives the OpenBLAS it loaded
the cores other processes leave free, with one line on stderr, unless ``OPENBLAS_NUM_THREADS``
or ``OMP_NUM_THREADS`` chose the count.

``$SPECDEC_MLX_BLAS`` names a BLAS library to load instead, ``system`` to prefer the system's
OpenBLAS, or ``bundled`` to keep MLX's own.
Where no OpenBLAS is found, or MLX was imported first, ``blas_hint`` gives the one-line advice
that ``MlxBackend.load_target`` prints once.
"""

from __future__ import annotations

import ctypes
import glob
import importlib.util
import os
import shutil
import sys
import tempfile
from pathlib import Path

from specdec.tuning.machine import cores, free_cores, steady_busy_cores

__all__ = [
    "blas_hint",
    "blas_threads",
    "fit_blas_threads",
    "keep_torch_on_its_blas",
    "load_pip_openblas",
    "pip_openblas",
    "prefer_system_blas",
    "system_blas_candidates",
    "torch_native_libraries",
]

VARIABLE = "SPECDEC_MLX_BLAS"
THREAD_VARIABLES = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS")  # a count the user chose
_state = {"loaded": None, "tried": False}


def system_blas_candidates() -> list[str]:
    """OpenBLAS libraries of this system, the threaded builds first (Debian/Ubuntu multiarch
    folders, then the usual library folders)."""
    patterns = (
        "/usr/lib/*-linux-gnu/openblas-pthread/libblas.so.3",
        "/usr/lib/*-linux-gnu/openblas-openmp/libblas.so.3",
        "/usr/lib/*-linux-gnu/libopenblas.so.0",
        "/usr/lib64/libopenblas.so.0",
        "/usr/lib/libopenblas.so.0",
        "/usr/local/lib/libopenblas.so.0",
    )
    found = []
    for pattern in patterns:
        found.extend(sorted(glob.glob(pattern)))
    return found


def _package_folder(name: str) -> Path | None:
    """The folder of an installed package, found without importing it."""
    spec = importlib.util.find_spec(name)
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    return Path(locations[0]) if locations else None


def pip_openblas() -> tuple[str, str] | None:
    """(OpenBLAS, the libgfortran for it) from pip packages: ``ngsolve-openblas`` and the
    libgfortran that the ``mlx[cpu]`` wheel bundles (``mlx_cpu.libs``); None when either is
    missing."""
    folder, mlx = _package_folder("ngsolve_openblas"), _package_folder("mlx")
    if folder is None or mlx is None:
        return None
    openblas = sorted(glob.glob(str(folder / "libopenblas*.so*")))
    gfortran = sorted(glob.glob(str(mlx.parent / "mlx_cpu.libs" / "libgfortran*.so*")))
    return (openblas[0], gfortran[0]) if openblas and gfortran else None


def load_pip_openblas(libraries: tuple[str, str]) -> None:
    """Load ``pip_openblas()``'s OpenBLAS into the global scope (module docstring); OSError if it
    cannot be loaded."""
    openblas, gfortran = libraries
    ctypes.CDLL(gfortran, mode=os.RTLD_GLOBAL)
    folder = tempfile.mkdtemp(prefix="specdec-blas-")
    try:
        os.symlink(gfortran, os.path.join(folder, "libgfortran.so.5"))
        os.symlink(openblas, os.path.join(folder, "libopenblas.so.0"))
        ctypes.CDLL(os.path.join(folder, "libopenblas.so.0"), mode=os.RTLD_GLOBAL)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def torch_native_libraries() -> list[str]:
    """torch's native library that carries its BLAS (``torch/lib/libtorch_cpu.so``), found without
    importing torch; empty when torch is not installed (or is laid out otherwise)."""
    folder = _package_folder("torch")
    return sorted(glob.glob(str(folder / "lib" / "libtorch_cpu.so*"))) if folder else []


def keep_torch_on_its_blas() -> None:
    """Bind torch's BLAS calls to its own library before another BLAS enters the global scope
    (module docstring): load ``libtorch_cpu.so`` now, resolving every symbol at once
    (``RTLD_NOW``) and privately (``RTLD_LOCAL``); a later ``import torch`` finds it loaded. Nothing
    to do when torch is not installed or already imported; where its library is not found or does
    not load, torch is imported instead."""
    if "torch" in sys.modules or importlib.util.find_spec("torch") is None:
        return
    for library in torch_native_libraries():
        try:
            _state["torch"] = ctypes.CDLL(library, mode=os.RTLD_NOW | os.RTLD_LOCAL)
        except OSError:
            break
        else:
            return
    try:
        import torch  # noqa: F401  # optional: torch (torch extra)
    except (ImportError, OSError):  # a torch that does not load: nothing of it to keep bound
        pass


def prefer_system_blas() -> str | None:
    """Load an OpenBLAS into the global symbol scope before MLX loads: the one named by
    ``$SPECDEC_MLX_BLAS``, else the pip package's (``pip_openblas``; unless the variable says
    ``system``), else the system's; returns the library loaded, or None (not Linux, MLX not
    installed or already imported, none found, or ``bundled``)."""
    if _state["tried"]:
        return _state["loaded"]
    _state["tried"] = True
    choice = os.environ.get(VARIABLE, "").strip()
    if not sys.platform.startswith("linux") or choice == "bundled" or "mlx.core" in sys.modules:
        return None
    if importlib.util.find_spec("mlx") is None:
        return None
    keep_torch_on_its_blas()
    if not choice:
        wheel = pip_openblas()
        if wheel is not None:
            try:
                load_pip_openblas(wheel)
            except OSError:
                pass
            else:
                _state["loaded"] = wheel[0]
                fit_blas_threads()
                return wheel[0]
    for library in [choice] if choice not in ("", "system") else system_blas_candidates():
        try:
            ctypes.CDLL(library, mode=os.RTLD_GLOBAL)
        except OSError:
            continue
        _state["loaded"] = library
        fit_blas_threads()
        return library
    return None


def _openblas_calls():
    """(get, set) of the loaded OpenBLAS's thread count, or None (a BLAS without them)."""
    try:
        scope = ctypes.CDLL(None)
        get, put = scope.openblas_get_num_threads, scope.openblas_set_num_threads
    except (AttributeError, OSError):
        return None
    get.restype, put.argtypes = ctypes.c_int, [ctypes.c_int]
    return get, put


def blas_threads() -> int | None:
    """The OpenBLAS's thread count (None where none with that call is loaded)."""
    calls = _openblas_calls() if _state["loaded"] or _mapped_openblas() else None
    return int(calls[0]()) if calls else None


def fit_blas_threads(measure=None) -> int | None:
    """The loaded OpenBLAS's threads lowered to the cores other processes leave free (module
    docstring; ``measure``: what counts the busy cores, ``steady_busy_cores`` by default); the
    new count, or None where it was left."""
    calls = _openblas_calls()
    if calls is None or any(os.environ.get(name, "").strip() for name in THREAD_VARIABLES):
        return None
    threads = int(calls[0]())
    if threads <= 1:
        return None
    busy = (measure or steady_busy_cores)()
    if busy is None:
        return None
    free = free_cores(busy, cores())
    if free >= threads:
        return None
    calls[1](free)
    print(
        f"specdec: {busy:.1f} of {cores()} cores busy elsewhere: mlx's OpenBLAS on {free} "
        f"thread{'s' if free > 1 else ''}, not {threads} (OPENBLAS_NUM_THREADS=N to choose)",
        file=sys.stderr,
        flush=True,
    )
    return free


def blas_hint() -> str | None:
    """One line of advice when MLX on Linux runs on its bundled reference BLAS, else None."""
    if not sys.platform.startswith("linux") or os.environ.get(VARIABLE, "").strip() == "bundled":
        return None
    if _state["loaded"] or _mapped_openblas():  # ours, or one the user preloaded
        return None
    slow = (
        "mlx runs on its bundled reference BLAS, under which a tree of k tokens costs about k "
        "decode steps"
    )
    if system_blas_candidates() or pip_openblas():
        return (
            f"{slow}: import specdec before mlx (specdec then loads OpenBLAS for it), or preload it"
        )
    return (
        f"{slow}: pip install ngsolve-openblas (the mlx extra does, on x86-64 Linux) or the "
        "system's OpenBLAS (Debian/Ubuntu: apt-get install libopenblas0-pthread) and specdec loads "
        f"it for mlx automatically, or name a BLAS library in ${VARIABLE}"
    )


def _mapped_openblas() -> bool:
    """Whether a system OpenBLAS is mapped into this process (numpy's own, renamed
    ``scipy_openblas``, exports no ``cblas_*`` MLX could bind to, so it does not count)."""
    try:
        with open("/proc/self/maps") as maps:
            return any("openblas" in line and "scipy_openblas" not in line for line in maps)
    except OSError:
        return False
