"""Temperature, top-k, top-p and inverse-CDF sampling, and exact rankings, on torch tensors.

The torch twin of ``specdec.reference.sampling``: same order of operations, same tie rules
(equal values rank by ascending index: the lowest token id wins), same use of the uniforms, so
a float64 run gives the reference's tokens. Everything is batched over leading dimensions
(``...``); the last axis is the one ranked or sampled (V); indices are int64; nothing syncs.
Drafters reach these functions through ``specdec_torch.ops``.
"""

from __future__ import annotations

import torch

from specdec.types import SamplingConfig

__all__ = [
    "categorical",
    "compute_dtype",
    "first_argmax",
    "greedy_tokens",
    "log_softmax",
    "sample_from",
    "softmax",
    "stable_descending_order",
    "target_probs",
    "top_indices",
    "top_k_lowest_index",
    "top_k_mask",
]


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype probabilities are computed in: float64 stays, everything else is float32."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def first_argmax(x: torch.Tensor) -> torch.Tensor:
    """Index of the largest entry along the last axis, the lowest one among equal maxima.

    x (..., V) -> (...) int64 (``torch.argmax`` documents the first maximal index). Half
    precision on the CPU is compared in float32 (exact: every value converts unchanged), where
    torch has a vectorised kernel: a bfloat16 argmax over 8 rows of 49,152 logits took 1.34 ms
    against 0.25 ms for the float32 one, a tenth of a SmolLM2-135M tree step at one thread.
    """
    if x.device.type == "cpu" and x.dtype in (torch.bfloat16, torch.float16):
        x = x.float()
    return torch.argmax(x, dim=-1)


greedy_tokens = first_argmax  # the verifiers' name for it


def top_k_lowest_index(values: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The k largest entries of each row, best first, equal values in ascending index order.

    values (..., M) -> (top values (..., k) in values' dtype, indices (..., k) int64), the order
    of ``np.argsort(-values, kind="stable")[..., :k]``; 1 <= k <= M. ``torch.topk`` does not
    promise an order among equal values, so ties are resolved here: every entry strictly above
    the k-th value is taken, then the lowest-index entries equal to it, and the k picks are
    stably sorted. Costs a few passes over ``values``; no host sync.
    """
    if values.dim() != 2:
        top, picked = top_k_lowest_index(values.reshape(-1, values.shape[-1]), k)
        return top.reshape(*values.shape[:-1], k), picked.reshape(*values.shape[:-1], k)
    rows, size = values.shape
    kth = torch.topk(values, k, dim=1).values[:, -1:]  # (R, 1): the k-th largest value
    key_dtype = torch.int32 if 2 * size < 2**31 else torch.int64
    # size .. 1: lower index, larger key
    position = torch.arange(size, 0, -1, device=values.device, dtype=key_dtype)
    # Above the k-th value: keys in (size, 2 size]; equal to it: (0, size]; below: 0.
    key = torch.where(values > kth, position + size, torch.where(values == kth, position, 0))
    # (R, k) int64; distinct keys: exact, ascending index within a class
    picked = torch.topk(key, k, dim=1).indices
    picked, _ = torch.sort(picked, dim=1)  # ascending index
    picked_values = torch.gather(values, 1, picked)
    # equal values keep index order
    order = torch.sort(picked_values, dim=1, descending=True, stable=True).indices
    return torch.gather(picked_values, 1, order), torch.gather(picked, 1, order)


def top_indices(x: torch.Tensor, count: int) -> torch.Tensor:
    """The indices of the ``count`` largest entries, best first, equal values in ascending index
    order.

    x (..., V) -> (..., count) int64: ``top_k_lowest_index(x, count)[1]``.
    """
    return top_k_lowest_index(x, count)[1]


def top_k_mask(logits: torch.Tensor, k: int) -> torch.Tensor:
    """True for exactly the k best entries of each row (ties at the k-th value go to the lower ids).

    logits (..., V) -> bool (..., V): the set ``rank < k`` of a stable descending sort.
    """
    shape = logits.shape
    flat = logits.reshape(-1, shape[-1])
    _, indices = top_k_lowest_index(flat, k)
    mask = torch.zeros_like(flat, dtype=torch.bool).scatter_(1, indices, True)
    return mask.reshape(shape)


def stable_descending_order(x: torch.Tensor) -> torch.Tensor:
    """``np.argsort(-x, kind="stable")``: x (..., V) -> (..., V) int64, equal values in ascending
    index order."""
    return torch.sort(x, dim=-1, descending=True, stable=True).indices


def softmax(logits: torch.Tensor) -> torch.Tensor:
    """Softmax over the last axis in ``compute_dtype``: (..., V) -> (..., V); -inf logits get 0."""
    return torch.softmax(logits.to(compute_dtype(logits.dtype)), dim=-1)


def log_softmax(logits: torch.Tensor) -> torch.Tensor:
    """log of ``softmax`` over the last axis in ``compute_dtype``: (..., V) -> (..., V); -inf stays
    -inf."""
    return torch.log_softmax(logits.to(compute_dtype(logits.dtype)), dim=-1)


def target_probs(logits: torch.Tensor, sampling: SamplingConfig) -> torch.Tensor:
    """The distribution a row samples from. logits (..., V) -> probs (..., V) in ``compute_dtype``.

    Greedy (temperature 0): one-hot on the argmax, ties to the lowest id. Otherwise: logits /
    temperature, keep the top-k (ties at the k-th value to the lower ids), softmax, keep the
    smallest best-first prefix whose mass reaches top-p (ties to the lower id), renormalise.
    """
    dtype = compute_dtype(logits.dtype)
    logits = logits.to(dtype)
    vocab = logits.shape[-1]
    if sampling.greedy:
        return torch.nn.functional.one_hot(first_argmax(logits), vocab).to(dtype)
    z = logits / sampling.temperature
    if sampling.top_k is not None and sampling.top_k < vocab:
        z = torch.where(top_k_mask(z, sampling.top_k), z, float("-inf"))
    probs = torch.softmax(z, dim=-1)
    if sampling.top_p is not None and sampling.top_p < 1.0:
        sorted_probs, order = torch.sort(probs, dim=-1, descending=True, stable=True)
        # mass of strictly better tokens
        mass_before = torch.cumsum(sorted_probs, dim=-1) - sorted_probs
        keep_sorted = mass_before < sampling.top_p  # always keeps rank 0
        keep = torch.zeros_like(keep_sorted).scatter_(-1, order, keep_sorted)
        probs = torch.where(keep, probs, 0.0)
        probs = probs / probs.sum(dim=-1, keepdim=True)
    return probs


def sample_from(probs: torch.Tensor, uniforms: torch.Tensor) -> torch.Tensor:
    """Inverse-CDF sampling: the first token whose cumulative probability exceeds ``u``.

    probs (..., V) non-negative (need not be normalised); uniforms (...) in [0, 1), any float
    dtype (cast to probs' dtype). Returns int64 (...). A token of probability 0 is never returned.
    """
    cdf = torch.cumsum(probs, dim=-1)
    threshold = uniforms.to(probs.dtype)[..., None] * cdf[..., -1:]
    token = torch.sum(cdf <= threshold, dim=-1)
    # Guard against rounding at the top end: fall back to the last token with mass.
    vocab = probs.shape[-1]
    last_nonzero = (
        vocab - 1 - torch.argmax(torch.flip(probs > 0, dims=(-1,)).to(torch.int8), dim=-1)
    )
    return torch.minimum(token, last_nonzero)


def categorical(probs: torch.Tensor, uniforms: torch.Tensor | None) -> torch.Tensor:
    """A token per row of probs (..., V): ``sample_from(probs, uniforms)`` with uniforms (...), or
    ``first_argmax(probs)`` (ties to the lowest id) when uniforms is None (greedy). int64 (...)."""
    return first_argmax(probs) if uniforms is None else sample_from(probs, uniforms)
