"""The dtypes and devices the MLX backend runs in, and how a device is described where a
measured speed is cached (``specdec.tuning``)."""

from __future__ import annotations

import mlx.core as mx

from specdec.errors import InvalidInputError
from specdec.tuning.machine import cpu_description
from specdec_mlx.blas import blas_threads

__all__ = ["DEVICES", "DTYPES", "describe_device", "parse_dtype", "select_device"]

DTYPES = {"float32": mx.float32, "bfloat16": mx.bfloat16, "float16": mx.float16}
DEVICES = {"cpu": "cpu", "gpu": "gpu", "metal": "gpu"}


def parse_dtype(dtype: str | None):
    """The MLX compute dtype for a user's dtype name (None: float32)."""
    if dtype is None:
        return mx.float32
    if dtype not in DTYPES:
        raise InvalidInputError(
            f"the mlx backend computes in {', '.join(DTYPES)}; got dtype={dtype!r} "
            "(float64 is the numpy backend's)"
        )
    return DTYPES[dtype]


def select_device(device: str | None) -> None:
    """Make ``device`` ("cpu", "gpu" or "metal") MLX's default device; None keeps the default.

    MLX has one default device per process, so this affects every MLX computation after it.
    """
    if device is None:
        return
    if device not in DEVICES:
        raise InvalidInputError(
            f"the mlx backend runs on {', '.join(DEVICES)}; got device={device!r}"
        )
    wanted = mx.gpu if DEVICES[device] == "gpu" else mx.cpu
    if wanted == mx.gpu and not mx.metal.is_available():
        raise InvalidInputError(
            "device='gpu' needs Metal (Apple silicon); this MLX build has only the cpu"
        )
    if mx.default_device() != wanted:
        mx.set_default_device(wanted)


def describe_device(device: str | None = None) -> str:
    """The device, the CPU (model and flags), the MLX version and, on the CPU, the OpenBLAS's
    thread count (``specdec_mlx.blas.fit_blas_threads``) a measured speed depends on."""
    where = DEVICES.get(device, "gpu" if mx.default_device() == mx.gpu else "cpu")
    threads = blas_threads() if where == "cpu" else None
    blas = "" if threads is None else f", OpenBLAS on {threads} thread{'s' * (threads != 1)}"
    return f"mlx {mx.__version__} {where}, {cpu_description()}{blas}"
