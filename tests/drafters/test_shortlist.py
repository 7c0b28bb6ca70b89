"""Vocabulary shortlists: the reference semantics (specdec.drafting.shortlist, ReDrafter's
restricted head and beam search), the choice from teacher data, and checkpoints that keep ids
exact."""

from __future__ import annotations

import numpy as np
import pytest

from specdec.drafting.shortlist import (
    check_shortlist,
    choose_shortlist,
    restrict_logits,
    shortlist_coverage,
)
from specdec_redrafter.checkpoint import (
    load_redrafter_checkpoint,
    random_redrafter_weights,
    save_redrafter,
)
from specdec_redrafter.config import RedrafterConfig, check_weights
from specdec_redrafter.reference import beam_search, drafter_logits, sample_chains
from specdec.types import SamplingConfig


def drafter(seed: int, vocab: int = 12, hidden: int = 4, **overrides):
    rng = np.random.default_rng(seed)
    config = RedrafterConfig(vocab_size=vocab, hidden_size=hidden, head="tied", **overrides)
    weights = random_redrafter_weights(config, rng)
    return config, weights, rng.normal(size=(vocab, hidden)), rng.normal(size=(vocab, hidden))


def with_shortlist(config, weights, ids):
    import attrs

    return attrs.evolve(config, shortlist_size=len(ids)), {
        **weights,
        "vocab_shortlist": np.asarray(ids),
    }


def test_restrict_logits_masks_everything_else():
    logits = np.arange(6.0)[None]
    out = restrict_logits(logits, np.array([1, 4]))
    assert np.array_equal(out, [[-np.inf, 1.0, -np.inf, -np.inf, 4.0, -np.inf]])
    assert restrict_logits(logits, None) is logits


@pytest.mark.parametrize("seed", range(4))
def test_beams_draft_only_shortlisted_tokens(seed):
    config, weights, embed, lm_head = drafter(seed)
    ids = np.sort(np.random.default_rng(100 + seed).choice(12, size=5, replace=False))
    config, weights = with_shortlist(config, weights, ids)
    hidden, roots = np.random.default_rng(seed).normal(size=(3, 4)), np.array([0, 5, 11])
    result = beam_search(
        config,
        weights,
        hidden,
        roots,
        embed_tokens=embed,
        lm_head=lm_head,
        beam_width=4,
        beam_length=4,
    )
    assert np.isin(result.beams[:, :, 1:], ids).all(), (
        "a shortlisted drafter drafted a token outside its shortlist"
    )
    assert np.all(np.isfinite(result.scores)), "4 beams of 3 tokens over 5 ids are all live"
    outside = np.setdiff1d(np.arange(12), ids)
    assert np.all(result.log_probs[..., outside] == -np.inf) and np.allclose(
        np.exp(result.log_probs).sum(-1), 1.0
    ), "draft distributions live on the shortlist"
    uniforms = np.random.default_rng(seed).random((3, 4, 4))
    beams, probs = sample_chains(
        config,
        weights,
        hidden,
        roots,
        uniforms,
        SamplingConfig(temperature=0.8),
        embed_tokens=embed,
        lm_head=lm_head,
    )
    assert np.isin(beams[:, :, 1:], ids).all() and np.all(probs[..., outside] == 0.0), (
        "sampled chains"
    )


def test_full_shortlist_changes_nothing():
    config, weights, embed, lm_head = drafter(7)
    hidden, roots = np.random.default_rng(7).normal(size=(2, 4)), np.array([3, 9])
    plain = beam_search(
        config,
        weights,
        hidden,
        roots,
        embed_tokens=embed,
        lm_head=lm_head,
        beam_width=3,
        beam_length=4,
    )
    config2, weights2 = with_shortlist(config, weights, np.arange(12))
    listed = beam_search(
        config2,
        weights2,
        hidden,
        roots,
        embed_tokens=embed,
        lm_head=lm_head,
        beam_width=3,
        beam_length=4,
    )
    assert np.array_equal(plain.beams, listed.beams) and np.allclose(
        plain.log_probs, listed.log_probs
    )


def test_shortlist_keeps_the_drafters_choice_when_it_is_listed():
    """Greedy (W=1) drafting with a shortlist that holds every token the unrestricted drafter
    picks gives the same beam: restricting only removes tokens the drafter would not choose."""
    config, weights, embed, lm_head = drafter(11)
    hidden, roots = np.random.default_rng(11).normal(size=(4, 4)), np.array([1, 2, 3, 4])
    plain = beam_search(
        config,
        weights,
        hidden,
        roots,
        embed_tokens=embed,
        lm_head=lm_head,
        beam_width=1,
        beam_length=5,
    )
    ids = np.unique(plain.beams[:, 0, 1:])
    config2, weights2 = with_shortlist(config, weights, ids)
    listed = beam_search(
        config2,
        weights2,
        hidden,
        roots,
        embed_tokens=embed,
        lm_head=lm_head,
        beam_width=1,
        beam_length=5,
    )
    assert np.array_equal(plain.beams, listed.beams)
    logits = drafter_logits(
        config2, weights2, hidden[:, None], np.zeros((4, 1, 4)), lm_head=lm_head
    )
    assert np.all(np.isneginf(logits[..., np.setdiff1d(np.arange(12), ids)]))


def test_check_shortlist_names_the_problem():
    assert check_shortlist(np.array([0.0, 3.0, 7.0]), 8).dtype == np.int64
    for bad, message in [
        ([3, 1], "strictly increasing"),
        ([1, 1], "strictly increasing"),
        ([0, 8], r"\[0, 8\)"),
        ([0.5], "integer"),
        ([], "non-empty"),
    ]:
        with pytest.raises(ValueError, match=message):
            check_shortlist(np.array(bad), 8)
    with pytest.raises(ValueError, match="shortlist_size=3"):
        check_shortlist(np.array([1, 2]), 8, size=3)
    with pytest.raises(ValueError, match="exceeds vocab_size"):
        RedrafterConfig(vocab_size=8, hidden_size=2, shortlist_size=9)
    config, weights, _, _ = drafter(1, shortlist_size=4)
    with pytest.raises(ValueError, match="missing \\['vocab_shortlist'\\]"):
        check_weights(config, {k: v for k, v in weights.items() if k != "vocab_shortlist"})


def test_choose_shortlist_ranks_by_teacher_mass():
    next_tokens = np.array([5, 5, 5, 2, 2, 9])
    labels, probs = np.array([[7, 5], [7, 3]]), np.array([[0.9, 0.1], [0.9, 0.1]])
    assert choose_shortlist(10, 3, next_tokens=next_tokens).tolist() == [2, 5, 9]
    assert choose_shortlist(
        10, 3, next_tokens=next_tokens, label_ids=labels, label_probs=probs
    ).tolist() == [2, 5, 7]
    assert choose_shortlist(10, 2, next_tokens=np.array([4, 1])).tolist() == [1, 4], (
        "equal mass: lower id first"
    )
    assert choose_shortlist(3, 10, next_tokens=np.array([0])).tolist() == [0, 1, 2]
    assert shortlist_coverage(np.array([2, 5, 6, 9]), np.array([2, 5, 9])) == 0.75


def test_float16_checkpoint_keeps_large_token_ids_exact(tmp_path):
    """Token ids above 2048 are not representable in float16: ids are stored as integers."""
    config, weights, _, _ = drafter(3, vocab=5000, hidden=4)
    ids = np.array([0, 2049, 4093, 4999])
    config, weights = with_shortlist(config, weights, ids)
    save_redrafter(tmp_path / "d", config, weights, dtype=np.float16)
    loaded_config, loaded = load_redrafter_checkpoint(tmp_path / "d")
    assert loaded_config.shortlist_size == 4 and loaded["vocab_shortlist"].dtype == np.int64
    assert loaded["vocab_shortlist"].tolist() == ids.tolist()
