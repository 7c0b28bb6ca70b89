"""The torch backend's public array operations: what a drafter written for torch may use.

A drafter package imports ``specdec_torch.ops`` and no other module of ``specdec_torch``; the
names in ``__all__`` are that surface, and ``specdec_mlx.ops`` offers the same names for MLX
arrays (docs/writing-a-drafter.md, "Backend array operations"). Every choice among equal values
goes to the lowest index (the lowest token id), as in the NumPy reference
(``specdec.reference.sampling``), without relying on ``torch.topk``'s unspecified order.

Conventions: ``...`` any leading axes, V the last axis (the one ranked or sampled); indices are
int64; probabilities are computed in ``compute_dtype`` of the input (float64 stays float64,
every other dtype becomes float32). Nothing here reads the device (no host sync).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from specdec_torch.int8 import draft_weight
from specdec_torch.products import head_product
from specdec_torch.sampling import (
    categorical,
    compute_dtype,
    first_argmax,
    log_softmax,
    sample_from,
    softmax,
    stable_descending_order,
    target_probs,
    top_indices,
    top_k_lowest_index,
    top_k_mask,
)

__all__ = [
    "as_array",
    "categorical",
    "compute_dtype",
    "draft_weight",
    "first_argmax",
    "head_product",
    "log_softmax",
    "placed",
    "sample_from",
    "softmax",
    "stable_descending_order",
    "target_probs",
    "top_indices",
    "top_k_lowest_index",
    "top_k_mask",
]


def placed(array: Any, like: torch.Tensor, *, index: bool = False) -> torch.Tensor:
    """A drafter's weight (a host array) where and as this backend keeps it: on ``like``'s device
    (the target's), in ``like``'s dtype, or as int64 with ``index`` (a shortlist, a vocabulary
    map: ids, whatever dtype the checkpoint stored them in). Every torch drafter places its
    weights through this."""
    dtype = torch.int64 if index else like.dtype
    return torch.as_tensor(np.asarray(array), dtype=dtype, device=like.device)


def as_array(
    array: Any, *, dtype: torch.dtype | None = None, device: torch.device | str | None = None
) -> torch.Tensor:
    """``array`` (a tensor, a NumPy array or anything array-like) as a torch tensor.

    Keeps the dtype (int64 token ids, float64 uniforms) unless ``dtype`` is given, and the
    tensor's device (NumPy: the cpu) unless ``device`` is given; a tensor already right is
    returned as is (no copy). Same shape as ``array``.
    """
    if not isinstance(array, torch.Tensor):
        array = torch.as_tensor(np.asarray(array))
    return array.to(device=device, dtype=dtype)
