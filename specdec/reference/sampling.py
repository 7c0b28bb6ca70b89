"""Temperature, top-k and top-p, applied identically by every backend (float64 reference).

Order of operations (as in ``transformers``): divide logits by the temperature, keep the top-k
logits, softmax, keep the smallest prefix of tokens (sorted by probability, ties to the lower
id) whose mass reaches top-p, renormalise. Temperature 0 is greedy: a one-hot distribution on
the argmax, ties to the lowest token id.
"""

from __future__ import annotations

import numpy as np

from specdec.types import SamplingConfig


def softmax(logits: np.ndarray) -> np.ndarray:
    """Softmax over the last axis, float64."""
    z = np.asarray(logits, dtype=np.float64)
    z = z - z.max(axis=-1, keepdims=True)
    e = np.exp(z)
    return e / e.sum(axis=-1, keepdims=True)


def greedy_tokens(logits: np.ndarray) -> np.ndarray:
    """Argmax over the last axis; ``np.argmax`` returns the first (lowest-id) maximum."""
    return np.argmax(logits, axis=-1)


def target_probs(logits: np.ndarray, sampling: SamplingConfig) -> np.ndarray:
    """The distribution a row samples from. logits (..., V) -> probs (..., V) float64."""
    logits = np.asarray(logits, dtype=np.float64)
    if sampling.greedy:
        return np.eye(logits.shape[-1])[greedy_tokens(logits)]
    z = logits / sampling.temperature
    vocab = z.shape[-1]
    # Stable descending order: equal logits keep ascending token ids.
    order = np.argsort(-z, axis=-1, kind="stable")  # (..., V)
    rank = np.empty_like(order)
    np.put_along_axis(rank, order, np.arange(vocab), axis=-1)
    if sampling.top_k is not None and sampling.top_k < vocab:
        z = np.where(rank < sampling.top_k, z, -np.inf)
    probs = softmax(z)
    if sampling.top_p is not None and sampling.top_p < 1.0:
        sorted_probs = np.take_along_axis(probs, order, axis=-1)
        # mass of strictly better tokens
        mass_before = np.cumsum(sorted_probs, axis=-1) - sorted_probs
        keep_sorted = mass_before < sampling.top_p  # always keeps rank 0
        keep = np.take_along_axis(keep_sorted, rank, axis=-1)
        probs = np.where(keep, probs, 0.0)
        probs = probs / probs.sum(axis=-1, keepdims=True)
    return probs


def sample_from(probs: np.ndarray, uniforms: np.ndarray) -> np.ndarray:
    """Inverse-CDF sampling: the first token whose cumulative probability exceeds ``u``.

    probs (..., V) non-negative (need not be normalised); uniforms (...) in [0, 1).
    Returns int64 (...). A token of probability 0 is never returned.
    """
    probs = np.asarray(probs, dtype=np.float64)
    cdf = np.cumsum(probs, axis=-1)
    threshold = np.asarray(uniforms, dtype=np.float64)[..., None] * cdf[..., -1:]
    token = np.sum(cdf <= threshold, axis=-1)
    # Guard against rounding at the top end: fall back to the last token with mass.
    last_nonzero = probs.shape[-1] - 1 - np.argmax(probs[..., ::-1] > 0, axis=-1)
    return np.minimum(token, last_nonzero).astype(np.int64)
