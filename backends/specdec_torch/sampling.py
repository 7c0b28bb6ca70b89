"""Temperature, top-k, top-p and inverse-CDF sampling on torch tensors.

The torch twin of ``specdec.reference.sampling``: same order of operations, same tie rules
(equal logits rank by ascending token id), same use of the uniforms, so a float64 run gives
the reference's tokens. Everything is batched over leading dimensions; nothing syncs.
"""

from __future__ import annotations

import torch

from specdec.types import SamplingConfig

__all__ = ["compute_dtype", "greedy_tokens", "sample_from", "target_probs", "top_k_mask", "top_k_lowest_index"]


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype probabilities are computed in: float64 stays, everything else is float32."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def greedy_tokens(logits: torch.Tensor) -> torch.Tensor:
    """Argmax over the last axis; ``torch.argmax`` returns the first (lowest-id) maximum. (...) int64."""
    return torch.argmax(logits, dim=-1)


def top_k_lowest_index(values: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The k largest entries of each row, best first, equal values in ascending index order.

    values (R, M) -> (top values (R, k), indices (R, k) int64). ``torch.topk`` does not promise
    an order among equal values, so ties are resolved here: every entry strictly above the k-th
    value is taken, then the lowest-index entries equal to it, and the k picks are stably sorted.
    Costs a few passes over ``values``; no host sync.
    """
    rows, size = values.shape
    kth = torch.topk(values, k, dim=1).values[:, -1:]  # (R, 1): the k-th largest value
    key_dtype = torch.int32 if 2 * size < 2**31 else torch.int64
    position = torch.arange(size, 0, -1, device=values.device, dtype=key_dtype)  # size .. 1: lower index, larger key
    # Above the k-th value: keys in (size, 2 size]; equal to it: (0, size]; below: 0.
    key = torch.where(values > kth, position + size, torch.where(values == kth, position, 0))
    picked = torch.topk(key, k, dim=1).indices  # (R, k) int64; distinct keys: exact, ascending index within a class
    picked, _ = torch.sort(picked, dim=1)  # ascending index
    picked_values = torch.gather(values, 1, picked)
    order = torch.sort(picked_values, dim=1, descending=True, stable=True).indices  # equal values keep index order
    return torch.gather(picked_values, 1, order), torch.gather(picked, 1, order)


def top_k_mask(logits: torch.Tensor, k: int) -> torch.Tensor:
    """True for the k best logits of each row (ties to the lower id). logits (..., V) -> bool (..., V)."""
    shape = logits.shape
    flat = logits.reshape(-1, shape[-1])
    _, indices = top_k_lowest_index(flat, k)
    mask = torch.zeros_like(flat, dtype=torch.bool).scatter_(1, indices, True)
    return mask.reshape(shape)


def target_probs(logits: torch.Tensor, sampling: SamplingConfig) -> torch.Tensor:
    """The distribution a row samples from. logits (..., V) -> probs (..., V) in ``compute_dtype``.

    Greedy: one-hot on the argmax. Otherwise: logits / temperature, keep the top-k, softmax,
    keep the smallest best-first prefix whose mass reaches top-p (ties to the lower id), renormalise.
    """
    dtype = compute_dtype(logits.dtype)
    logits = logits.to(dtype)
    vocab = logits.shape[-1]
    if sampling.greedy:
        return torch.nn.functional.one_hot(greedy_tokens(logits), vocab).to(dtype)
    z = logits / sampling.temperature
    if sampling.top_k is not None and sampling.top_k < vocab:
        z = torch.where(top_k_mask(z, sampling.top_k), z, float("-inf"))
    probs = torch.softmax(z, dim=-1)
    if sampling.top_p is not None and sampling.top_p < 1.0:
        sorted_probs, order = torch.sort(probs, dim=-1, descending=True, stable=True)
        mass_before = torch.cumsum(sorted_probs, dim=-1) - sorted_probs  # mass of strictly better tokens
        keep_sorted = mass_before < sampling.top_p  # always keeps rank 0
        keep = torch.zeros_like(keep_sorted).scatter_(-1, order, keep_sorted)
        probs = torch.where(keep, probs, 0.0)
        probs = probs / probs.sum(dim=-1, keepdim=True)
    return probs


def sample_from(probs: torch.Tensor, uniforms: torch.Tensor) -> torch.Tensor:
    """Inverse-CDF sampling: the first token whose cumulative probability exceeds ``u``.

    probs (..., V) non-negative (need not be normalised); uniforms (...) in [0, 1).
    Returns int64 (...). A token of probability 0 is never returned.
    """
    cdf = torch.cumsum(probs, dim=-1)
    threshold = uniforms.to(probs.dtype)[..., None] * cdf[..., -1:]
    token = torch.sum(cdf <= threshold, dim=-1)
    # Guard against rounding at the top end: fall back to the last token with mass.
    vocab = probs.shape[-1]
    last_nonzero = vocab - 1 - torch.argmax(torch.flip(probs > 0, dims=(-1,)).to(torch.int8), dim=-1)
    return torch.minimum(token, last_nonzero)
