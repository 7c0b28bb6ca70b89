"""A drafter's products with its weights in int8 where that is measured faster (``draft_weight``).

A drafter's weights need not be exact: what it proposes is verified by the target. On a CPU its
products are bound by reading the weights (SmolLM2-135M's shipped ReDrafter reads 17.4 MB per
drafted token, half of it the 8,192 shortlisted rows of the LM head), and torch's int8 weight-only
kernel (``torch._weight_int8pack_mm``: x in its dtype, int8 weights, one scale per output row) reads
half of what bfloat16 does. The weights are rounded as ``specdec.reference.quantize`` says (on the
host, in float64, by that very function), so the product is the reference's ``x @ dequantize_rows(q,
scale).T`` up to the kernel's accumulation.

Nothing is assumed about speed or support. With ``int8=None`` a bfloat16 or float16 drafter's
first product per weight shape, dtype and row class (one row / 2 to ``MEASURED_ROWS``) times
the int8 kernel against the product in the weight's own dtype (``specdec_torch.timing``),
checks the kernel's result against the dequantized product, and keeps int8 only when it is
correct and faster; float32 and float64 drafters keep their weights (the precision in which
drafts are compared with the reference). Measured on the project's AMD EPYC (torch 2.13, two
threads, caches cold as in a decode step): bfloat16 8192 x 576 with two rows 517 -> 166 us;
in float16 the int8 kernel was several times slower than the native product (so it is not
chosen), in float32 slower too. The kernel runs only where it was seen correct: on the CPU, for
float32, and for bfloat16 and float16 when K is a multiple of 64 (torch 2.13's bfloat16 kernel
returned wrong values, or crashed, for K not a multiple of 16).
"""

from __future__ import annotations

from typing import Callable

import numpy as np
import torch

from specdec.errors import InvalidInputError
from specdec.reference.quantize import check_int8_option, dequantize_rows, quantize_rows
from specdec_torch.products import head_product
from specdec_torch.timing import second_is_faster

__all__ = ["draft_weight", "int8_choices", "int8_kernel", "int8_supported"]

MEASURED_ROWS = 32
# int8=None measures only drafters in half precision: float32 and float64 keep their weights, the
# precision in which drafts are compared with the reference (and int8 was slower there in float32).
MEASURED_DTYPES = (torch.bfloat16, torch.float16)
# (weight shape, dtype, several rows) -> True when the int8 product was measured correct and faster.
_INT8: dict[tuple, bool] = {}


def int8_kernel() -> bool:
    """Whether this torch build has the int8 weight-only kernel at all."""
    return hasattr(torch.ops.aten, "_weight_int8pack_mm")


def int8_supported(weight: torch.Tensor) -> bool:
    """Whether the int8 kernel may run for ``weight`` (N, K): see the module docstring."""
    if weight.device.type != "cpu" or weight.ndim != 2 or not int8_kernel():
        return False
    if weight.dtype == torch.float32:
        return True
    return weight.dtype in (torch.bfloat16, torch.float16) and weight.shape[1] % 64 == 0


def draft_weight(
    weight: torch.Tensor, bias: torch.Tensor | None = None, *, int8: bool | None = None
) -> Callable[[torch.Tensor], torch.Tensor]:
    """``x -> x @ weight.T + bias`` for a drafter's weight (N, K): (..., K) -> (..., N).

    int8: False computes in the weight's dtype (``head_product``, exact); True with the weight
    rounded to int8 per row (``specdec.reference.quantize``), an InvalidInputError where the
    kernel cannot run (``int8_supported``); None chooses by measurement for bfloat16 and float16
    weights, per shape, dtype and one row or several, on the first product (see the module
    docstring), and keeps float32 and float64 weights as they are.
    """
    check_int8_option(int8)
    if int8 and not int8_supported(weight):
        raise InvalidInputError(
            "int8 drafter weights need torch's int8 CPU kernel, which runs here for float32 "
            "weights, or bfloat16 and float16 ones whose input size is a multiple of 64; this "
            f"weight is {tuple(weight.shape)} {str(weight.dtype).removeprefix('torch.')} on "
            f"{weight.device.type}: use int8=None (measured) or False"
        )
    if (
        int8 is False
        or not int8_supported(weight)
        or (int8 is None and weight.dtype not in MEASURED_DTYPES)
    ):
        return _Native(weight, bias)
    return _Int8(weight, bias, forced=bool(int8))


class _Native:
    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None):
        self.weight, self.bias = weight, bias

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        out = head_product(x, self.weight)
        return out if self.bias is None else out + self.bias


class _Int8(_Native):
    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, *, forced: bool):
        super().__init__(weight, bias)
        q, scale = quantize_rows(weight.detach().to(torch.float64).cpu().numpy())
        self.q = torch.from_numpy(q).to(weight.device)
        self.scale = torch.from_numpy(scale).to(device=weight.device, dtype=weight.dtype)
        self.forced = forced

    def _product(self, rows: torch.Tensor) -> torch.Tensor:
        return torch.ops.aten._weight_int8pack_mm(rows.contiguous(), self.q, self.scale)

    def _chosen(self, rows: torch.Tensor) -> bool:
        if self.forced:
            return True
        if not 0 < rows.shape[0] <= MEASURED_ROWS:
            return False
        key = (tuple(self.weight.shape), self.weight.dtype, rows.shape[0] > 1)
        chosen = _INT8.get(key)
        if chosen is None:
            chosen = _INT8[key] = self._correct(rows) and second_is_faster(
                lambda: head_product(rows, self.weight), lambda: self._product(rows)
            )
        return chosen

    def _correct(self, rows: torch.Tensor) -> bool:
        """The kernel's product against the dequantized weights' in float64, within its dtype's
        rounding."""
        # the scales it multiplies by
        weights = dequantize_rows(self.q.cpu().numpy(), self.scale.double().cpu().numpy())
        expected = rows.double().cpu().numpy() @ weights.T
        got = self._product(rows).double().cpu().numpy()
        bound = 0.05 * float(np.abs(expected).max()) + 1e-6
        return bool(np.isfinite(got).all()) and float(np.abs(got - expected).max()) <= bound

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(-1, x.shape[-1])
        if not self._chosen(rows):
            return super().__call__(x)
        out = self._product(rows).reshape(*x.shape[:-1], self.q.shape[0])
        return out if self.bias is None else out + self.bias


def int8_choices() -> dict[str, str]:
    """What was measured so far, for reports: "N x K dtype, one row|several rows" -> "int8" | "own
    dtype"."""
    return {
        f"{k[0][0]} x {k[0][1]} {str(k[1]).removeprefix('torch.')}, "
        f"{'several rows' if k[2] else 'one row'}": "int8" if v else "own dtype"
        for k, v in _INT8.items()
    }
