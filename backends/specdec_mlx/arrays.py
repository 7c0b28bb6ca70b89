"""NumPy arrays as MLX arrays, in the dtypes the MLX backend computes with."""

from __future__ import annotations

from typing import Any

import mlx.core as mx
import numpy as np

__all__ = ["to_mx"]


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
