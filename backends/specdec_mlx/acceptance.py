"""The acceptance arithmetic of the mlx verifiers (rejection sampling, the lossy rules).

Backend-internal: drafters use ``specdec_mlx.ops``. Probabilities are float32; shapes: ``...``
any leading axes, V the last (vocabulary) axis.
"""

from __future__ import annotations

import mlx.core as mx


def coin(probability: mx.array, uniforms: mx.array | None) -> mx.array:
    """True with ``probability`` (...): ``u < probability``; greedy (None): probability >= 1."""
    return probability >= 1.0 if uniforms is None else uniforms.astype(mx.float32) < probability


def acceptance_probability(
    residual_probs: mx.array, draft_probs: mx.array, tokens: mx.array
) -> mx.array:
    """min(1, residual_probs[x] / draft_probs[x]) per row; 1 if the drafter gave x no mass but
    the residual does, 0 if neither. residual_probs, draft_probs (..., V); tokens (...) -> (...)."""
    numerator = mx.take_along_axis(residual_probs, tokens[..., None], axis=-1)[..., 0]
    denominator = mx.take_along_axis(draft_probs, tokens[..., None], axis=-1)[..., 0]
    ratio = mx.minimum(1.0, numerator / mx.where(denominator > 0, denominator, 1.0))
    return mx.where(denominator > 0, ratio, mx.where(numerator > 0, 1.0, 0.0))


def subtract_draft(residual_probs: mx.array, draft_probs: mx.array) -> mx.array:
    """normalize(max(residual_probs - draft_probs, 0)) over the last axis; the residual itself
    where nothing is left. Both (..., V)."""
    leftover = mx.maximum(residual_probs - draft_probs, 0.0)
    mass = mx.sum(leftover, axis=-1, keepdims=True)
    return mx.where(mass > 0, leftover / mx.where(mass > 0, mass, 1.0), residual_probs)


def entropy(probs: mx.array) -> mx.array:
    """Shannon entropy in nats over the last axis, 0 log 0 = 0. (..., V) -> (...)."""
    safe = mx.where(probs > 0, probs, 1.0)
    return -mx.sum(mx.where(probs > 0, probs * mx.log(safe), 0.0), axis=-1)
