"""Row-invariant forms of the MLX target's products and attention (its exact mode).

The MLX twin of ``specdec_torch.exact`` (whose docstring explains the contract): a product of
few rows is computed over more, copies of its last row that are then dropped, so that every call
takes the kernel a large one takes. A one-row product is computed as two at least (a
matrix-vector kernel rounds differently from a matrix one: on Metal ``gemv`` against ``gemm``,
for quantized layers ``qmv`` against ``qmm``); on a Linux CPU, where MLX runs on OpenBLAS
(``specdec_mlx.blas``), a float32 product of M rows of K against N outputs goes to a small-matrix
kernel, which sums in another order, while M * N * K is at most 100**3, so such a product gets
rows enough to pass that bound (``min_rows``; measured: a SmolLM2-135M k projection, N = 192,
K = 576, gave other bits for 1 to 6 rows than among 160, and the same bits from 7 rows on).
Attention takes the *split* form from MLX operations: each query's last ``TAIL`` keys gathered in
position order ahead of its other keys, read in place, in one softmax; the two products added in
float32. ``specdec_mlx.invariance`` checks on first use whether this machine's kernels keep the
promise.
"""

from __future__ import annotations

import attrs

import mlx.core as mx

__all__ = [
    "SMALL_PRODUCT",
    "TAIL",
    "SplitOrder",
    "attend_split",
    "min_rows",
    "split_order",
    "rows_invariant",
]

TAIL = 16
SMALL_PRODUCT = 100**3  # OpenBLAS's bound on M * N * K for its small-matrix kernels


def min_rows(weights) -> int:
    """The fewest rows a product over ``weights`` (2-D arrays, (N, K) each, e.g. a block's
    projections) is computed with: 2, or more where M * N * K <= ``SMALL_PRODUCT``."""
    sizes = [int(w.shape[0]) * int(w.shape[1]) for w in weights if getattr(w, "ndim", 0) == 2]
    return max([2] + [SMALL_PRODUCT // size + 1 for size in sizes if size > 0])


def rows_invariant(fn, x: mx.array, rows: int = 2) -> mx.array:
    """``fn(x)`` for x (T, H), computed over ``rows`` rows at least (x's last row repeated, the
    copies dropped)."""
    count = x.shape[0]
    if count >= rows or count == 0:
        return fn(x)
    padded = mx.concatenate([x, mx.broadcast_to(x[-1:], (rows - count, x.shape[1]))], axis=0)
    return fn(padded)[:count]


@attrs.frozen
class SplitOrder:
    """tail_slots (B, 1, 1, n, TAIL) int32: each query's tail keys in position order (0 where
    padding); masked (B, 1, 1, n, TAIL + S) bool: entries of the row ``[tail | slots]`` that are
    not the query's keys."""

    tail_slots: mx.array
    masked: mx.array


def split_order(mask: mx.array, tail: int = TAIL) -> SplitOrder:
    """The split of every query's keys for mask (B, 1, n, S) bool (slot order = position order)."""
    allowed = mask[:, 0]
    batch, n, size = allowed.shape
    rank = mx.cumsum(allowed.astype(mx.int32), axis=-1) - 1
    count = rank[..., -1:] + 1
    split = mx.maximum(count - tail, 0)
    in_tail = allowed & (rank >= split)
    slots = mx.arange(size, dtype=mx.int32)
    order = mx.argsort(mx.where(in_tail, rank - split, tail + slots), axis=-1)[..., :tail].astype(
        mx.int32
    )
    if size < tail:
        order = mx.concatenate([order, mx.zeros((batch, n, tail - size), dtype=mx.int32)], axis=-1)
    padding = mx.arange(tail)[None, None, :] >= (count - split)
    masked = mx.concatenate([padding, ~(allowed & ~in_tail)], axis=-1)
    return SplitOrder(tail_slots=order[:, None, None], masked=masked[:, None, None])


def attend_split(
    query: mx.array, keys: mx.array, values: mx.array, plan: SplitOrder, scale: float
) -> mx.array:
    """query (B, Hq, n, Dh); keys, values (B, Hkv, S, Dh) -> (B, n, Hq * Dh), each query's bits
    independent of the other queries, keys and rows (where the kernels keep their promise)."""
    batch, heads, n, dim = query.shape
    kv_heads, size = keys.shape[1], keys.shape[2]
    group, tail = heads // kv_heads, plan.tail_slots.shape[-1]
    scores = (query.reshape(batch, kv_heads, group * n, dim) @ keys.transpose(0, 1, 3, 2)).astype(
        mx.float32
    )
    scores = scores.reshape(batch, kv_heads, group, n, size)
    tail_scores = mx.take_along_axis(
        scores, mx.broadcast_to(plan.tail_slots, (batch, kv_heads, group, n, tail)), -1
    )
    row = mx.where(plan.masked, -mx.inf, mx.concatenate([tail_scores, scores], axis=-1) * scale)
    probs = mx.softmax(row, axis=-1)  # float32
    prefix = (
        probs[..., tail:].astype(values.dtype).reshape(batch, kv_heads, group * n, size) @ values
    )
    where = mx.broadcast_to(
        plan.tail_slots.reshape(batch, 1, n * tail, 1), (batch, kv_heads, n * tail, dim)
    )
    tail_values = (
        mx.take_along_axis(values, where, 2)
        .reshape(batch, kv_heads, n, tail, dim)
        .astype(mx.float32)
    )
    out = probs[..., :tail].transpose(0, 1, 3, 2, 4) @ tail_values  # (B, Hkv, n, G, Dh)
    out = out + prefix.reshape(batch, kv_heads, group, n, dim).transpose(0, 1, 3, 2, 4).astype(
        mx.float32
    )
    return out.astype(query.dtype).transpose(0, 2, 1, 3, 4).reshape(batch, n, heads * dim)
