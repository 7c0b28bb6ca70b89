"""Weight-only int8 quantization of a drafter's products, float64 reference.

A drafter's output is a proposal that verification checks, so its weights may be held in less
precision than the target's: reading them is most of a drafting step on a CPU (a small model's
products are bound by memory bandwidth), and int8 halves what bfloat16 reads. Each row r of a
weight W (N, K), the weights of output r, gets its own scale, and the product uses the rounded
weights exactly:

    scale[r] = max_k |W[r, k]| / 127      (1 for a row of zeros)
    q[r, k]  = round(W[r, k] / scale[r])   an int8 in [-127, 127], ties to even
    x @ W.T  ~ (x @ q.T) * scale           = x @ dequantize_rows(q, scale).T

A backend's ``draft_weight`` operation (docs/writing-a-drafter.md, "Backend array operations")
may multiply int8 weights rounded this way; this module is what it is checked against.
"""

from __future__ import annotations

import numpy as np

from specdec.errors import InvalidInputError

__all__ = ["LEVELS", "check_int8_option", "dequantize_rows", "quantize_rows", "quantized_weights"]

LEVELS = 127  # symmetric: -127 .. 127 (-128 unused, so negating a row keeps it representable)


def check_int8_option(int8) -> None:
    """Raise InvalidInputError unless ``int8`` is True, False or None (a drafter's int8 option)."""
    if int8 not in (None, True, False):
        raise InvalidInputError(f"int8 must be True, False or None (measured), got {int8!r}")


def quantize_rows(weight: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """weight (N, K) -> q (N, K) int8 and scale (N,) float64, as in the module docstring."""
    w = np.asarray(weight, dtype=np.float64)
    if w.ndim != 2:
        raise ValueError(f"quantize_rows takes a (N, K) weight, got shape {w.shape}")
    peak = np.abs(w).max(axis=1)
    scale = np.where(peak > 0, peak / LEVELS, 1.0)
    q = np.clip(np.rint(w / scale[:, None]), -LEVELS, LEVELS).astype(np.int8)
    return q, scale


def dequantize_rows(q: np.ndarray, scale: np.ndarray) -> np.ndarray:
    """The weights an int8 product computes with: q (N, K) * scale (N,) -> (N, K) float64."""
    return np.asarray(q, dtype=np.float64) * np.asarray(scale, dtype=np.float64)[:, None]


def quantized_weights(weights: dict, names) -> dict:
    """``weights`` with each of ``names`` (present ones) replaced by its int8 rounding,
    dequantized."""
    out = dict(weights)
    for name in names:
        if name in out:
            out[name] = dequantize_rows(*quantize_rows(out[name]))
    return out
