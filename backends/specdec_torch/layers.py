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

__all__ = ["apply_rotary", "attend", "mlp", "rms_norm", "rotary_cos_sin", "rotary_dtype"]

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


def attend(query: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Grouped-query attention. query (B, Hq, n, Dh); keys, values (B, Hkv, S, Dh); mask (B, 1, n, S)
    bool (True = may attend; every query row has at least one True). Returns (B, n, Hq * Dh)."""
    batch, heads, n, dim = query.shape
    out = F.scaled_dot_product_attention(
        query, keys, values, attn_mask=mask, scale=1.0 / math.sqrt(dim), enable_gqa=heads != keys.shape[1]
    )  # (B, Hq, n, Dh)
    return out.transpose(1, 2).reshape(batch, n, heads * dim)


def mlp(x: torch.Tensor, gate: torch.nn.Linear, up: torch.nn.Linear, down: torch.nn.Linear) -> torch.Tensor:
    """SwiGLU: down(silu(gate(x)) * up(x)). x (..., H) -> (..., H)."""
    return down(F.silu(gate(x)) * up(x))
