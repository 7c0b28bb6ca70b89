"""The pieces of a Llama-family decoder layer as plain functions of tensors (torch twin of
``specdec.reference.model``): RMSNorm, rotary embeddings at explicit positions, attention over a
KV cache with a boolean mask (the fastest of three exact forms; ``specdec_torch.exact`` has the
row-invariant one).

Shapes: B batch, n new tokens, S key slots, Hq query heads, Hkv key/value heads, Dh head size,
H hidden size.
"""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F

from specdec_torch.timing import fastest

__all__ = [
    "apply_rotary",
    "attend",
    "attention_choices",
    "rms_norm",
    "rotary_cos_sin",
    "rotary_dtype",
]

_LOW_PRECISION = (torch.float16, torch.bfloat16)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """x (..., H) scaled to unit root-mean-square, then by ``weight`` (H,).

    Half-precision inputs are normalised in float32 and cast back before the weight is applied
    (as ``transformers`` does); float32 and float64 stay in their own precision.
    """
    compute = x.float() if x.dtype in _LOW_PRECISION else x
    normed = compute * torch.rsqrt(compute.pow(2).mean(-1, keepdim=True) + eps)
    return weight * normed.to(x.dtype)


def rotary_dtype(device: torch.device) -> torch.dtype:
    """Rotary angles are computed in float64 where the device has it (not on MPS)."""
    return torch.float32 if device.type == "mps" else torch.float64


def rotary_cos_sin(
    positions: torch.Tensor, inv_freq: torch.Tensor, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """positions (B, n) int64 -> cos, sin (B, 1, n, Dh) in ``dtype``.

    ``inv_freq`` (Dh/2,) holds the rotation speeds (float64 where available); each angle is
    repeated for both halves of a head ("rotate_half" convention).
    """
    angles = positions.to(inv_freq.dtype)[..., None] * inv_freq  # (B, n, Dh/2)
    angles = torch.cat([angles, angles], dim=-1)[:, None]  # (B, 1, n, Dh)
    return angles.cos().to(dtype), angles.sin().to(dtype)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate pairs (x[i], x[i + Dh/2]) by the position's angle. x (B, heads, n, Dh)."""
    half = x.shape[-1] // 2
    rotated_half = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos + rotated_half * sin


def inverse_frequencies(config, device: torch.device) -> torch.Tensor:
    """(Dh/2,) rotation speeds with the model's rope scaling, computed by the reference in
    float64."""
    from specdec.reference.model import rotary_inverse_frequencies

    return torch.from_numpy(np.asarray(rotary_inverse_frequencies(config))).to(
        device=device, dtype=rotary_dtype(device)
    )


MEASURED_QUERIES = 32  # attention of up to this many new tokens (one, or a draft tree) is measured
# (dtype, query heads, key/value heads, head size, several queries, rows class) -> the form measured
# fastest; the rows class is the batch's bit length: 1 row, 2-3, 4-7, ..., 64-127, ...
_CHOSEN: dict[tuple, str] = {}


def _grouped(query, keys, values, mask, scale):
    return F.scaled_dot_product_attention(
        query, keys, values, attn_mask=mask, scale=scale, enable_gqa=query.shape[1] != keys.shape[1]
    )


def _folded(query, keys, values, mask, scale):
    """The same attention with the query heads that share a key/value head stacked as rows of
    one head (B, Hkv, g * n, Dh): one matrix product per key/value head instead of g."""
    batch, heads, n, dim = query.shape
    kv_heads, span = keys.shape[1], keys.shape[2]
    group = heads // kv_heads  # query head h reads key/value head h // group
    rows_mask = mask[:, :, None].expand(batch, 1, group, n, span).reshape(batch, 1, group * n, span)
    out = F.scaled_dot_product_attention(
        query.reshape(batch, kv_heads, group * n, dim),
        keys,
        values,
        attn_mask=rows_mask,
        scale=scale,
    )
    return out.reshape(batch, heads, n, dim)


def _matmul(query, keys, values, mask, scale):
    """The folded attention written as two batched matrix products around a softmax (float32
    for half-precision inputs): no fused kernel, which for many rows of a few queries each (a
    batch of requests decoding) was faster than ``scaled_dot_product_attention`` on the CPU."""
    batch, heads, n, dim = query.shape
    kv_heads, span = keys.shape[1], keys.shape[2]
    group = heads // kv_heads
    scores = torch.matmul(query.reshape(batch, kv_heads, group * n, dim), keys.transpose(-1, -2))
    scores = scores.to(torch.float32) if scores.dtype in _LOW_PRECISION else scores
    scores = (
        (scores * scale)
        .view(batch, kv_heads, group, n, span)
        .masked_fill(~mask[:, :, None], float("-inf"))
    )
    probs = torch.softmax(scores, dim=-1).to(query.dtype).view(batch, kv_heads, group * n, span)
    return torch.matmul(probs, values).view(batch, heads, n, dim)


_FORMS = {"grouped": _grouped, "folded": _folded, "matmul": _matmul}


def attend(
    query: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, mask: torch.Tensor
) -> torch.Tensor:
    """Grouped-query attention. query (B, Hq, n, Dh); keys, values (B, Hkv, S, Dh); mask
    (B, 1, n, S) bool (True = may attend; every query row has at least one True). Returns
    (B, n, Hq * Dh).

    On the CPU, with at most ``MEASURED_QUERIES`` new tokens, the first call per dtype, head
    layout, query class (one token / several) and rows class (1, 2-3, 4-7, ... rows) times three
    exact forms and keeps the fastest for the process (``specdec_torch.timing.fastest``):
    ``scaled_dot_product_attention`` with ``enable_gqa`` (the default), the query heads of each
    key/value head folded into rows of one head (``_folded``, when there are fewer key/value
    heads than query heads), and the folded form as two matrix products (``_matmul``). On the
    project's CPU (SmolLM2-135M: 9 query, 3 key/value heads) one bfloat16 query over 400 keys
    took 198 us grouped and 44 us folded; 64 rows of one bfloat16 query over 200 keys 4,603 us
    grouped, 753 folded and 336 as matrix products; float32 stayed grouped for one row.
    """
    batch, heads, n, dim = query.shape
    scale = 1.0 / math.sqrt(dim)
    form = "grouped"
    if query.device.type == "cpu" and n <= MEASURED_QUERIES:
        key = (query.dtype, heads, keys.shape[1], dim, n > 1, batch.bit_length())
        form = _CHOSEN.get(key)
        if form is None:
            names = [name for name in _FORMS if name != "folded" or heads != keys.shape[1]]
            form = _CHOSEN[key] = fastest(
                {
                    name: (lambda f=_FORMS[name]: f(query, keys, values, mask, scale))
                    for name in names
                }
            )
    out = _FORMS[form](query, keys, values, mask, scale)  # (B, Hq, n, Dh)
    return out.transpose(1, 2).reshape(batch, n, heads * dim)


def attention_choices() -> dict[str, str]:
    """What was measured so far, for reports: "dtype Hq/Hkv x Dh, one query|several, rows R-R'" ->
    "grouped" | "folded" | "matmul"."""
    return {
        f"{str(k[0]).removeprefix('torch.')} {k[1]}/{k[2]} x {k[3]}, "
        f"{'several' if k[4] else 'one query'}, {_rows_class(k[5])}": v
        for k, v in _CHOSEN.items()
    }


def _rows_class(bits: int) -> str:
    low, high = 1 << (bits - 1), (1 << bits) - 1
    return "1 row" if bits == 1 else f"rows {low}-{high}"
