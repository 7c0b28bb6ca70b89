"""Prefix trees, Medusa trees and verifiers of the mlx backend against the float64 reference.

Trees are integer data and must be identical. Verdicts must be identical for the same logits
and uniforms; near-ties are assumed away by construction: logits lie on a grid 0.05 apart, and
an example is used only when the reference's verdict does not change with every uniform moved
by +-1e-4 (far above float32's error on probabilities of order 1).
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

from specdec.plugins.registry import default_registry  # noqa: E402
from specdec.reference.tree import build_prefix_tree, check_tree  # noqa: E402
from specdec.testing import checks, strategies  # noqa: E402
from specdec.testing.sampling import boundary_uniforms  # noqa: E402
from specdec.types import Draft, DraftTree, SamplingConfig, TargetOutput  # noqa: E402
from specdec_medusa.choices import PRESETS  # noqa: E402
from specdec_mlx import ops  # noqa: E402
from specdec_mlx.backend import MlxBackend  # noqa: E402
from specdec_mlx.tree import PrefixTreeBuilder  # noqa: E402

VOCAB = 8
EPSILON = 1e-4
VERIFIERS = ("greedy", "exact", "rejection", "redrafter_published", "typical")


def as_draft(beams: np.ndarray, draft_probs=None, sampled=False) -> Draft:
    return Draft(
        root_tokens=beams[:, 0, 0].copy(), beams=beams, draft_probs=draft_probs, sampled=sampled
    )


@given(beams=strategies.beams(max_batch=3, max_width=4, max_length=5))
def test_prefix_tree_is_the_reference_tree(beams):
    checks.check_tree_builder("mlx", None, drafts=[as_draft(beams)])


@given(data=st.data(), beams=strategies.beams(max_batch=3, max_width=4, max_length=6))
def test_prefix_tree_of_beams_of_different_lengths_is_the_reference_tree(data, beams):
    lengths = data.draw(strategies.beam_lengths(beams.shape))
    draft = Draft(root_tokens=beams[:, 0, 0].copy(), beams=beams, beam_lengths=lengths)
    checks.check_tree_builder("mlx", None, drafts=[draft])
    assert PrefixTreeBuilder().build(draft).max_depth == int(lengths.max()) - 1


@given(beams=strategies.beams(max_batch=2, max_width=4, max_length=4))
def test_static_size_pads_the_reference_tree(beams):
    """static_size=True: the reference's real nodes, then valid padding up to 1 + W (L - 1)."""
    backend = MlxBackend()
    expected = build_prefix_tree(beams)
    tree = PrefixTreeBuilder(static_size=True).build(as_draft(beams))
    batch, width, length = beams.shape
    assert tree.size == 1 + width * (length - 1), f"static tree size for beams {beams.shape}"
    host = {
        name: backend.to_numpy(getattr(tree, name))
        for name in ("tokens", "parents", "depth", "num_nodes", "ancestor_mask", "beam_to_node")
    }
    n = expected.size
    for name in ("tokens", "parents", "depth"):
        np.testing.assert_array_equal(
            host[name][:, :n], getattr(expected, name), err_msg=f"static_size {name}"
        )
    np.testing.assert_array_equal(host["ancestor_mask"][:, :n, :n], expected.ancestor_mask)
    np.testing.assert_array_equal(host["beam_to_node"], expected.beam_to_node)
    check_tree(DraftTree(**host), beams=beams)


@pytest.mark.parametrize("choices", sorted(PRESETS))
def test_medusa_tree_is_the_reference_tree(choices):
    rng = np.random.default_rng(0)
    heads = max(len(path) for path in PRESETS[choices])
    ranks = 1 + max(max(path) for path in PRESETS[choices])
    head_tokens = np.stack(
        [np.stack([rng.permutation(VOCAB)[:ranks] for _ in range(heads)]) for _ in range(2)]
    )
    draft = Draft(root_tokens=np.array([1, 2]), head_tokens=head_tokens.astype(np.int64))
    checks.check_tree_builder(
        "mlx", None, name="medusa_tree", options={"choices": choices}, drafts=[draft]
    )


@st.composite
def verification_worlds(draw):
    """A prefix tree from beams, grid logits without ties, draft probabilities, sampling,
    uniforms."""
    beams = draw(strategies.beams(max_batch=3, max_width=3, max_length=4, alphabet=4))
    assume(beams.shape[2] >= 2)
    tree = build_prefix_tree(beams)
    batch, width, length = beams.shape
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    logits = np.stack([rng.permutation(VOCAB) for _ in range(batch * tree.size)]).reshape(
        batch, tree.size, VOCAB
    )
    logits = logits * draw(st.sampled_from([0.05, 0.4, 1.5]))  # values on a grid, distinct per row
    draft_probs = rng.dirichlet(np.ones(VOCAB), size=(batch, width, length - 1))
    sampling = draw(strategies.sampling_configs())
    uniforms = None if sampling.greedy else rng.random((batch, length, width + 1))
    return tree, beams, logits, draft_probs, sampling, uniforms


def reference_verdict(name, tree, draft, logits, sampling, uniforms):
    verifier = default_registry().get("verifier", name, "numpy").factory()
    target = TargetOutput(logits=logits, hidden=np.zeros(logits.shape[:2] + (1,)))
    verdict = verifier.verify(tree, draft, target, sampling, uniforms)
    return tuple(
        np.asarray(getattr(verdict, f)).tobytes() for f in ("path", "num_accepted", "bonus_tokens")
    )


@pytest.mark.parametrize("name", VERIFIERS)
@given(world=verification_worlds())
def test_verifier_matches_reference(name, world):
    tree, beams, logits, draft_probs, sampling, uniforms = world
    draft = as_draft(beams, draft_probs, sampled=name == "rejection")
    if uniforms is not None:  # the reference's verdict must not hinge on a uniform within EPSILON
        verdicts = {
            reference_verdict(
                name, tree, draft, logits, sampling, np.clip(uniforms + shift, 0.0, 1 - 1e-12)
            )
            for shift in (-EPSILON, 0.0, EPSILON)
        }
        assume(len(verdicts) == 1)
    checks.check_verifier(
        "mlx",
        None,
        name=name,
        tree=tree,
        draft=draft,
        logits=logits,
        sampling=sampling,
        uniforms=uniforms,
    )


@pytest.mark.parametrize("name", ["exact", "rejection"])
@given(world=verification_worlds(), seed=st.integers(0, 2**32 - 1))
def test_lossless_verifiers_match_reference_near_their_decision_boundaries(name, world, seed):
    """Uniforms from ``specdec.testing.sampling.boundary_uniforms`` (chosen, not filtered): about
    half of the reference's coins and draws within 5% of their boundary, none within EPSILON, so
    an acceptance probability or cumulative sum a few percent off gives another verdict."""
    tree, beams, logits, draft_probs, sampling, uniforms = world
    assume(uniforms is not None)
    draft = as_draft(beams, draft_probs, sampled=name == "rejection")
    reference = default_registry().get("verifier", name, "numpy").factory()
    chosen = boundary_uniforms(
        reference, tree, draft, logits, sampling, rng=np.random.default_rng(seed), margin=EPSILON
    )
    checks.check_verifier(
        "mlx",
        None,
        name=name,
        tree=tree,
        draft=draft,
        logits=logits,
        sampling=sampling,
        uniforms=chosen,
    )


@pytest.mark.parametrize("name", ["exact", "rejection"])
def test_lossless_verifiers_match_reference_near_their_boundaries_on_a_fixed_batch(name):
    """256 rows of one fixed seed: 3 beams of 3 drafted tokens drawn from their draft
    probabilities, grid logits (0.4 apart, distinct per row), temperature 0.9."""
    rng = np.random.default_rng(21)
    batch, width, length = 256, 3, 4
    draft_probs = rng.dirichlet(np.ones(VOCAB), size=(batch, width, length - 1))
    beams = np.zeros((batch, width, length), dtype=np.int64)
    beams[:, :, 0] = 1
    for d in range(length - 1):
        cdf = np.cumsum(draft_probs[:, :, d], axis=-1)
        beams[:, :, d + 1] = np.minimum((cdf < rng.random((batch, width, 1))).sum(-1), VOCAB - 1)
    tree = build_prefix_tree(beams)
    logits = 0.4 * np.stack([rng.permutation(VOCAB) for _ in range(batch * tree.size)]).reshape(
        batch, tree.size, VOCAB
    )
    draft = as_draft(beams, draft_probs, sampled=name == "rejection")
    sampling = SamplingConfig(temperature=0.9)
    reference = default_registry().get("verifier", name, "numpy").factory()
    uniforms = boundary_uniforms(reference, tree, draft, logits, sampling, rng=rng, margin=EPSILON)
    checks.check_verifier(
        "mlx",
        None,
        name=name,
        tree=tree,
        draft=draft,
        logits=logits,
        sampling=sampling,
        uniforms=uniforms,
    )


def test_rejection_verifier_refuses_deterministic_drafts():
    from specdec.errors import InvalidInputError

    beams = np.array([[[1, 2, 3], [1, 4, 5]]])
    tree = PrefixTreeBuilder().build(as_draft(beams))
    verifier = default_registry().get("verifier", "rejection", "mlx").factory()
    logits = mx.zeros((1, tree.size, VOCAB))
    with pytest.raises(InvalidInputError, match="Draft.sampled=True"):
        verifier.verify(
            tree,
            as_draft(beams, np.full((1, 2, 2, VOCAB), 1 / VOCAB)),
            TargetOutput(logits=logits, hidden=logits),
            SamplingConfig(temperature=1.0),
            None,
        )


@given(
    seed=st.integers(0, 2**32 - 1),
    sampling=strategies.sampling_configs(),
    top=st.integers(1, VOCAB),
)
def test_sampling_primitives_match_reference(seed, sampling, top):
    """target_probs (float32 vs float64), sample_from, top_indices and top_k_mask with heavy
    ties."""
    from specdec.reference.sampling import sample_from, target_probs

    rng = np.random.default_rng(seed)
    logits = rng.integers(-3, 3, size=(4, VOCAB)).astype(np.float64)  # many exact ties
    expected = target_probs(logits, sampling)
    probs = np.array(ops.target_probs(mx.array(logits.astype(np.float32)), sampling))
    np.testing.assert_allclose(
        probs,
        expected,
        **checks.FLOAT32,
        err_msg=f"ops.target_probs({logits.tolist()}, {sampling})",
    )
    uniforms = rng.random(4)
    cdf = np.cumsum(expected, axis=-1)
    assume(np.all(np.abs(cdf - uniforms[:, None] * cdf[:, -1:]) > EPSILON))
    np.testing.assert_array_equal(
        np.array(ops.sample_from(mx.array(expected.astype(np.float32)), mx.array(uniforms))),
        sample_from(expected, uniforms),
        err_msg=f"ops.sample_from u={uniforms}",
    )
    order = np.argsort(-logits, axis=-1, kind="stable")
    np.testing.assert_array_equal(
        np.array(ops.top_indices(mx.array(logits), top)),
        order[:, :top],
        err_msg=f"ops.top_indices({logits.tolist()}, {top})",
    )
    rank = np.argsort(order, axis=-1)
    np.testing.assert_array_equal(
        np.array(ops.top_k_mask(mx.array(logits), top)),
        rank < top,
        err_msg=f"ops.top_k_mask({logits.tolist()}, {top})",
    )
    np.testing.assert_array_equal(
        np.array(ops.stable_descending_order(mx.array(logits))),
        order,
        err_msg=f"ops.stable_descending_order({logits.tolist()})",
    )
