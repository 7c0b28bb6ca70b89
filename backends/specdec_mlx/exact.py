"""Row-invariant forms of the MLX target's products and attention (its exact mode).

The MLX twin of ``specdec_torch.exact`` (whose docstring explains the contract): a one-row
product is computed as two rows (a matrix-vector kernel rounds differently from a matrix one,
on Metal ``gemv`` against ``gemm``, for quantized layers ``qmv`` against ``qmm``), and attention
takes the *split* form from MLX operations: each query's last ``TAIL`` keys gathered in position
order ahead of its other keys, read in place, in one softmax; the two products added in float32.
``specdec_mlx.invariance`` checks on first use whether this machine's kernels keep the promise.
"""

from __future__ import annotations

import attrs

import mlx.core as mx

__all__ = ["TAIL", "SplitPlan", "attend_split", "plan_split", "rows_invariant"]

TAIL = 16


def rows_invariant(fn, x: mx.array) -> mx.array:
    """``fn(x)`` for x (T, H), a single row computed as two (the row twice, the copy dropped)."""
    if x.shape[0] != 1:
        return fn(x)
    return fn(mx.concatenate([x, x], axis=0))[:1]


@attrs.frozen
class SplitPlan:
    """tail_slots (B, 1, 1, n, TAIL) int32: each query's tail keys in position order (0 where
    padding); masked (B, 1, 1, n, TAIL + S) bool: entries of the row ``[tail | slots]`` that are
    not the query's keys."""

    tail_slots: mx.array
    masked: mx.array


def plan_split(mask: mx.array, tail: int = TAIL) -> SplitPlan:
    """The split of every query's keys for mask (B, 1, n, S) bool (slot order = position order)."""
    allowed = mask[:, 0]
    batch, n, size = allowed.shape
    rank = mx.cumsum(allowed.astype(mx.int32), axis=-1) - 1
    count = rank[..., -1:] + 1
    split = mx.maximum(count - tail, 0)
    in_tail = allowed & (rank >= split)
    slots = mx.arange(size, dtype=mx.int32)
    order = mx.argsort(mx.where(in_tail, rank - split, tail + slots), axis=-1)[..., :tail].astype(mx.int32)
    if size < tail:
        order = mx.concatenate([order, mx.zeros((batch, n, tail - size), dtype=mx.int32)], axis=-1)
    padding = mx.arange(tail)[None, None, :] >= (count - split)
    masked = mx.concatenate([padding, ~(allowed & ~in_tail)], axis=-1)
    return SplitPlan(tail_slots=order[:, None, None], masked=masked[:, None, None])


def attend_split(query: mx.array, keys: mx.array, values: mx.array, plan: SplitPlan, scale: float) -> mx.array:
    """query (B, Hq, n, Dh); keys, values (B, Hkv, S, Dh) -> (B, n, Hq * Dh), each query's bits
    independent of the other queries, keys and rows (where the kernels keep their promise)."""
    batch, heads, n, dim = query.shape
    kv_heads, size = keys.shape[1], keys.shape[2]
    group, tail = heads // kv_heads, plan.tail_slots.shape[-1]
    scores = (query.reshape(batch, kv_heads, group * n, dim) @ keys.transpose(0, 1, 3, 2)).astype(mx.float32)
    scores = scores.reshape(batch, kv_heads, group, n, size)
    tail_scores = mx.take_along_axis(scores, mx.broadcast_to(plan.tail_slots, (batch, kv_heads, group, n, tail)), -1)
    row = mx.where(plan.masked, -mx.inf, mx.concatenate([tail_scores, scores], axis=-1) * scale)
    probs = mx.softmax(row, axis=-1)  # float32
    prefix = probs[..., tail:].astype(values.dtype).reshape(batch, kv_heads, group * n, size) @ values
    where = mx.broadcast_to(plan.tail_slots.reshape(batch, 1, n * tail, 1), (batch, kv_heads, n * tail, dim))
    tail_values = mx.take_along_axis(values, where, 2).reshape(batch, kv_heads, n, tail, dim).astype(mx.float32)
    out = probs[..., :tail].transpose(0, 1, 3, 2, 4) @ tail_values  # (B, Hkv, n, G, Dh)
    out = out + prefix.reshape(batch, kv_heads, group, n, dim).transpose(0, 1, 3, 2, 4).astype(mx.float32)
    return out.astype(query.dtype).transpose(0, 2, 1, 3, 4).reshape(batch, n, heads * dim)
