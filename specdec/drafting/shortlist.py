"""Vocabulary shortlists: a drafter that proposes only the S most likely tokens of its target.

A drafter's vocabulary projection (V x H, V ~ 49k for SmolLM2) is most of its cost on a CPU,
and most of the vocabulary is never what the target says next. A shortlist is a sorted array of
S token ids; a shortlisted drafter scores only those (logits of every other token are -inf),
so a fast backend multiplies by S rows of the LM head instead of V. The output stays lossless:
the target verifies every drafted token, and a token outside the shortlist is simply never
drafted (the target's own token, the bonus, still can be anything).

``restrict_logits`` is the float64 reference of what every backend computes;
``choose_shortlist`` picks the ids from teacher data (greedy tokens and soft labels).
"""

from __future__ import annotations

import numpy as np

__all__ = ["check_shortlist", "choose_shortlist", "restrict_logits", "shortlist_coverage"]


def check_shortlist(shortlist, vocab_size: int, size: int | None = None) -> np.ndarray:
    """The shortlist as int64, after checking it is strictly increasing ids in [0, vocab_size)
    (and of length ``size`` when given); a ValueError naming the problem otherwise."""
    ids = np.asarray(shortlist)
    if ids.ndim != 1 or ids.size == 0:
        raise ValueError(
            f"a vocabulary shortlist is a non-empty 1-D array of token ids, got shape {ids.shape}"
        )
    if not np.all(ids == np.round(ids)):
        raise ValueError("a vocabulary shortlist holds integer token ids; got non-integer values")
    ids = ids.astype(np.int64)
    if size is not None and ids.size != size:
        raise ValueError(
            f"the vocabulary shortlist has {ids.size} ids but the config says shortlist_size={size}"
        )
    if ids[0] < 0 or ids[-1] >= vocab_size or np.any(np.diff(ids) <= 0):
        raise ValueError(
            f"a vocabulary shortlist must be strictly increasing token ids in [0, {vocab_size})"
        )
    return ids


def restrict_logits(logits: np.ndarray, shortlist: np.ndarray | None) -> np.ndarray:
    """Logits (..., V) with every token outside ``shortlist`` set to -inf
    (a copy; None: unchanged)."""
    if shortlist is None:
        return logits
    out = np.full_like(np.asarray(logits, dtype=np.float64), -np.inf)
    ids = np.asarray(shortlist, dtype=np.int64)
    out[..., ids] = np.asarray(logits, dtype=np.float64)[..., ids]
    return out


def choose_shortlist(
    vocab_size: int, size: int, *, next_tokens, label_ids=None, label_probs=None
) -> np.ndarray:
    """The ``size`` token ids with the most teacher mass, sorted ascending.

    Mass of a token: how often it is the target's greedy next token, plus its soft-label
    probability summed over positions (``label_ids``/``label_probs`` (P, k), optional). Equal
    mass goes to the lower id. ``size >= vocab_size`` keeps every token.
    """
    if size < 1:
        raise ValueError(f"a shortlist needs at least one token, got size={size}")
    mass = np.bincount(
        np.asarray(next_tokens, dtype=np.int64).ravel(), minlength=vocab_size
    ).astype(np.float64)
    if label_ids is not None:
        mass += np.bincount(
            np.asarray(label_ids, dtype=np.int64).ravel(),
            weights=np.asarray(label_probs, dtype=np.float64).ravel(),
            minlength=vocab_size,
        )
    order = np.argsort(-mass, kind="stable")[: min(size, vocab_size)]
    return np.sort(order).astype(np.int64)


def shortlist_coverage(tokens, shortlist: np.ndarray) -> float:
    """The share of ``tokens`` that are in ``shortlist`` (the best case for a shortlisted
    drafter)."""
    tokens = np.asarray(tokens, dtype=np.int64).ravel()
    if tokens.size == 0:
        return 1.0
    return float(np.isin(tokens, shortlist).mean())
