"""Torch tree builders, tie-breaking top-k and verifiers against the float64 reference.

Same inputs (beams, head tokens, logits, uniforms) -> identical trees and verdicts.
"""

from __future__ import annotations

import os
from types import SimpleNamespace

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

torch = pytest.importorskip("torch")  # required when SPECDEC_TEST_BACKENDS names torch (conftest)

from specdec.plugins.registry import default_registry
from specdec.reference.sampling import sample_from, target_probs
from specdec.reference.tree import build_prefix_tree, check_tree
from specdec.testing import checks
from specdec.testing.strategies import beam_lengths
from specdec.testing.strategies import beams as beams_strategy
from specdec.testing.sampling import boundary_uniforms
from specdec.testing.strategies import sampling_configs
from specdec.types import Draft, DraftTree, SamplingConfig
from specdec_medusa.choices import PRESETS
from specdec_torch import sampling as torch_sampling
from specdec_torch.backend import TorchBackend
from specdec_torch.tree import build_prefix_tree as torch_prefix_tree

DEVICE = os.environ.get("SPECDEC_TORCH_DEVICE", "cpu")
TARGET = SimpleNamespace(device=torch.device(DEVICE))  # where from_numpy puts arrays
BACKEND = TorchBackend()
TREE_FIELDS = ("tokens", "parents", "depth", "ancestor_mask", "num_nodes", "beam_to_node")


def _tensor(array):
    return BACKEND.from_numpy(np.asarray(array), TARGET)


# ------------------------------------------------------------------------------------------
# Ties and sampling


@given(data=st.data(), rows=st.integers(1, 3), columns=st.integers(1, 40))
def test_top_k_lowest_index_breaks_ties_like_a_stable_argsort(data, rows, columns):
    """Values from a five-element set (-inf included): ties everywhere."""
    values = data.draw(
        st.lists(
            st.sampled_from([-np.inf, -1.0, 0.0, 0.5, 2.0]),
            min_size=rows * columns,
            max_size=rows * columns,
        )
    )
    array = np.array(values, dtype=np.float64).reshape(rows, columns)
    k = data.draw(st.integers(1, columns))
    expected = np.argsort(-array, axis=1, kind="stable")[:, :k]
    got_values, got = torch_sampling.top_k_lowest_index(_tensor(array), k)
    assert np.array_equal(BACKEND.to_numpy(got), expected), (
        f"top_k_lowest_index(k={k}) on {array.tolist()}"
    )
    assert np.array_equal(BACKEND.to_numpy(got_values), np.take_along_axis(array, expected, axis=1))


@given(sampling=sampling_configs(), seed=st.integers(0, 2**16), vocab=st.integers(2, 12))
def test_target_probs_and_sample_from_match_reference(sampling, seed, vocab):
    rng = np.random.default_rng(seed)
    logits = np.round(rng.normal(0, 2, size=(3, vocab)), 1)  # rounded: ties occur
    uniforms = rng.random(3)
    expected = target_probs(logits, sampling)
    got = BACKEND.to_numpy(torch_sampling.target_probs(_tensor(logits), sampling))
    assert np.allclose(got, expected, rtol=1e-12, atol=1e-12), (
        f"target_probs({sampling}) on {logits.tolist()}"
    )
    tokens = BACKEND.to_numpy(torch_sampling.sample_from(_tensor(expected), _tensor(uniforms)))
    assert np.array_equal(tokens, sample_from(expected, uniforms)), (
        f"sample_from with {sampling}, u={uniforms}"
    )


# ------------------------------------------------------------------------------------------
# Tree builders


@settings(max_examples=60)
@given(beams=beams_strategy(max_batch=3, max_width=5, max_length=5, alphabet=3))
def test_prefix_tree_matches_reference(beams):
    draft = Draft(root_tokens=beams[:, 0, 0].copy(), beams=beams)
    checks.check_tree_builder("torch", TARGET, name="prefix_tree", drafts=[draft])
    tree = torch_prefix_tree(_tensor(beams))
    check_tree(
        DraftTree(**{field: BACKEND.to_numpy(getattr(tree, field)) for field in TREE_FIELDS}),
        beams=beams,
    )


@settings(max_examples=60)
@given(data=st.data(), beams=beams_strategy(max_batch=3, max_width=5, max_length=6, alphabet=3))
def test_prefix_tree_of_beams_of_different_lengths_matches_reference(data, beams):
    lengths = data.draw(beam_lengths(beams.shape))
    draft = Draft(root_tokens=beams[:, 0, 0].copy(), beams=beams, beam_lengths=lengths)
    checks.check_tree_builder("torch", TARGET, name="prefix_tree", drafts=[draft])


@pytest.mark.parametrize("choices", sorted(PRESETS))
def test_medusa_static_tree_matches_reference(choices):
    rng = np.random.default_rng(0)
    drafts = [
        Draft(
            root_tokens=rng.integers(0, 50, size=batch),
            head_tokens=rng.integers(0, 50, size=(batch, 4, 8)),
        )
        for batch in (1, 3)
    ]
    checks.check_tree_builder(
        "torch", TARGET, name="medusa_tree", options={"choices": choices}, drafts=drafts
    )


# ------------------------------------------------------------------------------------------
# Verifiers


@st.composite
def verifier_inputs(draw, *, sampled: bool = False):
    """A prefix tree over small-alphabet beams, logits with clear argmax margins, draft
    probabilities (with zeros), and uniforms, all from one seed."""
    beams = draw(beams_strategy(max_batch=3, max_width=4, max_length=5, alphabet=3))
    seed = draw(st.integers(0, 2**16))
    rng = np.random.default_rng(seed)
    vocab = 5
    batch, width, length = beams.shape
    tree = build_prefix_tree(beams)
    logits = rng.normal(0, 1.5, size=(batch, tree.size, vocab))
    ordered = np.sort(logits, axis=-1)
    assume(np.all(ordered[..., -1] - ordered[..., -2] > 1e-6))  # argmax without near-ties
    draft_probs = rng.dirichlet(np.ones(vocab), size=(batch, width, max(length - 1, 1)))[
        :, :, : length - 1
    ]
    draft_probs = np.where(rng.random(draft_probs.shape) < 0.2, 0.0, draft_probs)
    draft_probs = draft_probs / np.maximum(draft_probs.sum(-1, keepdims=True), 1e-300)
    draft_probs = draft_probs if length > 1 else np.zeros((batch, width, 0, vocab))
    uniforms = rng.random((batch, length, width + 1))
    draft = Draft(
        root_tokens=beams[:, 0, 0].copy(), beams=beams, draft_probs=draft_probs, sampled=sampled
    )
    return tree, draft, logits, uniforms


@settings(max_examples=40)
@given(
    inputs=verifier_inputs(),
    sampling=sampling_configs(),
    name=st.sampled_from(["greedy", "exact", "redrafter_published", "typical"]),
)
def test_verifiers_match_reference(inputs, sampling, name):
    tree, draft, logits, uniforms = inputs
    assume(draft.beams.shape[2] > 1 or name != "redrafter_published")
    checks.check_verifier(
        "torch",
        TARGET,
        name=name,
        tree=tree,
        draft=draft,
        logits=logits,
        sampling=sampling,
        uniforms=None if sampling.greedy else uniforms,
    )


@settings(max_examples=40)
@given(inputs=verifier_inputs(sampled=True), sampling=sampling_configs())
def test_rejection_verifier_matches_reference(inputs, sampling):
    tree, draft, logits, uniforms = inputs
    assume(draft.beams.shape[2] > 1)
    checks.check_verifier(
        "torch",
        TARGET,
        name="rejection",
        tree=tree,
        draft=draft,
        logits=logits,
        sampling=sampling,
        uniforms=None if sampling.greedy else uniforms,
    )


LOSSLESS = ("exact", "rejection")


@settings(max_examples=40)
@given(
    inputs=verifier_inputs(sampled=True),
    sampling=sampling_configs(greedy=False),
    name=st.sampled_from(LOSSLESS),
    seed=st.integers(0, 2**16),
)
def test_lossless_verifiers_match_reference_near_their_decision_boundaries(
    inputs, sampling, name, seed
):
    """Uniforms from ``specdec.testing.sampling.boundary_uniforms``: about half of the reference's
    coins and draws fall within 5% of their boundary (never within 1e-4 of it), so a verifier whose
    acceptance probabilities or cumulative sums are off by a few percent gives other verdicts."""
    tree, draft, logits, _ = inputs
    assume(draft.beams.shape[2] > 1)
    reference = default_registry().get("verifier", name, "numpy").factory()
    uniforms = boundary_uniforms(
        reference, tree, draft, logits, sampling, rng=np.random.default_rng(seed)
    )
    checks.check_verifier(
        "torch",
        TARGET,
        name=name,
        tree=tree,
        draft=draft,
        logits=logits,
        sampling=sampling,
        uniforms=uniforms,
    )


@pytest.mark.parametrize("name", LOSSLESS)
def test_lossless_verifiers_match_reference_near_their_boundaries_on_a_fixed_batch(name):
    """256 rows of one fixed seed: 3 beams of 3 drafted tokens drawn from their draft
    probabilities over 6 tokens, target logits of spread 1.5, temperature 0.9."""
    rng = np.random.default_rng(20)
    batch, width, length, vocab = 256, 3, 4, 6
    draft_probs = rng.dirichlet(np.ones(vocab), size=(batch, width, length - 1))
    beams = np.zeros((batch, width, length), dtype=np.int64)
    beams[:, :, 0] = 1
    for d in range(length - 1):
        cdf = np.cumsum(draft_probs[:, :, d], axis=-1)
        beams[:, :, d + 1] = np.minimum((cdf < rng.random((batch, width, 1))).sum(-1), vocab - 1)
    tree = build_prefix_tree(beams)
    logits = rng.normal(0, 1.5, size=(batch, tree.size, vocab))
    draft = Draft(
        root_tokens=beams[:, 0, 0].copy(), beams=beams, draft_probs=draft_probs, sampled=True
    )
    sampling = SamplingConfig(temperature=0.9)
    reference = default_registry().get("verifier", name, "numpy").factory()
    uniforms = boundary_uniforms(reference, tree, draft, logits, sampling, rng=rng)
    checks.check_verifier(
        "torch",
        TARGET,
        name=name,
        tree=tree,
        draft=draft,
        logits=logits,
        sampling=sampling,
        uniforms=uniforms,
    )


@settings(max_examples=20)
@given(
    seed=st.integers(0, 2**16),
    sampling=sampling_configs(),
    name=st.sampled_from(["greedy", "exact", "typical"]),
    choices=st.sampled_from(sorted(PRESETS)),
)
def test_verifiers_on_medusa_trees_match_reference(seed, sampling, name, choices):
    from specdec_medusa.tree import StaticTreeBuilder

    rng = np.random.default_rng(seed)
    batch, vocab = 2, 6
    head_tokens = np.stack(
        [np.stack([rng.permutation(vocab) for _ in range(4)]) for _ in range(batch)]
    )
    draft = Draft(root_tokens=rng.integers(0, vocab, size=batch), head_tokens=head_tokens)
    tree = StaticTreeBuilder(choices).build(draft)
    logits = rng.normal(0, 1.5, size=(batch, tree.size, vocab))
    ordered = np.sort(logits, axis=-1)
    assume(np.all(ordered[..., -1] - ordered[..., -2] > 1e-6))
    uniforms = rng.random((batch, 5, 1))
    checks.check_verifier(
        "torch",
        TARGET,
        name=name,
        tree=tree,
        draft=draft,
        logits=logits,
        sampling=sampling,
        uniforms=None if sampling.greedy else uniforms,
    )


def test_verifier_needs_uniforms_when_sampling():
    from specdec.errors import InvalidInputError
    from specdec.types import SamplingConfig, TargetOutput
    from specdec_torch.verify import ExactTreeVerifier

    beams = np.array([[[1, 2, 3]]])
    tree = checks.to_backend_tree(build_prefix_tree(beams), BACKEND, TARGET)
    draft = Draft(root_tokens=_tensor(beams[:, 0, 0]), beams=_tensor(beams))
    output = TargetOutput(logits=torch.zeros(1, 3, 5), hidden=torch.zeros(1, 3, 2))
    with pytest.raises(InvalidInputError, match="uniforms"):
        ExactTreeVerifier().verify(tree, draft, output, SamplingConfig(temperature=1.0), None)
