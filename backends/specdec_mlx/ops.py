"""The mlx backend's public array operations: what a drafter written for MLX may use.

A drafter package imports ``specdec_mlx.ops`` and no other module of ``specdec_mlx``; the names
in ``__all__`` are that surface, and ``specdec_torch.ops`` offers the same names for torch
tensors (docs/writing-a-drafter.md, "Backend array operations"). The backend's own tree
builders and verifiers use them too.

Every choice among equal values goes to the lowest index (the lowest token id), as in the NumPy
reference, without relying on the stability of ``mx.argsort`` (MLX does not promise it): ties
are broken explicitly with an index minimum or a composite integer key. Probabilities are
float32 and indices int32. Shapes: ``...`` any leading axes, V the last axis (the one ranked
or sampled). Everything is lazy: nothing here evaluates.
"""

from __future__ import annotations

from typing import Any

import mlx.core as mx
import numpy as np

from specdec.errors import InvalidInputError
from specdec.reference.quantize import check_int8_option
from specdec.types import SamplingConfig
from specdec_mlx.arrays import to_mx
from specdec_mlx.tree import MlxDraftTree

__all__ = [
    "MlxDraftTree",
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

_NEG_INF = float("-inf")


def placed(array: Any, like: mx.array, *, index: bool = False) -> mx.array:
    """A drafter's weight (a host array) as this backend keeps it: in ``like``'s dtype (the
    target's; read through float32, MLX's widest), or as int32 with ``index`` (a shortlist, a
    vocabulary map: ids, whatever dtype the checkpoint stored them in). Every MLX drafter places
    its weights through this."""
    if index:
        return mx.array(np.asarray(array).astype(np.int32))
    return mx.array(np.asarray(array, dtype=np.float32)).astype(like.dtype)


def as_array(array: Any, *, dtype=None) -> mx.array:
    """``array`` (an MLX array, a NumPy array or anything array-like) as an MLX array on the
    default device, same shape. Without ``dtype``: MLX arrays pass through unchanged, int64
    becomes int32 (token ids, node indices) and float64 float32 (uniforms, probabilities)."""
    array = to_mx(array)
    return array if dtype is None or array.dtype == dtype else array.astype(dtype)


def compute_dtype(dtype) -> mx.Dtype:
    """The dtype probabilities are computed in: float32 for every input dtype
    (MLX has no float64 on the GPU)."""
    return mx.float32


def first_argmax(x: mx.array) -> mx.array:
    """Index of the largest entry along the last axis, the lowest one among equal maxima.

    x (..., V) -> (...) int32.
    """
    size = x.shape[-1]
    top = mx.max(x, axis=-1, keepdims=True)
    return mx.min(mx.where(x == top, mx.arange(size), size), axis=-1).astype(mx.int32)


def head_product(x: mx.array, weight: mx.array) -> mx.array:
    """``x @ weight.T``: x (..., K), weight (N, K) -> (..., N) (an LM head's logits). The torch
    backend's twin picks its formulation by measurement; MLX's matmul needs no choice."""
    return x @ weight.T


def draft_weight(weight: mx.array, bias: mx.array | None = None, *, int8: bool | None = None):
    """``x -> x @ weight.T + bias`` for a drafter's weight (N, K): (..., K) -> (..., N). The torch
    twin may hold the weight in int8 (``int8=None`` measures, True asks for it); MLX computes in
    the weight's dtype, so ``int8=True`` is refused here with InvalidInputError."""
    check_int8_option(int8)
    if int8:
        raise InvalidInputError(
            "int8 drafter weights are a torch CPU kernel; the mlx backend computes in the "
            "weights' dtype: use int8=None or False"
        )
    return (lambda x: x @ weight.T) if bias is None else (lambda x: x @ weight.T + bias)


def top_indices(x: mx.array, count: int) -> mx.array:
    """The ``count`` largest entries' indices, best first, equal values in ascending index order.

    x (..., V) -> (..., count) int32. One masked maximum per pick (count passes over V),
    the same order as ``np.argsort(-x, kind="stable")[..., :count]``.
    """
    size = x.shape[-1]
    ids = mx.arange(size)
    taken = mx.zeros(x.shape, dtype=mx.bool_)
    picks = []
    for _ in range(count):
        best = mx.max(mx.where(taken, _NEG_INF, x), axis=-1, keepdims=True)
        candidate = (x == best) & ~taken
        pick = mx.min(mx.where(candidate, ids, size), axis=-1, keepdims=True)  # (..., 1)
        picks.append(pick)
        taken = taken | (ids == pick)
    return mx.concatenate(picks, axis=-1).astype(mx.int32)


def top_k_lowest_index(values: mx.array, k: int) -> tuple[mx.array, mx.array]:
    """The k largest entries, best first, equal values in ascending index order.

    values (..., M) -> (top values (..., k) in values' dtype, indices (..., k) int32), the order
    of ``np.argsort(-values, kind="stable")[..., :k]``; 1 <= k <= M. ``top_indices`` plus a gather.
    """
    indices = top_indices(values, k)
    return mx.take_along_axis(values, indices, axis=-1), indices


def top_k_mask(x: mx.array, k: int) -> mx.array:
    """True for exactly the ``k`` best entries (ties at the k-th value go to the lower indices).

    x (..., V) -> (..., V) bool, the set ``rank < k`` of a stable descending sort.
    """
    kth = mx.min(mx.topk(x, k, axis=-1), axis=-1, keepdims=True)  # the k-th largest value
    above = x > kth
    tied = x == kth
    room = k - mx.sum(above, axis=-1, keepdims=True)
    return above | (tied & (mx.cumsum(tied.astype(mx.int32), axis=-1) <= room))


def stable_descending_order(x: mx.array) -> mx.array:
    """``np.argsort(-x, kind="stable")`` for float x (..., V) -> (..., V) int32.

    The float32 bits are mapped to integers of the same order (negative floats flipped), then
    combined with the index into one distinct int64 key, so any correct sort gives this order.
    """
    size = x.shape[-1]
    bits = mx.view(x.astype(mx.float32) + 0.0, mx.int32)  # + 0.0 turns -0.0 into +0.0
    ordered = mx.where(bits < 0, bits ^ 0x7FFFFFFF, bits).astype(mx.int64)  # monotone in x
    key = -ordered * size + mx.arange(size).astype(mx.int64)
    return mx.argsort(key, axis=-1).astype(mx.int32)


def softmax(logits: mx.array) -> mx.array:
    """Softmax over the last axis in float32: (..., V) -> (..., V); -inf logits get 0."""
    return mx.softmax(logits.astype(mx.float32), axis=-1, precise=True)


def log_softmax(logits: mx.array) -> mx.array:
    """log of ``softmax`` over the last axis in float32: (..., V) -> (..., V); -inf stays -inf."""
    z = logits.astype(mx.float32)
    return z - mx.logsumexp(z, axis=-1, keepdims=True)


def _one_hot(tokens: mx.array, size: int) -> mx.array:
    """tokens (...) int -> (..., size) float32 with a 1 at each token."""
    return (tokens[..., None] == mx.arange(size)).astype(mx.float32)


def target_probs(logits: mx.array, sampling: SamplingConfig) -> mx.array:
    """``specdec.reference.sampling.target_probs`` in MLX: logits (..., V) -> probs (..., V)
    float32.

    Temperature, then the top-k logits, softmax, then the smallest prefix (stable descending
    order of the tempered logits) whose mass reaches top-p. Temperature 0 is one-hot on the
    argmax, ties to the lowest id.
    """
    logits = logits.astype(mx.float32)
    vocab = logits.shape[-1]
    if sampling.greedy:
        return _one_hot(first_argmax(logits), vocab)
    z = logits / sampling.temperature
    if sampling.top_k is not None and sampling.top_k < vocab:
        z_kept = mx.where(top_k_mask(z, sampling.top_k), z, _NEG_INF)
    else:
        z_kept = z
    probs = softmax(z_kept)
    if sampling.top_p is not None and sampling.top_p < 1.0:
        order = stable_descending_order(z)  # (..., V) best first
        sorted_probs = mx.take_along_axis(probs, order, axis=-1)
        # mass of strictly better tokens
        mass_before = mx.cumsum(sorted_probs, axis=-1) - sorted_probs
        keep_sorted = mass_before < sampling.top_p  # always keeps rank 0
        keep = mx.put_along_axis(mx.zeros(probs.shape, dtype=mx.bool_), order, keep_sorted, axis=-1)
        probs = mx.where(keep, probs, 0.0)
        probs = probs / mx.sum(probs, axis=-1, keepdims=True)
    return probs


def sample_from(probs: mx.array, uniforms: mx.array) -> mx.array:
    """Inverse-CDF sampling as ``specdec.reference.sampling.sample_from``.

    probs (..., V) non-negative (need not be normalised); uniforms (...) in [0, 1).
    Returns int32 (...): the number of cdf entries <= u * total, never a token of mass 0.
    """
    probs = probs.astype(mx.float32)
    cdf = mx.cumsum(probs, axis=-1)
    threshold = uniforms.astype(mx.float32)[..., None] * cdf[..., -1:]
    token = mx.sum(cdf <= threshold, axis=-1)
    last_nonzero = mx.max(mx.where(probs > 0, mx.arange(probs.shape[-1]), 0), axis=-1)
    return mx.minimum(token, last_nonzero).astype(mx.int32)


def categorical(probs: mx.array, uniforms: mx.array | None) -> mx.array:
    """A token per row of probs (..., V): ``sample_from`` with uniforms (...), or the argmax
    (lowest id on ties) when uniforms is None (greedy decoding)."""
    return first_argmax(probs) if uniforms is None else sample_from(probs, uniforms)
