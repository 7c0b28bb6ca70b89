"""The torch backend's compiled kernel: canonical-order attention for exact mode.

``csrc/exact_attention.cpp`` is built for this machine the first time exact mode runs on a CPU
(``torch.utils.cpp_extension``, about 40 seconds, with the C++ compiler torch extensions use and
``-march=native``) and kept in torch's extension cache (``$TORCH_EXTENSIONS_DIR``, by default
``~/.cache/torch_extensions``) under a name that changes with the source, the flags, the CPU,
the torch version and the environment torch is installed in, so a stale build is never loaded
and two environments do not rebuild one folder in turn. Where it cannot be built (no compiler, a
failed build, ``SPECDEC_TORCH_KERNEL=0``) exact mode computes the same canonical attention from
torch operations (``specdec_torch.exact.attend_split``), exact too but slower; ``kernel_status``
says which and why.
"""

from __future__ import annotations

import hashlib
import logging
import os
import sys
import threading
from pathlib import Path
from typing import Any

import torch

from specdec.tuning.machine import cpu_description

__all__ = ["KERNEL_VARIABLE", "attention_kernel", "kernel_status"]

KERNEL_VARIABLE = "SPECDEC_TORCH_KERNEL"  # "0" keeps exact mode on torch operations
SOURCE = Path(__file__).with_name("csrc") / "exact_attention.cpp"
# No fused multiply-adds chosen by the compiler: a product and a sum written once compile to the
# same operations wherever the compiler inlines them.
FLAGS = ("-O3", "-march=native", "-fno-math-errno", "-ffp-contract=off")
log = logging.getLogger("specdec.torch")
_LOCK = threading.Lock()
_STATE: dict[str, Any] = {}


def _build_name() -> str:
    # torch's own folder too: its build file names the environment's include paths, so two
    # environments sharing one folder rebuilt it in turn (each waiting on the other's lock)
    torch_folder = str(Path(torch.__file__).resolve().parent)
    key = "|".join(
        [SOURCE.read_text(), " ".join(FLAGS), cpu_description(), torch.__version__, torch_folder]
    )
    return "specdec_exact_attention_" + hashlib.sha256(key.encode()).hexdigest()[:16]


def attention_kernel():
    """The compiled module (its ``exact_attention``), built on first use; None where it cannot be
    (``kernel_status`` says why)."""
    with _LOCK:
        if "module" in _STATE:
            return _STATE["module"]
        module, status = None, ""
        if os.environ.get(KERNEL_VARIABLE, "").strip() == "0":
            status = f"not used (${KERNEL_VARIABLE}=0)"
        else:
            try:
                module, status = _load()
            except Exception as exc:  # noqa: BLE001
                # any build failure falls back to torch operations
                detail = " ".join(str(exc).split())[:300] or type(exc).__name__
                status = f"not built ({detail}); exact mode uses torch operations"
                log.warning(
                    "specdec: the torch backend's exact attention kernel could not be built: %s",
                    detail,
                )
        _STATE["module"], _STATE["status"] = module, status
        return module


def _load():
    # optional: setuptools (building the kernel; torch operations without it)
    from torch.utils import cpp_extension

    name = _build_name()
    folder = Path(cpp_extension._get_build_directory(name, verbose=False))
    built = any(folder.glob(f"{name}*.so"))
    lock = folder / "lock"  # torch's: held while a process builds into the folder
    if lock.exists():
        print(
            "specdec: waiting for another process compiling the exact attention kernel into "
            f"{folder} (if none is, a build stopped part way left {lock}: delete it)",
            file=sys.stderr,
            flush=True,
        )
    elif not built:
        print(
            "specdec: compiling the exact attention kernel for this machine (once, about a "
            "minute; exact mode's check runs on it, and so does attention where exact mode holds)",
            file=sys.stderr,
            flush=True,
        )
    module = cpp_extension.load(
        name=name, sources=[str(SOURCE)], extra_cflags=list(FLAGS), verbose=False
    )
    return module, f"compiled for this CPU ({'cached' if built else 'built now'})"


def kernel_status() -> str:
    """How exact mode computes attention here, in a few words (after ``attention_kernel``)."""
    attention_kernel()
    return _STATE["status"] or "compiled for this CPU"
