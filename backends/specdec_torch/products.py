"""Products with a vocabulary-sized weight (an LM head), in the formulation measured fastest here.

``x @ W.T`` for W (N, K) with N in the tens of thousands can be computed as ``F.linear(x, W)``
or as ``(W @ x.T).T``; the CPU math library picks a different kernel for each, and which is
faster depends on the CPU, the library, the dtype and the number of rows. Measured on the
project's AMD EPYC (torch 2.13 CPU, two threads), SmolLM2-135M's LM head (49152 x 576): float32
``F.linear`` 7.0 ms for one row and 13-14 ms for 2-4 rows, the transposed product (one row
padded to two) 2.5 ms for 1-4 rows; in bfloat16 the opposite, ``F.linear`` 1.8 ms against 3.5.
So nothing is assumed: the first product with a given weight shape, dtype and row count class
(one row, or 2 to ``MEASURED_ROWS`` rows: a decode step's tree) times both on the CPU
(``specdec_torch.timing``: interleaved rounds, the fastest of each, 10% margin) and keeps the
faster for the process.
``benchmarks/head_products.py`` measures what it buys end to end.

More rows than that (a batch of prompts, teacher decoding) and other devices use ``F.linear``:
both formulations are then matrix products the library handles alike, timing them would cost
seconds for a large vocabulary, and on a GPU a timing would need a sync. In exact mode
(``specdec_torch.exact``) the formulation never depends on the row count: the one measured for
several rows serves every count, a single row doubled.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from specdec_torch.timing import second_is_faster

__all__ = ["head_product", "head_product_choices", "transposed_product"]

MEASURED_ROWS = 32  # the largest row count whose formulation is measured (a draft tree's nodes)
# (weight shape, dtype, several rows) -> True when the transposed product was measured faster.
_TRANSPOSED: dict[tuple, bool] = {}


def transposed_product(rows: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """(W @ x.T).T for rows (M, K); a single row is doubled (a matrix-vector product would run
    the kernel this avoids) and the copy dropped."""
    if rows.shape[0] == 1:
        return (weight @ torch.cat([rows, rows]).T).T[:1]
    return (weight @ rows.T).T


def _linear(rows: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """``F.linear`` with a single row doubled (the matrix-vector kernel rounds differently)."""
    if rows.shape[0] == 1:
        return F.linear(torch.cat([rows, rows]), weight)[:1]
    return F.linear(rows, weight)


def head_product(x: torch.Tensor, weight: torch.Tensor, *, exact: bool = False) -> torch.Tensor:
    """``x @ weight.T``: x (..., K), weight (N, K) -> (..., N), like ``F.linear(x, weight)``,
    computed in the formulation measured fastest on this machine for this weight's shape and
    dtype and for one row or a few (measured by the first such product; see the module).

    exact: one formulation for every row count (the one measured for several rows; a single row
    doubled), so that a row's bits do not depend on how many rows share the product."""
    rows = x.reshape(-1, x.shape[-1])
    plain = _linear if exact else F.linear
    if rows.shape[0] == 0 or (weight.device.type != "cpu" and not exact):
        return F.linear(x, weight)
    if weight.device.type != "cpu" or (not exact and rows.shape[0] > MEASURED_ROWS):
        return plain(rows, weight).reshape(*x.shape[:-1], weight.shape[0])
    several = exact or rows.shape[0] > 1
    key = (tuple(weight.shape), weight.dtype, several)
    transposed = _TRANSPOSED.get(key)
    if transposed is None:  # timed on a few rows (a row repeated when exact mode meets one first)
        sample = (
            rows[:MEASURED_ROWS]
            if rows.shape[0] > 1 or not several
            else rows.expand(8, -1).contiguous()
        )
        transposed = _TRANSPOSED[key] = second_is_faster(
            lambda: plain(sample, weight), lambda: transposed_product(sample, weight)
        )
    out = transposed_product(rows, weight) if transposed else plain(rows, weight)
    return out.reshape(*x.shape[:-1], weight.shape[0])


def head_product_choices() -> dict[str, str]:
    """What was measured so far, for reports: "N x K dtype, one row|several rows" -> "F.linear" |
    "transposed"."""
    return {
        f"{key[0][0]} x {key[0][1]} {str(key[1]).removeprefix('torch.')}, "
        f"{'several rows' if key[2] else 'one row'}": "transposed" if value else "F.linear"
        for key, value in _TRANSPOSED.items()
    }
