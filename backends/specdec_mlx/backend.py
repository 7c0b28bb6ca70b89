"""``MlxBackend``: loads mlx-lm targets and moves arrays between NumPy and MLX.

MLX is lazy: nothing runs until an array is evaluated. The decode loop reads the verdict with
``to_numpy`` once per step; that call evaluates, in one ``mx.eval``, the verdict and every
array a target registered as pending (its KV cache and lengths after ``commit``), so a step has
one evaluation point and the next step starts from materialised arrays.
"""

from __future__ import annotations

import warnings
import weakref
from typing import Any

import mlx.core as mx
import numpy as np

from specdec.errors import InvalidInputError

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
        raise InvalidInputError(f"the mlx backend runs on {', '.join(DEVICES)}; got device={device!r}")
    wanted = mx.gpu if DEVICES[device] == "gpu" else mx.cpu
    if wanted == mx.gpu and not mx.metal.is_available():
        raise InvalidInputError("device='gpu' needs Metal (Apple silicon); this MLX build has only the cpu")
    if mx.default_device() != wanted:
        mx.set_default_device(wanted)


def _warn_slow_blas() -> None:
    """Say once, at the first load, when MLX computes on the CPU with its slow bundled BLAS."""
    from specdec_mlx.blas import blas_hint

    if _warned or mx.default_device() != mx.cpu:
        return
    hint = blas_hint()
    if hint:
        warnings.warn(hint, RuntimeWarning, stacklevel=3)
    _warned.append(True)


_warned: list = []


def to_mx(array: Any) -> mx.array:
    """A NumPy array (or anything array-like) as an MLX array: int64 -> int32 (token ids and
    node indices), float64 -> float32 (uniforms, probabilities); MLX arrays pass through."""
    if isinstance(array, mx.array):
        return array
    array = np.asarray(array)
    if array.dtype == np.float64:
        array = array.astype(np.float32)
    elif np.issubdtype(array.dtype, np.integer) and array.dtype.itemsize > 4:
        array = array.astype(np.int32)
    return mx.array(array)


class MlxBackend:
    """The ``mlx`` backend: ``load_target``, ``to_numpy`` (the step's one evaluation point), ``from_numpy``."""

    name = "mlx"

    def __init__(self):
        self._targets: weakref.WeakSet = weakref.WeakSet()

    def load_target(self, source: Any, *, dtype: str | None = None, device: str | None = None, slots: int = 1,
                    capacity: int | None = None):
        """A ``MlxTarget`` from a local Hugging Face-format folder, an mlx-lm model object, a
        ``(model, tokenizer)`` pair, or an already loaded ``MlxTarget`` (returned as is)."""
        from specdec_mlx.loading import load_target

        _warn_slow_blas()
        select_device(device)
        target = load_target(source, dtype=parse_dtype(dtype), requested_dtype=dtype, slots=slots, capacity=capacity)
        self._targets.add(target)
        return target

    def dtype_candidates(self, device: str | None = None) -> tuple[str, ...]:
        """The dtypes worth measuring (``specdec.tuning``): float16 and bfloat16 on Metal; on the
        CPU only float32 (MLX's CPU half-precision kernels are several times slower)."""
        on_gpu = DEVICES.get(device, "gpu" if mx.default_device() == mx.gpu else "cpu") == "gpu"
        return ("float16", "bfloat16") if on_gpu else ("float32",)

    def describe_device(self, device: str | None = None) -> str:
        """The device, the CPU (model and flags) and the MLX version a measured speed depends on."""
        from specdec.tuning import cpu_description

        where = DEVICES.get(device, "gpu" if mx.default_device() == mx.gpu else "cpu")
        return f"mlx {mx.__version__} {where}, {cpu_description()}"

    def to_numpy(self, array: Any) -> np.ndarray:
        """Evaluate ``array`` together with the pending arrays of this backend's targets, copy to the host."""
        if not isinstance(array, mx.array):
            return np.asarray(array)
        pending = [a for target in list(self._targets) for a in target.take_pending()]
        mx.eval(array, *pending)
        if array.dtype in (mx.bfloat16, mx.float16):
            array = array.astype(mx.float32)
        return np.array(array)

    def from_numpy(self, array: Any, target: Any = None) -> mx.array:
        """A NumPy array as an MLX array on the default device (see ``to_mx`` for dtypes)."""
        return to_mx(array)
