"""The pieces of a Llama-family decoder layer as plain functions of tensors (torch twin of
``specdec.reference.model``): RMSNorm, rotary embeddings at explicit positions, attention over a
KV cache with a boolean mask, the SwiGLU MLP.

Shapes: B batch, n new tokens, S key slots, Hq query heads, Hkv key/value heads, Dh head size,
H hidden size.
"""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F

from specdec_torch.timing import second_is_faster

__all__ = ["apply_rotary", "attend", "attention_choices", "mlp", "rms_norm", "rotary_cos_sin", "rotary_dtype"]

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


def rotary_cos_sin(positions: torch.Tensor, inv_freq: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
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
    """(Dh/2,) rotation speeds with the model's rope scaling, computed by the reference in float64."""
    from specdec.reference.model import rotary_inverse_frequencies

    return torch.from_numpy(np.asarray(rotary_inverse_frequencies(config))).to(device=device, dtype=rotary_dtype(device))


MEASURED_QUERIES = 32  # attention of up to this many new tokens (one, or a draft tree) is measured
# (dtype, query heads, key/value heads, head size, several queries) -> True when the folded form was faster.
_FOLDED: dict[tuple, bool] = {}


def _grouped(query, keys, values, mask, scale):
    return F.scaled_dot_product_attention(query, keys, values, attn_mask=mask, scale=scale,
                                          enable_gqa=query.shape[1] != keys.shape[1])


def _folded(query, keys, values, mask, scale):
    """The same attention with the query heads that share a key/value head stacked as rows of
    one head (B, Hkv, g * n, Dh): one matrix product per key/value head instead of g."""
    batch, heads, n, dim = query.shape
    kv_heads, span = keys.shape[1], keys.shape[2]
    group = heads // kv_heads  # query head h reads key/value head h // group
    rows_mask = mask[:, :, None].expand(batch, 1, group, n, span).reshape(batch, 1, group * n, span)
    out = F.scaled_dot_product_attention(query.reshape(batch, kv_heads, group * n, dim), keys, values,
                                         attn_mask=rows_mask, scale=scale)
    return out.reshape(batch, heads, n, dim)


def attend(query: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Grouped-query attention. query (B, Hq, n, Dh); keys, values (B, Hkv, S, Dh); mask (B, 1, n, S)
    bool (True = may attend; every query row has at least one True). Returns (B, n, Hq * Dh).

    On the CPU, with fewer key/value heads than query heads and at most ``MEASURED_QUERIES`` new
    tokens, the first call per dtype, head layout and query class (one token / several) times
    ``scaled_dot_product_attention`` with ``enable_gqa`` against the folded form (``_folded``)
    and keeps the faster for the process (``specdec_torch.timing``). On the project's CPU one
    bfloat16 query over 400 keys took 197 us grouped and 39 us folded (SmolLM2-135M: 9 query, 3
    key/value heads), while float32 was faster grouped (25 against 36 us).
    """
    batch, heads, n, dim = query.shape
    scale = 1.0 / math.sqrt(dim)
    form = _grouped
    if heads != keys.shape[1] and query.device.type == "cpu" and n <= MEASURED_QUERIES:
        key = (query.dtype, heads, keys.shape[1], dim, n > 1)
        folded = _FOLDED.get(key)
        if folded is None:
            folded = _FOLDED[key] = second_is_faster(lambda: _grouped(query, keys, values, mask, scale),
                                                     lambda: _folded(query, keys, values, mask, scale))
        form = _folded if folded else _grouped
    out = form(query, keys, values, mask, scale)  # (B, Hq, n, Dh)
    return out.transpose(1, 2).reshape(batch, n, heads * dim)


def attention_choices() -> dict[str, str]:
    """What was measured so far, for reports: "dtype Hq/Hkv x Dh, one query|several" -> "grouped" | "folded"."""
    return {f"{str(k[0]).removeprefix('torch.')} {k[1]}/{k[2]} x {k[3]}, {'several' if k[4] else 'one query'}":
            "folded" if v else "grouped" for k, v in _FOLDED.items()}


def mlp(x: torch.Tensor, gate: torch.nn.Linear, up: torch.nn.Linear, down: torch.nn.Linear) -> torch.Tensor:
    """SwiGLU: down(silu(gate(x)) * up(x)). x (..., H) -> (..., H)."""
    return down(F.silu(gate(x)) * up(x))
