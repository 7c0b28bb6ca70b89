"""Medusa reference: heads, top-T proposals, the static tree from choices, checkpoints."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from specdec.models.checkpoints import check_compatible as core_check_compatible
from hypothesis import given, settings
from hypothesis import strategies as st

from specdec.protocols import Drafter, TreeBuilder
from specdec.reference.tree import check_tree
from specdec.types import Draft, DraftContext
from specdec_medusa.checkpoint import load_medusa_checkpoint, make_random_medusa, save_medusa
from specdec_medusa.choices import PRESETS, resolve_choices
from specdec_medusa.config import MedusaConfig
from specdec_medusa.reference import MedusaDrafter, head_logits, init_random_weights
from specdec_medusa.tree import StaticTreeBuilder, choices_to_parents

# --------------------------------------------------------------------------- the static tree


def hand_head_tokens(batch: int, num_heads: int, top_t: int) -> np.ndarray:
    """head_tokens[b, k, t] = 100 b + 10 k + t + 1: every entry names its own position."""
    b, k, t = np.meshgrid(np.arange(batch), np.arange(num_heads), np.arange(top_t), indexing="ij")
    return (100 * b + 10 * k + t + 1).astype(np.int64)


def test_tree_from_hand_written_choices():
    choices = [(1,), (0, 0, 0), (0,), (1, 0), (0, 1), (0, 0)]  # deliberately unordered
    draft = Draft(root_tokens=np.array([7, 8]), head_tokens=hand_head_tokens(2, 3, 2))
    tree = StaticTreeBuilder(choices).build(draft)
    # Node order: root, (0,), (1,), (0, 0), (0, 1), (1, 0), (0, 0, 0).
    expected_tokens = np.array([[7, 1, 2, 11, 12, 11, 21], [8, 101, 102, 111, 112, 111, 121]])
    expected_mask = np.array(
        [
            [1, 0, 0, 0, 0, 0, 0],
            [1, 1, 0, 0, 0, 0, 0],
            [1, 0, 1, 0, 0, 0, 0],
            [1, 1, 0, 1, 0, 0, 0],
            [1, 1, 0, 0, 1, 0, 0],
            [1, 0, 1, 0, 0, 1, 0],
            [1, 1, 0, 1, 0, 0, 1],
        ],
        dtype=bool,
    )
    assert np.array_equal(tree.tokens, expected_tokens), (
        f"StaticTreeBuilder({choices}).tokens = {tree.tokens}"
    )
    for b in range(2):
        assert tree.parents[b].tolist() == [-1, 0, 0, 1, 1, 2, 3], (
            f"StaticTreeBuilder({choices}).parents[{b}]"
        )
        assert tree.depth[b].tolist() == [0, 1, 1, 2, 2, 2, 3], (
            f"StaticTreeBuilder({choices}).depth[{b}]"
        )
        assert np.array_equal(tree.ancestor_mask[b], expected_mask), (
            f"StaticTreeBuilder({choices}).ancestor_mask[{b}]"
        )
    assert tree.num_nodes.tolist() == [7, 7] and tree.beam_to_node is None, (
        "StaticTreeBuilder num_nodes / beam_to_node"
    )
    assert choices_to_parents(choices).tolist() == [-1, 0, 0, 1, 1, 2, 3], (
        f"choices_to_parents({choices})"
    )
    assert tree.tokens.dtype == np.int64 and tree.ancestor_mask.dtype == bool, (
        "StaticTreeBuilder dtypes"
    )


@st.composite
def prefix_closed_choices(draw, max_heads=4, max_top_t=4):
    """A random prefix-closed choice set, listed in a random order, with its K and T."""
    num_heads = draw(st.integers(1, max_heads))
    top_t = draw(st.integers(1, max_top_t))
    picks = draw(
        st.lists(st.tuples(st.integers(0, 100), st.integers(0, top_t - 1)), min_size=4, max_size=14)
    )
    paths: list[tuple[int, ...]] = [()]
    for pick, rank in picks:
        parent = paths[pick % len(paths)]
        child = parent + (rank,)
        if len(child) <= num_heads and child not in paths:
            paths.append(child)
    return draw(st.permutations(paths[1:])), num_heads, top_t


@settings(derandomize=True, deadline=None, max_examples=40)
@given(prefix_closed_choices(), st.integers(1, 3))
def test_tree_ancestors_are_path_prefixes(case, batch):
    choices, num_heads, top_t = case
    head_tokens = hand_head_tokens(batch, num_heads, top_t)
    root_tokens = np.arange(batch, dtype=np.int64) + 1000
    tree = StaticTreeBuilder(choices).build(Draft(root_tokens=root_tokens, head_tokens=head_tokens))
    n = len(choices) + 1
    assert tree.tokens.shape == (batch, n), f"StaticTreeBuilder({choices}) size"
    # Recover each node's path from the builder's own order, then check it against the definition.
    node_paths = [()] + sorted(choices, key=lambda c: (len(c), c))
    for b in range(batch):
        assert tree.tokens[b, 0] == root_tokens[b], (
            f"StaticTreeBuilder({choices}) root token, row {b}"
        )
        for i, path in enumerate(node_paths):
            ancestors = {node_paths[j] for j in np.flatnonzero(tree.ancestor_mask[b, i])}
            prefixes = {path[:end] for end in range(len(path) + 1)}
            assert ancestors == prefixes, (
                f"StaticTreeBuilder({choices}) node {path}: ancestors {ancestors}"
            )
            assert tree.depth[b, i] == len(path), f"StaticTreeBuilder({choices}) depth of {path}"
            if i > 0:
                assert node_paths[tree.parents[b, i]] == path[:-1], (
                    f"StaticTreeBuilder({choices}) parent of {path}"
                )
                assert tree.parents[b, i] < i, (
                    f"StaticTreeBuilder({choices}) parent order at {path}"
                )
                assert tree.tokens[b, i] == head_tokens[b, len(path) - 1, path[-1]], (
                    f"StaticTreeBuilder({choices}) token of {path}, row {b}"
                )
    check_tree(tree)  # the core invariants (parents before children, mask implied by parents, ...)


@pytest.mark.parametrize(
    "choices, message",
    [
        ([(0,), (0,)], r"\(0,\) is listed twice"),
        ([(0,), (1, 0)], r"\(1, 0\) needs its prefix \(1,\)"),
        ([(0,), (0, 0), (0, 0, 0, 0)], r"\(0, 0, 0, 0\) needs its prefix \(0, 0, 0\)"),
        ([()], "empty"),
        ([(0, -1)], "non-negative integer"),
        ([(0,), (0.5,)], "non-negative integer"),
        ([0, 1], "not a sequence"),
        ("no-such-preset", "chain4"),
    ],
)
def test_invalid_choices_are_rejected(choices, message):
    with pytest.raises(ValueError, match=message):
        StaticTreeBuilder(choices)


def test_choices_must_fit_heads_and_top_t():
    with pytest.raises(
        ValueError, match=r"\(0, 0, 0\) has depth 3 but the drafter has only 2 heads"
    ):
        resolve_choices([(0,), (0, 0), (0, 0, 0)], num_heads=2)
    with pytest.raises(
        ValueError, match=r"\(2,\) uses rank 2 but each head proposes only its top 2"
    ):
        resolve_choices([(0,), (2,)], top_t=2)
    with pytest.raises(ValueError, match=r"\(0, 0, 0\) has depth 3"):
        MedusaConfig(vocab_size=10, hidden_size=4, num_heads=2, choices=[(0,), (0, 0), (0, 0, 0)])
    builder = StaticTreeBuilder([(0,), (0, 0), (0, 0, 0)])
    with pytest.raises(ValueError, match=r"\(0, 0, 0\) needs head 2"):
        builder.build(
            Draft(root_tokens=np.zeros(1, np.int64), head_tokens=hand_head_tokens(1, 2, 3))
        )
    with pytest.raises(ValueError, match="has beams"):
        builder.build(Draft(root_tokens=np.zeros(1, np.int64), beams=np.zeros((1, 1, 2), np.int64)))


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_presets_are_valid_and_sized_as_named(name):
    choices = resolve_choices(name, num_heads=4, top_t=8)
    size = int("".join(ch for ch in name if ch.isdigit()))
    assert len(choices) + 1 == size, f"preset {name!r} has {len(choices) + 1} nodes, root included"
    draft = Draft(root_tokens=np.zeros(1, np.int64), head_tokens=hand_head_tokens(1, 4, 8))
    tree = StaticTreeBuilder(name).build(draft)
    assert tree.size == size, f"StaticTreeBuilder({name!r}).build size {tree.size}"


# --------------------------------------------------------------------------- the heads


def scalar_silu(z: float) -> float:
    return z / (1.0 + math.exp(-z))


def hand_head_logits(config, weights, lm_head, hidden):
    """The Medusa head formula, one scalar at a time."""
    batch, h, v = hidden.shape[0], config.hidden_size, config.vocab_size
    out = np.zeros((batch, config.num_heads, v))
    for b in range(batch):
        for k in range(config.num_heads):
            x = [float(hidden[b, i]) for i in range(h)]
            for j in range(config.num_layers):
                w = weights[f"medusa_head.{k}.{j}.linear.weight"]
                bias = weights[f"medusa_head.{k}.{j}.linear.bias"]
                pre = [sum(w[r, c] * x[c] for c in range(h)) + bias[r] for r in range(h)]
                x = [x[r] + scalar_silu(pre[r]) for r in range(h)]
            u = (
                weights[f"medusa_head.{k}.{config.num_layers}.weight"]
                if config.head == "full"
                else lm_head
            )
            for t in range(v):
                out[b, k, t] = sum(u[t, c] * x[c] for c in range(h))
    return out


@pytest.mark.parametrize("head", ["full", "tied"])
@pytest.mark.parametrize("num_layers", [0, 1, 2])
def test_head_logits_match_the_formula(head, num_layers):
    config = MedusaConfig(
        vocab_size=5,
        hidden_size=3,
        num_heads=2,
        num_layers=num_layers,
        head=head,
        top_t=2,
        choices=[(0,), (0, 0)],
    )
    rng = np.random.default_rng(11)
    weights = init_random_weights(config, rng)
    lm_head = rng.normal(size=(5, 3))
    hidden = rng.normal(size=(2, 3))
    got = head_logits(config, weights, lm_head, hidden)
    want = hand_head_logits(config, weights, lm_head, hidden)
    assert got.shape == (2, 2, 5), (
        f"head_logits(head={head}, num_layers={num_layers}) shape {got.shape}"
    )
    np.testing.assert_allclose(
        got,
        want,
        rtol=1e-12,
        atol=1e-12,
        err_msg=f"head_logits(head={head}, num_layers={num_layers})",
    )


def test_top_t_is_best_first_with_ties_to_lower_id():
    # No blocks, a full head whose column 0 holds the logits: hidden e_0 reads them out.
    config = MedusaConfig(
        vocab_size=6, hidden_size=2, num_heads=1, num_layers=0, top_t=4, choices=[(0,)]
    )
    column = np.array([1.0, 3.0, 3.0, 0.0, 5.0, 3.0])
    weights = {"medusa_head.0.0.weight": np.stack([column, np.zeros(6)], axis=1)}
    drafter = MedusaDrafter(config, weights)
    draft = drafter.propose(DraftContext(root_tokens=np.array([9]), hidden=np.array([[1.0, 0.0]])))
    assert draft.head_tokens.tolist() == [[[4, 1, 2, 5]]], (
        f"MedusaDrafter.propose top-4 of {column}"
    )
    assert draft.head_tokens.dtype == np.int64 and draft.root_tokens.tolist() == [9], (
        "MedusaDrafter.propose output"
    )
    context = DraftContext(root_tokens=np.array([9]), hidden=np.array([[1.0, 0.0]]))
    wider = MedusaDrafter(config, weights, top_t=6).propose(context)
    assert wider.head_tokens.tolist() == [[[4, 1, 2, 5, 0, 3]]], (
        f"MedusaDrafter(top_t=6).propose of {column}"
    )


@settings(derandomize=True, deadline=None, max_examples=15)
@given(st.integers(0, 2**31 - 1), st.sampled_from(["full", "tied"]))
def test_proposal_is_the_top_t_by_logit(seed, head):
    rng = np.random.default_rng(seed)
    config = MedusaConfig(
        vocab_size=12, hidden_size=4, num_heads=3, head=head, top_t=4, choices=[(0,), (1,), (0, 0)]
    )
    weights = init_random_weights(config, rng)
    lm_head = rng.normal(size=(12, 4))
    hidden = rng.normal(size=(2, 4))
    drafter = MedusaDrafter(config, weights, lm_head=lm_head)
    draft = drafter.propose(DraftContext(root_tokens=np.array([0, 1]), hidden=hidden))
    logits = head_logits(config, weights, lm_head, hidden)
    for b in range(2):
        for k in range(3):
            chosen = draft.head_tokens[b, k]
            rest = np.setdiff1d(np.arange(12), chosen)
            assert np.all(np.diff(logits[b, k, chosen]) <= 0), (
                f"MedusaDrafter.propose order, seed {seed}, row {b}, head {k}"
            )
            assert logits[b, k, chosen[-1]] >= logits[b, k, rest].max(), (
                f"MedusaDrafter.propose set, seed {seed}"
            )


def test_drafter_and_builder_satisfy_the_protocols_and_compose():
    config = MedusaConfig(vocab_size=20, hidden_size=6, num_heads=4, top_t=8, choices="cpu16")
    rng = np.random.default_rng(3)
    drafter = MedusaDrafter(config, init_random_weights(config, rng))
    builder = StaticTreeBuilder(config.choices)
    assert isinstance(drafter, Drafter) and isinstance(builder, TreeBuilder), (
        "Medusa protocol conformance"
    )
    assert drafter.caps.tree_builder == ("medusa_tree", {"choices": "cpu16"}), (
        "MedusaDrafter.caps.tree_builder"
    )
    hidden = rng.normal(size=(1, 6))
    tree = builder.build(drafter.propose(DraftContext(root_tokens=np.array([3]), hidden=hidden)))
    order = np.argsort(
        -head_logits(config, drafter.weights, None, hidden)[0], axis=-1, kind="stable"
    )  # (K, V)
    for i, path in enumerate(builder.choices, start=1):
        assert tree.tokens[0, i] == order[len(path) - 1, path[-1]], f"cpu16 node {path} token"


def test_drafter_rejects_bad_inputs():
    config = MedusaConfig(
        vocab_size=8, hidden_size=4, num_heads=2, head="tied", top_t=2, choices=[(0,)]
    )
    weights = init_random_weights(config, np.random.default_rng(0))
    with pytest.raises(ValueError, match="needs the target's lm_head"):
        MedusaDrafter(config, weights)
    with pytest.raises(ValueError, match=r"lm_head has shape \(4, 8\)"):
        MedusaDrafter(config, weights, lm_head=np.zeros((4, 8)))
    with pytest.raises(ValueError, match="lack 1 arrays"):
        MedusaDrafter(
            config, {k: v for k, v in list(weights.items())[1:]}, lm_head=np.zeros((8, 4))
        )
    with pytest.raises(ValueError, match="hidden must have shape"):
        head_logits(config, weights, np.zeros((8, 4)), np.zeros((1, 5)))
    with pytest.raises(ValueError, match="MedusaConfig.head must be one of"):
        MedusaConfig(vocab_size=8, hidden_size=4, head="shared")


# --------------------------------------------------------------------------- config and checkpoints


@pytest.mark.parametrize("choices", ["small8", [(0,), (1,), (0, 0)]])
def test_config_json_round_trip(choices):
    config = MedusaConfig(
        vocab_size=16,
        hidden_size=8,
        num_heads=4,
        choices=choices,
        target={"name": "tiny", "fingerprint": "abc", "vocab_size": 16, "hidden_size": 8},
    )
    again = MedusaConfig.from_dict(json.loads(json.dumps(config.to_dict())))
    assert again == config, f"MedusaConfig round trip of choices={choices!r}: {again}"
    assert config.to_dict()["model_type"] == "specdec_medusa", "MedusaConfig.to_dict model_type"
    with pytest.raises(ValueError, match="unknown Medusa config keys"):
        MedusaConfig.from_dict({**config.to_dict(), "medusa_num_heads": 4})
    with pytest.raises(ValueError, match="not a Medusa drafter"):
        MedusaConfig.from_dict({**config.to_dict(), "model_type": "specdec_redrafter"})


@pytest.mark.parametrize("head", ["full", "tied"])
def test_checkpoint_round_trip(tmp_path, head):
    config = MedusaConfig(
        vocab_size=10,
        hidden_size=4,
        num_heads=2,
        num_layers=2,
        head=head,
        top_t=3,
        choices=[(0,), (1,), (0, 0)],
        target={"name": "tiny"},
    )
    weights = init_random_weights(config, np.random.default_rng(5))
    save_medusa(tmp_path / "medusa", config, weights)
    loaded_config, loaded = load_medusa_checkpoint(tmp_path / "medusa")
    assert loaded_config == config, f"load_medusa_checkpoint config ({head}): {loaded_config}"
    assert sorted(loaded) == sorted(weights), f"load_medusa_checkpoint names ({head})"
    for name, array in weights.items():
        assert loaded[name].dtype == np.float64, f"load_medusa_checkpoint dtype of {name}"
        stored = array.astype(np.float32).astype(np.float64)
        assert np.array_equal(loaded[name], stored), f"load_medusa_checkpoint {name} ({head})"


def check_compatible(config, **kwargs):
    core_check_compatible(config, drafter="Medusa", **kwargs)


def test_check_compatible_names_both_models():
    config = MedusaConfig(
        vocab_size=10,
        hidden_size=4,
        num_heads=1,
        choices=[(0,)],
        target={"name": "tiny-a", "fingerprint": "f-a"},
    )
    check_compatible(config, vocab_size=10, hidden_size=4, fingerprint="f-a", name="renamed-folder")
    with pytest.raises(
        ValueError,
        match=r"trained for another model: 'tiny-a' \(vocab_size 10, hidden_size 4\), "
        r"but the target is 'tiny-b' \(vocab_size 12, hidden_size 4\)",
    ):
        check_compatible(config, vocab_size=12, hidden_size=4, name="tiny-b")
    with pytest.raises(ValueError, match="fingerprint 'f-a', the target's is 'f-b'"):
        check_compatible(config, vocab_size=10, hidden_size=4, fingerprint="f-b")
    unnamed = MedusaConfig(vocab_size=10, hidden_size=4, num_heads=1, choices=[(0,)])
    check_compatible(
        config, vocab_size=10, hidden_size=4, name="tiny-b"
    )  # names alone only label the models
    with pytest.raises(
        ValueError, match=r"another model: an unnamed model \(vocab_size 10, hidden_size 4\)"
    ):
        check_compatible(unnamed, vocab_size=10, hidden_size=8)


def test_make_random_medusa(tmp_path):
    model = tmp_path / "tiny-llama"
    model.mkdir()
    (model / "config.json").write_text(
        json.dumps({"hidden_size": 8, "vocab_size": 32, "model_type": "llama"})
    )
    first = make_random_medusa(tmp_path / "a", model, seed=1, num_heads=3, choices=[(0,), (0, 0)])
    second = make_random_medusa(tmp_path / "b", model, seed=1, num_heads=3, choices=[(0,), (0, 0)])
    config, weights = load_medusa_checkpoint(first)
    _, weights_again = load_medusa_checkpoint(second)
    sizes = (config.vocab_size, config.hidden_size, config.num_heads)
    assert sizes == (32, 8, 3), f"make_random_medusa config {config}"
    assert config.target["name"] == "tiny-llama", f"make_random_medusa target {config.target}"
    assert all(np.array_equal(weights[n], weights_again[n]) for n in weights), (
        "make_random_medusa is seeded"
    )
    check_compatible(config, vocab_size=32, hidden_size=8, name="tiny-llama")
    with pytest.raises(ValueError, match="has no config.json"):
        make_random_medusa(tmp_path / "c", tmp_path / "nowhere", seed=0)
