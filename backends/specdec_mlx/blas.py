"""MLX on Linux: use the system's OpenBLAS instead of the reference BLAS bundled in the wheel.

The ``mlx[cpu]`` wheel for Linux links its matrix products against the reference BLAS it bundles
(``mlx_cpu.libs/libblas-*.so``), which computes a product of k rows k times as slowly as one
row: a 16-token verification tree costs about 12 one-token steps, and no speculation can pay.
MLX resolves ``cblas_sgemm`` and its kin when its library loads, looking in the process's global
scope first. So, when the mlx backend is first asked for, before ``mlx.core`` is imported,
``prefer_system_blas`` loads an OpenBLAS found on the system into the global scope, and MLX then
binds to it: the same effect as ``LD_PRELOAD=.../libblas.so.3`` without asking the user for it.
Every BLAS call of that process then goes to OpenBLAS, torch's float32 matrix products included
(several times slower than torch's own MKL on a busy 2-core machine), so it is done only in
processes that use the mlx backend, never at import or plugin registration.

``$SPECDEC_MLX_BLAS`` names a BLAS library to load instead, or ``bundled`` to keep MLX's own.
Where no OpenBLAS is found, or MLX was imported first, ``blas_hint`` gives the one-line advice
that ``MlxBackend.load_target`` prints once.
"""

from __future__ import annotations

import ctypes
import glob
import importlib.util
import os
import sys

__all__ = ["blas_hint", "prefer_system_blas", "system_blas_candidates"]

VARIABLE = "SPECDEC_MLX_BLAS"
_state = {"loaded": None, "tried": False}


def system_blas_candidates() -> list[str]:
    """OpenBLAS libraries of this system, the threaded builds first (Debian/Ubuntu multiarch
    folders, then the usual library folders)."""
    patterns = ("/usr/lib/*-linux-gnu/openblas-pthread/libblas.so.3", "/usr/lib/*-linux-gnu/openblas-openmp/libblas.so.3",
                "/usr/lib/*-linux-gnu/libopenblas.so.0", "/usr/lib64/libopenblas.so.0", "/usr/lib/libopenblas.so.0",
                "/usr/local/lib/libopenblas.so.0")
    found = []
    for pattern in patterns:
        found.extend(sorted(glob.glob(pattern)))
    return found


def prefer_system_blas() -> str | None:
    """Load the system OpenBLAS into the global symbol scope before MLX loads; returns the library
    loaded, or None (not Linux, MLX not installed or already imported, none found, or disabled)."""
    if _state["tried"]:
        return _state["loaded"]
    _state["tried"] = True
    choice = os.environ.get(VARIABLE, "").strip()
    if not sys.platform.startswith("linux") or choice == "bundled" or "mlx.core" in sys.modules:
        return None
    if importlib.util.find_spec("mlx") is None:
        return None
    for library in ([choice] if choice else system_blas_candidates()):
        try:
            ctypes.CDLL(library, mode=os.RTLD_GLOBAL)
        except OSError:
            continue
        _state["loaded"] = library
        return library
    return None


def blas_hint() -> str | None:
    """One line of advice when MLX on Linux runs on its bundled reference BLAS, else None."""
    if not sys.platform.startswith("linux") or os.environ.get(VARIABLE, "").strip() == "bundled":
        return None
    if _state["loaded"] or _mapped_openblas():  # ours, or one the user preloaded
        return None
    slow = "mlx runs on its bundled reference BLAS, under which a tree of k tokens costs about k decode steps"
    if system_blas_candidates():
        return f"{slow}: import specdec before mlx (specdec then loads the system OpenBLAS for it), or preload it"
    return (f"{slow}: install OpenBLAS (Debian/Ubuntu: apt-get install libopenblas0-pthread) and specdec loads it "
            f"for mlx automatically, or name a BLAS library in ${VARIABLE}")


def _mapped_openblas() -> bool:
    """Whether a system OpenBLAS is mapped into this process (numpy's own, renamed
    ``scipy_openblas``, exports no ``cblas_*`` MLX could bind to, so it does not count)."""
    try:
        with open("/proc/self/maps") as maps:
            return any("openblas" in line and "scipy_openblas" not in line for line in maps)
    except OSError:
        return False
