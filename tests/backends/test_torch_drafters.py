"""Torch ReDrafter and Medusa against their float64 references: same beams, same head tokens,
same draft probabilities, given the same weights, hidden states and uniforms."""

from __future__ import annotations

import os

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

torch = pytest.importorskip("torch")  # required when SPECDEC_TEST_BACKENDS names torch (conftest)

from specdec.testing.strategies import sampling_configs
from specdec.types import DraftContext, SamplingConfig
from specdec_medusa.config import MedusaConfig
from specdec_medusa.reference import MedusaDrafter, head_logits, init_random_weights
from specdec_medusa.torch import TorchMedusaDrafter
from specdec_redrafter.checkpoint import random_redrafter_weights
from specdec_redrafter.config import RedrafterConfig
from specdec_redrafter.reference import RedrafterDrafter, draft_log_probs, drafter_logits, rnn_step
from specdec_redrafter.torch import TorchRedrafterDrafter
from specdec_torch.int8 import int8_kernel

DEVICE = torch.device(os.environ.get("SPECDEC_TORCH_DEVICE", "cpu"))
DTYPES = {"float64": torch.float64, "float32": torch.float32}
VOCAB, HIDDEN = 24, 8


def _redrafter_pair(config: RedrafterConfig, seed: int, dtype: str, **options):
    """The reference drafter and its torch twin over one random target embedding and LM head
    (with ``int8``: values exact in float32, so that both round the same numbers to int8)."""
    rng = np.random.default_rng(seed)
    embed = rng.normal(0, 1, size=(VOCAB, HIDDEN))
    lm_head = rng.normal(0, 1, size=(VOCAB, HIDDEN))
    weights = random_redrafter_weights(config, rng, embed_rms=1.0, lm_head_rms=1.0)
    if options.get("int8"):
        representable = lambda a: a.astype(np.float32).astype(np.float64)  # noqa: E731
        embed, lm_head = representable(embed), representable(lm_head)
        weights = {
            k: v if k == "vocab_shortlist" else representable(np.asarray(v))
            for k, v in weights.items()
        }
    reference = RedrafterDrafter(config, weights, embed_tokens=embed, lm_head=lm_head, **options)
    as_tensor = lambda a: torch.as_tensor(a, dtype=DTYPES[dtype], device=DEVICE)
    twin = TorchRedrafterDrafter(
        config, weights, embed_tokens=as_tensor(embed), lm_head=as_tensor(lm_head), **options
    )
    return reference, twin


def _selection_gap(drafter: RedrafterDrafter, hidden: np.ndarray, roots: np.ndarray) -> float:
    """Smallest gap, over the beam-search steps, between the W-th and (W+1)-th candidate score
    when both are finite and different (exact ties, e.g. -inf from draft_top_k, are fine:
    both backends break them by index). Replays the reference's steps."""
    config, width, vocab = drafter.config, drafter.beam_width, drafter.config.vocab_size
    beams = np.repeat(roots[:, None, None], width, axis=1)
    scores = np.full((len(roots), width), -np.inf)
    scores[:, 0] = 0.0
    state = np.zeros((len(roots), width, config.hidden_size))
    gap = np.inf
    for t in range(1, drafter.beam_length):
        state = rnn_step(
            config, drafter.weights, state, drafter.embed_tokens[beams[:, :, -1]], first=t == 1
        )
        logits = drafter_logits(
            config, drafter.weights, hidden[:, None, :], state, lm_head=drafter.lm_head
        )
        candidates = (
            scores[:, :, None] + draft_log_probs(logits, top_k=config.draft_top_k)
        ).reshape(len(roots), -1)
        order = np.argsort(-candidates, axis=1, kind="stable")
        ranked = np.take_along_axis(candidates, order, axis=1)
        if ranked.shape[1] > width:
            inside, outside = ranked[:, width - 1], ranked[:, width]
            finite = np.isfinite(inside) & np.isfinite(outside) & (inside != outside)
            if finite.any():
                gap = min(gap, float(np.min((inside - outside)[finite])))
        best = order[:, :width]
        parent, token = best // vocab, best % vocab
        scores = np.take_along_axis(candidates, best, axis=1)
        beams = np.concatenate(
            [np.take_along_axis(beams, parent[:, :, None], axis=1), token[:, :, None]], axis=2
        )
        state = np.take_along_axis(state, parent[:, :, None], axis=1)
    return gap


redrafter_configs = st.builds(
    RedrafterConfig,
    vocab_size=st.just(VOCAB),
    hidden_size=st.just(HIDDEN),
    exit_dim=st.sampled_from([2 * HIDDEN, 12]),
    num_draft_layers=st.integers(0, 2),
    rnn=st.booleans(),
    rnn_variant=st.sampled_from(["apple", "trtllm", "paper"]),
    head=st.sampled_from(["full", "tied"]),
    draft_top_k=st.sampled_from([None, 2, 5]),
    shortlist_size=st.sampled_from([None, None, 6, 16]),
)


@settings(max_examples=40)
@given(
    config=redrafter_configs,
    seed=st.integers(0, 2**16),
    width=st.integers(1, 5),
    length=st.integers(2, 5),
    dtype=st.sampled_from(["float64", "float32", "float32 int8"]),
)
def test_redrafter_beam_search_matches_reference(config, seed, width, length, dtype):
    """float32 int8: both drafters with every product's weight rounded to int8
    (the torch one by its kernel)."""
    if dtype.endswith("int8") and not int8_kernel():
        pytest.skip("this torch has no int8 weight-only kernel")
    int8 = dict(int8=True) if dtype.endswith("int8") else {}
    dtype = dtype.split()[0]
    reference, twin = _redrafter_pair(
        config, seed, dtype, beam_width=width, beam_length=length, **int8
    )
    rng = np.random.default_rng(seed + 1)
    hidden, roots = rng.normal(0, 1, size=(3, HIDDEN)), rng.integers(0, VOCAB, size=3)
    assume(_selection_gap(reference, hidden, roots) > (1e-9 if dtype == "float64" else 1e-3))
    context = dict(sampling=SamplingConfig(), want_draft_probs=True)
    expected = reference.propose(DraftContext(root_tokens=roots, hidden=hidden, **context))
    got = twin.propose(
        DraftContext(
            root_tokens=torch.as_tensor(roots, device=DEVICE),
            hidden=torch.as_tensor(hidden, device=DEVICE),
            **context,
        )
    )
    where = f"torch beam search ({dtype}{' int8' if int8 else ''}, W={width}, L={length}, {config})"
    assert np.array_equal(got.beams.cpu().numpy(), expected.beams), f"{where}: beams differ"
    tolerance = dict(rtol=1e-9, atol=1e-12) if dtype == "float64" else dict(rtol=1e-4, atol=1e-6)
    assert np.allclose(got.draft_probs.cpu().numpy(), expected.draft_probs, **tolerance), (
        f"{where}: draft_probs"
    )


def test_redrafter_wider_than_vocabulary_uses_dead_beams_like_reference():
    """W > V at the first step: the reference's -inf ties (dead beams) decide the order."""
    config = RedrafterConfig(vocab_size=VOCAB, hidden_size=HIDDEN, draft_top_k=3)
    reference, twin = _redrafter_pair(config, 5, "float64", beam_width=VOCAB + 4, beam_length=3)
    hidden, roots = np.ones((2, HIDDEN)), np.array([1, 2])
    expected = reference.propose(DraftContext(root_tokens=roots, hidden=hidden))
    got = twin.propose(
        DraftContext(
            root_tokens=torch.as_tensor(roots, device=DEVICE),
            hidden=torch.as_tensor(hidden, device=DEVICE),
        )
    )
    assert np.array_equal(got.beams.cpu().numpy(), expected.beams), (
        "torch beam search with W > V differs"
    )


@settings(max_examples=25)
@given(
    config=redrafter_configs,
    seed=st.integers(0, 2**16),
    width=st.integers(1, 4),
    length=st.integers(2, 5),
    sampling=sampling_configs(greedy=False),
)
def test_redrafter_sampled_chains_match_reference(config, seed, width, length, sampling):
    reference, twin = _redrafter_pair(
        config, seed, "float64", beam_width=width, beam_length=length, sample=True
    )
    rng = np.random.default_rng(seed + 1)
    hidden, roots = rng.normal(0, 1, size=(2, HIDDEN)), rng.integers(0, VOCAB, size=2)
    uniforms = rng.random((2, width, length))
    expected = reference.propose(
        DraftContext(root_tokens=roots, hidden=hidden, sampling=sampling, uniforms=uniforms)
    )
    got = twin.propose(
        DraftContext(
            root_tokens=torch.as_tensor(roots, device=DEVICE),
            hidden=torch.as_tensor(hidden, device=DEVICE),
            sampling=sampling,
            uniforms=uniforms,
        )
    )
    where = f"torch sampled chains ({sampling}, W={width}, L={length})"
    assert got.sampled and twin.caps.sampled_proposals and twin.caps.sample_shape == (width, length)
    assert np.array_equal(got.beams.cpu().numpy(), expected.beams), f"{where}: beams differ"
    assert np.allclose(
        got.draft_probs.cpu().numpy(), expected.draft_probs, rtol=1e-9, atol=1e-12
    ), where


medusa_configs = st.builds(
    MedusaConfig,
    vocab_size=st.just(VOCAB),
    hidden_size=st.just(HIDDEN),
    num_heads=st.integers(4, 5),
    num_layers=st.integers(0, 2),
    head=st.sampled_from(["full", "tied"]),
    top_t=st.integers(6, 8),
)


@settings(max_examples=25)
@given(
    config=medusa_configs, seed=st.integers(0, 2**16), dtype=st.sampled_from(["float64", "float32"])
)
def test_medusa_heads_match_reference(config, seed, dtype):
    rng = np.random.default_rng(seed)
    weights = init_random_weights(config, rng)
    lm_head = rng.normal(0, 4 / np.sqrt(HIDDEN), size=(VOCAB, HIDDEN))
    hidden = rng.normal(0, 1, size=(3, HIDDEN))
    logits = head_logits(config, weights, lm_head, hidden)
    ordered = np.sort(logits, axis=-1)[..., ::-1][..., : config.top_t + 1]
    assume(
        np.all(np.diff(ordered, axis=-1) < -(1e-9 if dtype == "float64" else 1e-3))
    )  # no near-ties in the top T+1
    reference = MedusaDrafter(config, weights, lm_head=lm_head)
    twin = TorchMedusaDrafter(
        config,
        weights,
        lm_head=torch.as_tensor(lm_head, dtype=DTYPES[dtype], device=DEVICE),
        dtype=DTYPES[dtype],
        device=DEVICE,
    )
    roots = rng.integers(0, VOCAB, size=3)
    expected = reference.propose(DraftContext(root_tokens=roots, hidden=hidden))
    got = twin.propose(
        DraftContext(
            root_tokens=torch.as_tensor(roots, device=DEVICE),
            hidden=torch.as_tensor(hidden, device=DEVICE),
        )
    )
    assert np.array_equal(got.head_tokens.cpu().numpy(), expected.head_tokens), (
        f"torch Medusa ({dtype}, {config})"
    )
    tolerance = dict(rtol=1e-9, atol=1e-9) if dtype == "float64" else dict(rtol=1e-4, atol=1e-4)
    assert np.allclose(
        twin.heads(torch.as_tensor(hidden, dtype=DTYPES[dtype], device=DEVICE)).cpu().numpy(),
        logits,
        **tolerance,
    ), f"torch Medusa logits ({dtype}, {config})"


def test_medusa_top_t_ties_go_to_the_lower_id():
    config = MedusaConfig(
        vocab_size=VOCAB,
        hidden_size=HIDDEN,
        num_heads=4,
        num_layers=0,
        head="tied",
        top_t=6,
        choices="chain4",
    )
    lm_head = np.zeros((VOCAB, HIDDEN))
    lm_head[[3, 9, 17], 0] = 1.0  # three tokens tie at the top, the rest tie at 0
    twin = TorchMedusaDrafter(
        config,
        {},
        lm_head=torch.as_tensor(lm_head, device=DEVICE),
        dtype=torch.float64,
        device=DEVICE,
    )
    hidden = torch.zeros(1, HIDDEN, dtype=torch.float64, device=DEVICE)
    hidden[0, 0] = 1.0
    draft = twin.propose(DraftContext(root_tokens=torch.tensor([0], device=DEVICE), hidden=hidden))
    assert draft.head_tokens[0, 0].tolist() == [3, 9, 17, 0, 1, 2], (
        "Medusa top-T ties must go to the lower id"
    )


@pytest.mark.parametrize("head", ["full", "tied"])
@pytest.mark.parametrize("sample", [False, True])
def test_redrafter_shortlist_matches_reference(head, sample):
    """A shortlisted ReDrafter (the head runs on S rows only) equals the reference's masked head."""
    config = RedrafterConfig(vocab_size=VOCAB, hidden_size=HIDDEN, head=head, shortlist_size=9)
    reference, twin = _redrafter_pair(
        config, 3, "float64", beam_width=4, beam_length=4, sample=sample
    )
    rng = np.random.default_rng(3)
    hidden, roots = rng.normal(size=(3, HIDDEN)), np.array([0, 7, 23])
    fields = (
        dict(sampling=SamplingConfig(temperature=0.9), uniforms=rng.random((3, 4, 4)))
        if sample
        else {}
    )
    expected = reference.propose(
        DraftContext(root_tokens=roots, hidden=hidden, want_draft_probs=True, **fields)
    )
    got = twin.propose(
        DraftContext(
            root_tokens=torch.as_tensor(roots, device=DEVICE),
            hidden=torch.as_tensor(hidden, device=DEVICE),
            want_draft_probs=True,
            **fields,
        )
    )
    assert np.array_equal(got.beams.cpu().numpy(), expected.beams), (
        f"shortlisted beams differ ({head}, {sample})"
    )
    assert np.allclose(got.draft_probs.cpu().numpy(), expected.draft_probs, rtol=1e-9, atol=1e-12)
