"""ReDrafter and Medusa on MLX against their float64 NumPy references.

Beams and head tokens are integers and must be identical; the float32 draft probabilities
match within ``checks.FLOAT32``. Near-ties are assumed away: an example is used only when the
reference's deciding scores are at least 1e-4 apart (beam search: consecutive candidates among
the best W + 1 of every step; Medusa: the best T + 1 logits of every head; sampled chains: the
reference's beams do not change with every uniform moved by +-1e-4).
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

pytest.importorskip(
    "mlx_lm", reason="mlx is not installed"
)  # required when SPECDEC_TEST_BACKENDS names mlx (conftest)

import mlx.core as mx  # noqa: E402

from specdec.errors import IncompatibleDrafterError  # noqa: E402
from specdec.plugins.registry import default_registry  # noqa: E402
from specdec.testing import checks, make_random_drafter, make_random_model, strategies  # noqa: E402
from specdec.types import DraftContext  # noqa: E402
from specdec_medusa.config import MedusaConfig  # noqa: E402
from specdec_medusa.mlx import MlxMedusaDrafter  # noqa: E402
from specdec_medusa.reference import MedusaDrafter, head_logits, init_random_weights  # noqa: E402
from specdec_mlx.backend import MlxBackend  # noqa: E402
from specdec_redrafter import reference  # noqa: E402
from specdec_redrafter.checkpoint import random_redrafter_weights  # noqa: E402
from specdec_redrafter.config import RedrafterConfig  # noqa: E402
from specdec_redrafter.mlx import MlxRedrafterDrafter  # noqa: E402

VOCAB, HIDDEN, MARGIN = 48, 16, 1e-4
REDRAFTER_CONFIGS = [
    dict(rnn_variant="apple", head="full"),
    dict(rnn_variant="apple", head="tied", draft_top_k=5),
    dict(rnn_variant="trtllm", head="tied", exit_dim=24),
    dict(rnn_variant="paper", head="full", num_draft_layers=2, draft_top_k=2),
    dict(rnn=False, head="tied", num_draft_layers=0),
    dict(rnn_variant="apple", head="tied", shortlist_size=20),
    dict(rnn_variant="paper", head="full", shortlist_size=12, draft_top_k=5),
]


def float32_exact(array: np.ndarray) -> np.ndarray:
    """float64 values that float32 holds exactly, so both sides start from the same weights."""
    return np.asarray(array, dtype=np.float32).astype(np.float64)


def beam_search_margin(
    drafter: reference.RedrafterDrafter, hidden: np.ndarray, roots: np.ndarray
) -> float:
    """The smallest gap between consecutive finite candidate scores among the best W + 1 of
    every step of the reference's beam search (the replay of ``reference.beam_search``)."""
    cfg, width, vocab = drafter.config, drafter.beam_width, drafter.config.vocab_size
    beams = np.repeat(roots[:, None, None], width, axis=1)
    scores = np.where(np.arange(width) == 0, 0.0, -np.inf)[None].repeat(len(roots), 0)
    state, margin = np.zeros((len(roots), width, cfg.hidden_size)), np.inf
    for t in range(1, drafter.beam_length):
        state = reference.rnn_step(
            cfg, drafter.weights, state, drafter.embed_tokens[beams[:, :, -1]], first=t == 1
        )
        logits = reference.drafter_logits(
            cfg, drafter.weights, hidden[:, None], state, lm_head=drafter.lm_head
        )
        candidates = (
            scores[:, :, None] + reference.draft_log_probs(logits, top_k=cfg.draft_top_k)
        ).reshape(len(roots), -1)
        best = np.argsort(-candidates, axis=1, kind="stable")[:, : width + 1]
        top = np.take_along_axis(candidates, best, axis=1)
        finite = np.isfinite(top[:, :-1]) & np.isfinite(
            top[:, 1:]
        )  # -inf ties are exact: no margin needed
        gaps = np.where(finite, top[:, :-1] - np.where(finite, top[:, 1:], 0.0), np.inf)
        margin = min(margin, float(np.min(gaps)))
        best = best[:, :width]
        beams = np.concatenate(
            [np.take_along_axis(beams, (best // vocab)[:, :, None], 1), (best % vocab)[:, :, None]],
            2,
        )
        state, scores = (
            np.take_along_axis(state, (best // vocab)[:, :, None], 1),
            np.take_along_axis(candidates, best, 1),
        )
    return margin


def make_pair(
    overrides: dict, seed: int, width: int, length: int, sample: bool = False, vocab: int = VOCAB
):
    """A reference ReDrafter and its MLX twin on the same float32-exact weights."""
    rng = np.random.default_rng(seed)
    config = RedrafterConfig(vocab_size=vocab, hidden_size=HIDDEN, **overrides)
    weights = {
        k: float32_exact(v) for k, v in random_redrafter_weights(config, rng, embed_rms=0.5).items()
    }
    embed, lm_head = (float32_exact(rng.normal(0, 0.5, (vocab, HIDDEN))) for _ in range(2))
    pieces = dict(beam_width=width, beam_length=length, sample=sample)
    ref = reference.RedrafterDrafter(config, weights, embed_tokens=embed, lm_head=lm_head, **pieces)
    twin = MlxRedrafterDrafter(
        config,
        weights,
        embed_tokens=mx.array(embed.astype(np.float32)),
        lm_head=mx.array(lm_head.astype(np.float32)),
        **pieces,
    )
    return ref, twin, rng


def contexts(rng, batch: int, vocab: int = VOCAB, **fields):
    hidden = float32_exact(rng.normal(size=(batch, HIDDEN)))
    roots = rng.integers(0, vocab, size=batch)
    return (
        DraftContext(root_tokens=roots, hidden=hidden, **fields),
        DraftContext(
            root_tokens=mx.array(roots), hidden=mx.array(hidden.astype(np.float32)), **fields
        ),
    )


@pytest.mark.parametrize(
    "overrides", REDRAFTER_CONFIGS, ids=lambda o: "-".join(f"{k}={v}" for k, v in o.items())
)
@given(seed=st.integers(0, 2**32 - 1), shape=st.sampled_from([(1, 2), (1, 4), (3, 3), (4, 4)]))
def test_redrafter_beam_search_matches_reference(overrides, seed, shape):
    ref, twin, rng = make_pair(overrides, seed, *shape)
    expected_context, context = contexts(rng, 3, want_draft_probs=True)
    assume(beam_search_margin(ref, expected_context.hidden, expected_context.root_tokens) > MARGIN)
    expected, actual = ref.propose(expected_context), twin.propose(context)
    where = f"MlxRedrafterDrafter.propose({overrides}, W, L = {shape}, seed={seed})"
    np.testing.assert_array_equal(np.array(actual.beams), expected.beams, err_msg=f"{where}: beams")
    np.testing.assert_allclose(
        np.array(actual.draft_probs),
        expected.draft_probs,
        **checks.FLOAT32,
        err_msg=f"{where}: draft_probs",
    )
    assert not actual.sampled, where


@given(seed=st.integers(0, 2**32 - 1), top_k=st.sampled_from([None, 1]))
def test_redrafter_more_beams_than_tokens_matches_reference(seed, top_k):
    """W > V: the first step keeps dead beams (-inf), lowest flat index first, as the reference."""
    ref, twin, rng = make_pair(dict(head="full", draft_top_k=top_k), seed, 4, 3, vocab=3)
    expected_context, context = contexts(rng, 2, vocab=3, want_draft_probs=True)
    assume(beam_search_margin(ref, expected_context.hidden, expected_context.root_tokens) > MARGIN)
    expected, actual = ref.propose(expected_context), twin.propose(context)
    np.testing.assert_array_equal(
        np.array(actual.beams),
        expected.beams,
        err_msg=f"MlxRedrafterDrafter.propose(W=4 > V=3, top_k={top_k}, seed={seed})",
    )
    np.testing.assert_allclose(np.array(actual.draft_probs), expected.draft_probs, **checks.FLOAT32)


@pytest.mark.parametrize(
    "overrides", REDRAFTER_CONFIGS[:3], ids=lambda o: "-".join(f"{k}={v}" for k, v in o.items())
)
@given(seed=st.integers(0, 2**32 - 1), sampling=strategies.sampling_configs(greedy=False))
def test_redrafter_sampled_chains_match_reference(overrides, seed, sampling):
    ref, twin, rng = make_pair(overrides, seed, 3, 4, sample=True)
    assert twin.caps.sample_shape == ref.caps.sample_shape == (3, 4) and twin.caps.sampled_proposals
    uniforms = rng.random((2, 3, 4))
    expected_context, context = contexts(rng, 2, sampling=sampling, uniforms=uniforms)
    shifted = {
        ref.propose(
            DraftContext(
                root_tokens=expected_context.root_tokens,
                hidden=expected_context.hidden,
                sampling=sampling,
                uniforms=np.clip(uniforms + s, 0, 1 - 1e-12),
            )
        ).beams.tobytes()
        for s in (-MARGIN, MARGIN)
    }
    expected, actual = ref.propose(expected_context), twin.propose(context)
    assume(shifted == {expected.beams.tobytes()})
    where = f"MlxRedrafterDrafter.propose(sample=True, {overrides}, {sampling}, seed={seed})"
    np.testing.assert_array_equal(np.array(actual.beams), expected.beams, err_msg=f"{where}: beams")
    np.testing.assert_allclose(
        np.array(actual.draft_probs),
        expected.draft_probs,
        **checks.FLOAT32,
        err_msg=f"{where}: draft_probs",
    )
    assert actual.sampled, where


@pytest.mark.parametrize("head,num_layers", [("full", 0), ("full", 2), ("tied", 1)])
@given(seed=st.integers(0, 2**32 - 1), top_t=st.integers(1, 6))
def test_medusa_head_tokens_match_reference(head, num_layers, seed, top_t):
    rng = np.random.default_rng(seed)
    config = MedusaConfig(
        vocab_size=VOCAB,
        hidden_size=HIDDEN,
        num_heads=3,
        num_layers=num_layers,
        head=head,
        top_t=6,
        choices="chain4",
    )
    weights = {k: float32_exact(v) for k, v in init_random_weights(config, rng).items()}
    lm_head = float32_exact(rng.normal(0, 0.5, (VOCAB, HIDDEN)))
    hidden = float32_exact(rng.normal(size=(3, HIDDEN)))
    top = np.sort(head_logits(config, weights, lm_head, hidden), axis=-1)[..., ::-1][
        ..., : top_t + 1
    ]
    assume(np.min(top[..., :-1] - top[..., 1:]) > MARGIN)
    expected = MedusaDrafter(config, weights, lm_head=lm_head, top_t=top_t).propose(
        DraftContext(root_tokens=np.arange(3), hidden=hidden)
    )
    twin = MlxMedusaDrafter(
        config, weights, lm_head=mx.array(lm_head.astype(np.float32)), top_t=top_t
    )
    actual = twin.propose(
        DraftContext(root_tokens=mx.arange(3), hidden=mx.array(hidden.astype(np.float32)))
    )
    np.testing.assert_array_equal(
        np.array(actual.head_tokens),
        expected.head_tokens,
        err_msg=f"MlxMedusaDrafter.propose({head}, layers={num_layers}, T={top_t}, seed={seed})",
    )
    assert twin.caps.tree_builder == ("medusa_tree", {"choices": "chain4"})


def test_checkpoints_load_through_the_registry_and_check_the_fingerprint(tmp_path):
    """The same checkpoint folders as the reference; a recorded fingerprint is checked."""
    model = make_random_model(
        tmp_path / "m",
        vocab_size=VOCAB,
        hidden_size=HIDDEN,
        num_layers=1,
        num_heads=2,
        num_kv_heads=1,
        seed=0,
    )
    target = MlxBackend().load_target(model)
    registry = default_registry()
    for kind in ("redrafter", "medusa"):
        good = make_random_drafter(
            tmp_path / f"{kind}-ok",
            model,
            kind=kind,
            seed=1,
            target={
                "name": "m",
                "fingerprint": target.fingerprint,
                "vocab_size": VOCAB,
                "hidden_size": HIDDEN,
            },
        )
        drafter = registry.get("drafter", kind, "mlx").factory(target, good)
        assert type(drafter).__module__.endswith(".mlx"), f"{kind} on mlx built {type(drafter)}"
        bad = make_random_drafter(
            tmp_path / f"{kind}-bad",
            model,
            kind=kind,
            seed=1,
            target={"name": "m", "fingerprint": "0" * 64},
        )
        with pytest.raises(IncompatibleDrafterError, match="fingerprint"):
            registry.get("drafter", kind, "mlx").factory(target, bad)
