"""Row-invariant forms of the target's products and attention (the target's exact mode).

In exact mode a token row's logits, hidden states and written keys and values are a function of
the weights, its token, its position and the cache at the positions before it, whatever else
shares the forward: a draft tree of any shape, other requests' rows, prompt chunks of any split.
Plain decoding runs the same code with a one-node tree, so greedy speculative output is
bit-identical to plain greedy decoding at any dtype where the kernels below keep their promise
(``specdec_torch.invariance`` checks them on first use;
``docs/decisions/0010-row-invariant-forward.md``).

**Products.** A matrix product computes each output row as a dot product of length K; the CPU
math library picks its kernel (and so the order of those additions) by the shape. Measured on
the project's CPU (oneDNN, bfloat16): every product of two or more rows gives each row the same
bits, a one-row product runs a matrix-vector kernel that rounds some outputs differently. So
``linear_rows`` computes a one-row product as two rows (the row twice) and keeps the first.
Where the library also changes its order with the row count above some size (oneDNN's AMX
kernels on two threads: a call of more than 32 rows rounds rows otherwise than calls of 2 to 32),
the self-test finds the largest block of rows that keeps every product invariant and the products
then run in calls of at most that many rows (``in_row_blocks``; the target's ``row_block``).

**Attention.** Three things change a query's attention with what shares the forward: a fused
kernel's blocking follows the number of keys; a tree node's keys sit among its siblings' slots,
and a reduction over a row with masked entries interleaved rounds differently from one without;
and timing may pick another form for one query than for several. Exact mode gives each query at
position p the same floating-point operations in every forward, in one of two forms (one per
process, ``specdec_torch.kernels``):

- **kernel** (CPU): ``csrc/exact_attention.cpp`` visits the query's keys as one sequence in
  position order (a range of committed slots, then its tree path) and computes scores, softmax
  and the weighted sum of values in an order fixed by that sequence alone, one thread per query.
  ``plan_kernel`` turns a mask into each query's range and path slots.
- **split** (any device; the CPU's fallback where the kernel cannot be built), from torch
  operations. The query's keys are split at ``s = max(0, count - TAIL)`` in position order: the
  *tail*, its last ``TAIL`` keys (its own tree path among them), gathered in position order
  into a fixed-width block; the *prefix*, every earlier key, read in place from the slot layout
  (committed positions in every forward that holds position p, so at slot = position with only
  masked slots after them). One softmax over ``[tail | slots]`` (trees and one-token forwards
  then differ only by trailing masked entries, which the softmax ignores bitwise), then ``prefix
  probs @ V`` over the slot layout plus ``tail probs @ V_tail`` over the gathered values, added
  in float32 and rounded once. ``split_order`` builds the index tensors.

A plan is built once per forward from the mask; every layer reuses it.
"""

from __future__ import annotations

import math

import attrs
import torch
import torch.nn.functional as F

__all__ = [
    "TAIL",
    "KernelChoice",
    "SplitOrder",
    "attend_kernel",
    "attend_split",
    "in_row_blocks",
    "linear_rows",
    "plan_kernel",
    "split_order",
]

TAIL = 16  # keys gathered per query: a tree path of up to TAIL - 1 drafted tokens is bit-exact
_LOW_PRECISION = (torch.float16, torch.bfloat16)


def linear_rows(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    block: int | None = None,
) -> torch.Tensor:
    """``F.linear(x, weight, bias)`` with a one-row product computed as a two-row one (the row
    twice, the copy dropped): every row count then runs the same kind of kernel; in calls of at
    most ``block`` rows where given (``in_row_blocks``)."""
    return in_row_blocks(lambda rows: _linear_rows(rows, weight, bias), x, block)


def _linear_rows(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None):
    if x.numel() != x.shape[-1]:
        return F.linear(x, weight, bias)
    row = x.reshape(1, -1)
    return F.linear(torch.cat([row, row]), weight, bias)[:1].reshape(*x.shape[:-1], weight.shape[0])


def in_row_blocks(product, x: torch.Tensor, block: int | None) -> torch.Tensor:
    """``product(x)`` for a row-wise ``product`` (rows (M, K) -> (M, N)) over x (..., K), in calls
    of at most ``block`` rows (None: one call), so that a row's bits do not depend on how many
    rows share it where the library's order changes above that many."""
    rows = x.reshape(-1, x.shape[-1])
    if block is None or rows.shape[0] <= block:
        return product(x)
    out = torch.cat([product(rows[start : start + block]) for start in range(0, len(rows), block)])
    return out.reshape(*x.shape[:-1], out.shape[-1])


@attrs.frozen
class SplitOrder:
    """Index tensors of one mask (B, 1, n, S), shared by every layer of a forward.

    tail_slots (B, 1, 1, n, TAIL): the slot of each query's tail keys in position order (0 where
    padding); masked (B, 1, 1, n, TAIL + S): the entries of the softmax row ``[tail | slots]``
    that are not among the query's keys (tail padding, and every slot outside its prefix)."""

    tail_slots: torch.Tensor
    masked: torch.Tensor

    @property
    def width(self) -> int:
        return int(self.tail_slots.shape[-1])


def split_order(mask: torch.Tensor, tail: int = TAIL) -> SplitOrder:
    """The canonical split of every query's keys (module docstring). mask (B, 1, n, S) bool, True
    where a query may attend; a query's allowed slots, in slot order, are its keys in position
    order (committed positions first, then its tree path: parents are stored before children)."""
    allowed = mask[:, 0]  # (B, n, S)
    batch, n, size = allowed.shape
    rank = allowed.cumsum(-1) - 1  # (B, n, S): rank of each allowed slot among the query's keys
    count = rank[..., -1:] + 1  # (B, n, 1) keys of each query
    split = (count - tail).clamp(min=0)
    in_tail = allowed & (rank >= split)
    column = torch.where(in_tail, rank - split, tail)  # tail columns; others land in a spare column
    slots = torch.arange(size, device=mask.device).expand(batch, n, size)
    tail_slots = torch.zeros((batch, n, tail + 1), dtype=torch.int64, device=mask.device)
    tail_slots = tail_slots.scatter_(-1, column, slots)[..., :tail]
    padding = torch.arange(tail, device=mask.device) >= (count - split)  # (B, n, tail)
    masked = torch.cat([padding, ~(allowed & ~in_tail)], dim=-1)  # (B, n, tail + S)
    return SplitOrder(
        tail_slots=tail_slots[:, None, None].contiguous(), masked=masked[:, None, None]
    )


def attend_split(
    query: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, plan: SplitOrder
) -> torch.Tensor:
    """Grouped-query attention in the split form. query (B, Hq, n, Dh); keys, values (B, Hkv,
    S, Dh); ``plan`` of the mask (B, 1, n, S). -> (B, n, Hq * Dh), like
    ``specdec_torch.layers.attend``, with each query's bits independent of the other queries, keys
    and rows.

    The tail's product runs in float32 (its operands have the same shape in every forward, and a
    tiny float32 product is cheaper than a half-precision one here); the prefix's in the values'
    dtype; the two are added in float32 and rounded once."""
    batch, heads, n, dim = query.shape
    kv_heads, size = keys.shape[1], keys.shape[2]
    group, tail = heads // kv_heads, plan.width
    scores = torch.matmul(query.reshape(batch, kv_heads, group * n, dim), keys.transpose(-1, -2))
    scores = scores.float().view(batch, kv_heads, group, n, size)
    tail_scores = scores.gather(-1, plan.tail_slots.expand(batch, kv_heads, group, n, tail))
    row = torch.cat([tail_scores, scores], dim=-1).masked_fill_(plan.masked, float("-inf"))
    # (B, Hkv, G, n, tail + S) float32
    probs = torch.softmax(row.mul_(1.0 / math.sqrt(dim)), dim=-1)
    prefix = torch.matmul(
        probs[..., tail:].to(values.dtype).view(batch, kv_heads, group * n, size), values
    )
    where = plan.tail_slots.view(batch, 1, n * tail, 1).expand(batch, kv_heads, n * tail, dim)
    tail_values = values.gather(2, where).view(batch, kv_heads, n, tail, dim).float()
    out = torch.matmul(probs[..., :tail].transpose(2, 3), tail_values)  # (B, Hkv, n, G, Dh) float32
    out = out.add_(prefix.view(batch, kv_heads, group, n, dim).transpose(2, 3))
    merged = torch.empty((batch, n, kv_heads, group, dim), dtype=query.dtype, device=query.device)
    return merged.copy_(out.permute(0, 2, 1, 3, 4)).view(batch, n, heads * dim)


@attrs.frozen
class KernelChoice:
    """Each query's keys for the kernel: slots ``lo .. hi - 1`` of its row's cache slot, then
    ``extra[..., :extra_count]`` (its tree path), in position order. rows (B,) the rows' cache
    slots; lo, hi, extra_count (B, n); extra (B, n, E); all int64."""

    rows: torch.Tensor
    lo: torch.Tensor
    hi: torch.Tensor
    extra: torch.Tensor
    extra_count: torch.Tensor


def plan_kernel(mask: torch.Tensor, rows: torch.Tensor) -> KernelChoice:
    """A query's allowed slots of mask (B, 1, n, S), in slot order (its keys in position order):
    the leading run of consecutive slots, then the rest; ``rows`` (B,) the rows' cache slots."""
    allowed = mask[:, 0]
    batch, n, size = allowed.shape
    index = torch.arange(size, device=mask.device)
    lo = allowed.to(torch.uint8).argmax(-1)  # the first allowed slot
    in_run = allowed & (allowed.cumsum(-1) == index - lo[..., None] + 1)
    rest = allowed & ~in_run
    extra_count = rest.sum(-1)
    most = max(int(extra_count.max()) if extra_count.numel() else 0, 1)
    column = torch.where(rest, rest.cumsum(-1) - 1, most)
    extra = torch.zeros((batch, n, most + 1), dtype=torch.int64, device=mask.device)
    extra = extra.scatter_(-1, column, index.expand(batch, n, size))[..., :most].contiguous()
    return KernelChoice(
        rows=rows.to(torch.int64).contiguous(),
        lo=lo,
        hi=lo + in_run.sum(-1),
        extra=extra,
        extra_count=extra_count,
    )


def attend_kernel(
    kernel, query: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, plan: KernelChoice
) -> torch.Tensor:
    """Grouped-query attention by the compiled kernel (``specdec_torch.kernels``). query (B, Hq,
    n, Dh); keys, values (slots, Hkv, capacity, Dh): a layer of the cache. -> (B, n, Hq * Dh)."""
    return kernel.exact_attention(
        query,
        keys,
        values,
        plan.rows,
        plan.lo,
        plan.hi,
        plan.extra,
        plan.extra_count,
        1.0 / math.sqrt(query.shape[-1]),
    )
