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

from specdec_mlx.arrays import to_mx  # noqa: F401  (where it was first defined)
from specdec_mlx.device import DEVICES, describe_device, parse_dtype, select_device
from specdec_mlx.loading import load_target


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


class MlxBackend:
    """The ``mlx`` backend: ``load_target``, ``to_numpy`` (the step's one evaluation point),
    ``from_numpy``."""

    name = "mlx"

    def __init__(self):
        self._targets: weakref.WeakSet = weakref.WeakSet()

    def load_target(
        self,
        source: Any,
        *,
        dtype: str | None = None,
        device: str | None = None,
        slots: int = 1,
        capacity: int | None = None,
    ):
        """A ``MlxTarget`` from a local Hugging Face-format folder, an mlx-lm model object, a
        ``(model, tokenizer)`` pair, or an already loaded ``MlxTarget`` (returned as is)."""
        _warn_slow_blas()
        select_device(device)
        target = load_target(
            source, dtype=parse_dtype(dtype), requested_dtype=dtype, slots=slots, capacity=capacity
        )
        self._targets.add(target)
        return target

    def dtype_candidates(self, device: str | None = None) -> tuple[str, ...]:
        """The dtypes worth measuring (``specdec.tuning.dtype``): float16 and bfloat16 on Metal; on
        the CPU only float32 (MLX's CPU half-precision kernels are several times slower)."""
        on_gpu = DEVICES.get(device, "gpu" if mx.default_device() == mx.gpu else "cpu") == "gpu"
        return ("float16", "bfloat16") if on_gpu else ("float32",)

    def describe_device(self, device: str | None = None) -> str:
        """What a measured speed depends on (``specdec_mlx.device.describe_device``)."""
        return describe_device(device)

    def to_numpy(self, array: Any) -> np.ndarray:
        """Evaluate ``array`` together with the pending arrays of this backend's targets, copy to
        the host."""
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
