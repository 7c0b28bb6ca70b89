"""Dynamic tree attention: golden vectors from ReDrafter's docs and unit tests, and properties."""

from __future__ import annotations

import attrs
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from specdec.protocols import TreeBuilder
from specdec.reference.tree import (
    PrefixTreeBuilder,
    ancestor_mask_from_parents,
    build_prefix_tree,
    check_tree,
    depth_from_parents,
)
from specdec.types import Draft

DOCS_BEAMS = np.array([[[101, 102, 103, 104], [101, 102, 203, 204], [101, 102, 303, 104]]])

TWO_ROW_BEAMS = np.array(
    [
        [[91, 92, 93, 95], [91, 92, 94, 96], [91, 92, 93, 97]],
        [[93, 94, 95, 92], [93, 95, 96, 93], [93, 94, 97, 96]],
    ]
)


def rows(text: str) -> np.ndarray:
    """'1000 0000 / 1100 0000' -> bool matrix."""
    return np.array([[c == "1" for c in row.replace(" ", "")] for row in text.split("/")])


def test_docs_example_packs_12_tokens_into_8():
    tree = build_prefix_tree(DOCS_BEAMS)
    check_tree(tree, beams=DOCS_BEAMS)
    assert tree.tokens.tolist() == [[101, 102, 103, 104, 203, 204, 303, 104]], (
        "build_prefix_tree(docs example) tokens"
    )
    assert tree.num_nodes.tolist() == [8], "build_prefix_tree(docs example) num_nodes"
    assert tree.beam_to_node.tolist() == [[[0, 1, 2, 3], [0, 1, 4, 5], [0, 1, 6, 7]]], (
        "docs example unpacker"
    )
    assert tree.depth.tolist() == [[0, 1, 2, 3, 2, 3, 2, 3]], "docs example position offsets"
    assert tree.parents.tolist() == [[-1, 0, 1, 2, 1, 4, 1, 6]], "docs example parents"
    expected_mask = rows(
        "1000 0000 / 1100 0000 / 1110 0000 / 1111 0000 / 1100 1000 / 1100 1100 / 1100 0010 / "
        "1100 0011"
    )
    np.testing.assert_array_equal(
        tree.ancestor_mask[0], expected_mask, err_msg="docs example tree mask"
    )


def test_two_row_unit_vectors():
    tree = build_prefix_tree(TWO_ROW_BEAMS)
    check_tree(tree, beams=TWO_ROW_BEAMS)
    assert tree.num_nodes.tolist() == [7, 9], "build_prefix_tree(two-row vectors) num_nodes"
    assert tree.size == 9
    assert tree.tokens[0, :7].tolist() == [91, 92, 93, 95, 94, 96, 97], "row 0 packed tokens"
    assert tree.tokens[1].tolist() == [93, 94, 95, 92, 95, 96, 93, 97, 96], "row 1 packed tokens"
    assert tree.beam_to_node[0].tolist() == [[0, 1, 2, 3], [0, 1, 4, 5], [0, 1, 2, 6]], (
        "row 0 unpacker"
    )
    assert tree.beam_to_node[1].tolist() == [[0, 1, 2, 3], [0, 4, 5, 6], [0, 1, 7, 8]], (
        "row 1 unpacker"
    )
    # Packed token indices (beam * L + depth of each kept token) give the depths as position
    # offsets.
    assert tree.depth[0, :7].tolist() == [i % 4 for i in [0, 1, 2, 3, 6, 7, 11]], "row 0 depths"
    assert tree.depth[1].tolist() == [i % 4 for i in [0, 1, 2, 3, 5, 6, 7, 10, 11]], "row 1 depths"
    # Our padding: token 0, parent root, depth 1, attends to the root and itself.
    assert tree.tokens[0, 7:].tolist() == [0, 0] and tree.parents[0, 7:].tolist() == [0, 0], (
        "row 0 padding"
    )
    assert tree.depth[0, 7:].tolist() == [1, 1], "row 0 padding depth"
    assert tree.ancestor_mask[0, 8].tolist() == [True] + [False] * 7 + [True], "row 0 padding mask"


def test_parents_helpers_on_a_small_tree():
    parents = np.array([[-1, 0, 0, 1, 3]])
    assert depth_from_parents(parents).tolist() == [[0, 1, 1, 2, 3]], (
        "depth_from_parents([-1,0,0,1,3])"
    )
    expected = rows("10000 / 11000 / 10100 / 11010 / 11011")
    np.testing.assert_array_equal(
        ancestor_mask_from_parents(parents)[0], expected, err_msg="ancestor_mask_from_parents"
    )
    with pytest.raises(ValueError, match="parents\\[b, i\\] < i"):
        depth_from_parents(np.array([[-1, 2, 0]]))
    with pytest.raises(ValueError, match="root at node 0"):
        ancestor_mask_from_parents(np.array([[0, 0]]))


def test_rejects_beams_without_a_shared_root():
    with pytest.raises(ValueError, match="row 1 do not share their first token"):
        build_prefix_tree(np.array([[[1, 2], [1, 3]], [[4, 5], [6, 5]]]))
    with pytest.raises(ValueError, match="shape \\(B, W, L\\)"):
        build_prefix_tree(np.array([[1, 2]]))


@pytest.mark.parametrize(
    "change, invariant",
    [
        (lambda t: {"parents": _set(t.parents, (0, 0), 0)}, "root at node 0"),
        (lambda t: {"parents": _set(t.parents, (0, 4), 5)}, "parents\\[b, i\\] < i"),
        (lambda t: {"depth": _set(t.depth, (0, 5), 4)}, "depth = depth\\[parent\\] \\+ 1"),
        (
            lambda t: {"ancestor_mask": _set(t.ancestor_mask, (0, 5, 2), True)},
            "ancestor_mask consistent",
        ),
        (
            lambda t: {"beam_to_node": _set(t.beam_to_node, (0, 1, 2), 2)},
            "beam_to_node follows parent links",
        ),
        (
            lambda t: {"beam_to_node": _set(t.beam_to_node, (0, 1, 0), 1)},
            "every beam starts at the root",
        ),
        (lambda t: {"num_nodes": np.array([0])}, "num_nodes"),
    ],
)
def test_check_tree_names_the_violated_invariant(change, invariant):
    tree = build_prefix_tree(DOCS_BEAMS)
    with pytest.raises(ValueError, match=invariant):
        check_tree(attrs.evolve(tree, **change(tree)))


def test_check_tree_catches_padding_nodes_off_the_root_and_token_mismatch():
    tree = build_prefix_tree(TWO_ROW_BEAMS)
    parents = _set(tree.parents, (0, 8), 7)
    depth = depth_from_parents(parents)
    bad = attrs.evolve(
        tree, parents=parents, depth=depth, ancestor_mask=ancestor_mask_from_parents(parents)
    )
    with pytest.raises(ValueError, match="padding nodes hang off the root"):
        check_tree(bad)
    with pytest.raises(ValueError, match="tokens\\[b, beam_to_node"):
        check_tree(tree, beams=TWO_ROW_BEAMS + 1)


def test_prefix_tree_builder():
    builder = PrefixTreeBuilder()
    assert isinstance(builder, TreeBuilder)
    tree = builder.build(Draft(root_tokens=np.array([101]), beams=DOCS_BEAMS))
    assert tree.tokens.tolist() == build_prefix_tree(DOCS_BEAMS).tokens.tolist(), (
        "PrefixTreeBuilder.build(docs example)"
    )
    with pytest.raises(ValueError, match="only head_tokens"):
        builder.build(
            Draft(root_tokens=np.array([1]), head_tokens=np.zeros((1, 2, 3), dtype=np.int64))
        )
    with pytest.raises(ValueError, match="root token"):
        builder.build(Draft(root_tokens=np.array([7]), beams=DOCS_BEAMS))


def _set(array, index, value):
    out = np.array(array, copy=True)
    out[index] = value
    return out


def dense_prefix_tree(beams: np.ndarray):
    """The vectorised formulation of docs/algorithms/dynamic_tree_attention.md, in NumPy."""
    batch, width, length = beams.shape
    match = beams[:, :, None, :] == beams[:, None, :, :]  # (B, W, W, L)
    shares_prefix = np.cumprod(match, axis=-1).astype(
        bool
    )  # (B, W, W, L): beams i, j agree on 0..k
    first = np.argmax(shares_prefix, axis=2)  # (B, W, L): lowest beam with the same prefix
    keep = first == np.arange(width)[None, :, None]  # (B, W, L): first occurrence of its prefix
    flat_keep = keep.reshape(batch, width * length).astype(np.int64)
    node_index = (np.cumsum(flat_keep, axis=1) - flat_keep).reshape(
        batch, width, length
    )  # exclusive cumsum
    beam_to_node = np.take_along_axis(node_index, first, axis=1)  # node of (first[b, i, k], k)
    num_nodes = flat_keep.sum(axis=1)
    size = int(num_nodes.max())
    tokens = np.zeros((batch, size), dtype=np.int64)
    parents = np.zeros((batch, size), dtype=np.int64)
    prev = np.concatenate([np.full((batch, width, 1), -1), beam_to_node[:, :, :-1]], axis=2)
    b_idx, i_idx, k_idx = np.nonzero(keep)
    tokens[b_idx, node_index[b_idx, i_idx, k_idx]] = beams[b_idx, i_idx, k_idx]
    parents[b_idx, node_index[b_idx, i_idx, k_idx]] = prev[b_idx, i_idx, k_idx]
    return tokens, parents, beam_to_node, num_nodes


@st.composite
def beam_batches(draw):
    batch = draw(st.integers(1, 3))
    width = draw(st.integers(1, 4))
    length = draw(st.integers(1, 4))
    vocab = draw(st.integers(2, 3))  # small vocabularies so prefixes are shared
    flat = draw(
        st.lists(
            st.integers(0, vocab - 1),
            min_size=batch * width * length,
            max_size=batch * width * length,
        )
    )
    beams = np.array(flat, dtype=np.int64).reshape(batch, width, length)
    beams[:, :, 0] = beams[:, :1, 0]  # every beam of a row starts with the row's root
    return beams


@settings(derandomize=True, deadline=None, max_examples=60)
@given(beams=beam_batches())
def test_prefix_tree_properties(beams):
    tree = build_prefix_tree(beams)
    check_tree(tree, beams=beams)
    batch, width, length = beams.shape
    for b in range(batch):
        prefixes = {tuple(beams[b, i, : k + 1]) for i in range(width) for k in range(length)}
        assert tree.num_nodes[b] == len(prefixes), (
            f"build_prefix_tree({beams.tolist()}) row {b}: N != distinct prefixes"
        )
        for i in range(width):
            nodes = tree.beam_to_node[b, i]
            assert np.all(tree.tokens[b, nodes] == beams[b, i]), (
                f"build_prefix_tree({beams.tolist()}) tokens[beam_to_node]"
            )
            assert np.all(np.diff(nodes) > 0), (
                f"build_prefix_tree({beams.tolist()}) beam_to_node not increasing"
            )
            for k in range(length):
                ancestors = set(np.flatnonzero(tree.ancestor_mask[b, nodes[k]]).tolist())
                assert ancestors == set(nodes[: k + 1].tolist()), (
                    f"build_prefix_tree({beams.tolist()}) row {b} beam {i} depth {k}: ancestors != "
                    "prefix nodes"
                )
    tokens, parents, beam_to_node, num_nodes = dense_prefix_tree(beams)
    np.testing.assert_array_equal(
        tree.tokens, tokens, err_msg=f"dense formulation tokens, beams {beams.tolist()}"
    )
    np.testing.assert_array_equal(tree.parents, parents, err_msg="dense formulation parents")
    np.testing.assert_array_equal(
        tree.beam_to_node, beam_to_node, err_msg="dense formulation beam_to_node"
    )
    np.testing.assert_array_equal(tree.num_nodes, num_nodes, err_msg="dense formulation num_nodes")


@settings(derandomize=True, deadline=None, max_examples=60)
@given(data=st.data(), beams=beam_batches())
def test_prefix_tree_of_beams_of_different_lengths(data, beams):
    """Beam i of row b is beams[b, i, :lengths[b, i]]: the tree holds exactly the distinct prefixes
    of those, numbered in first-occurrence (beam, depth) order; what lies past a beam's length is
    never read (other padding values give the same tree); full lengths give the plain tree."""
    from specdec.testing.strategies import beam_lengths

    lengths = data.draw(beam_lengths(beams.shape))
    tree = build_prefix_tree(beams, lengths)
    check_tree(tree, beams=beams)
    batch, width, length = beams.shape
    running = np.arange(length) < lengths[..., None]
    assert np.all((tree.beam_to_node >= 0) == running), (
        f"beam_to_node -1 exactly past each length: {lengths.tolist()}"
    )
    for b in range(batch):
        prefixes = {tuple(beams[b, i, : k + 1]) for i in range(width) for k in range(lengths[b, i])}
        assert tree.num_nodes[b] == len(prefixes), (
            f"row {b}: N != distinct prefixes of the cut beams"
        )
        order = [int(n) for n in tree.beam_to_node[b][running[b]]]  # row-major (beam, depth)
        first = list(dict.fromkeys(order))
        assert first == list(range(len(first))), (
            f"row {b}: nodes not in first-occurrence order: {order}"
        )
    padded = np.where(
        running, beams, beams.max() + 1 + np.arange(length)
    )  # other values past the lengths
    other = build_prefix_tree(padded, lengths)
    for field in ("tokens", "parents", "depth", "ancestor_mask", "num_nodes", "beam_to_node"):
        assert np.array_equal(getattr(other, field), getattr(tree, field)), (
            f"{field} read past a beam's length"
        )
    full = build_prefix_tree(beams, np.full((batch, width), length))
    assert np.array_equal(full.beam_to_node, build_prefix_tree(beams).beam_to_node)


def test_beam_lengths_are_checked():
    beams = np.array([[[1, 2, 3], [1, 4, 5]]])
    with pytest.raises(ValueError, match=r"beam_lengths must lie in \[1, L\]"):
        build_prefix_tree(beams, np.array([[3, 0]]))
    with pytest.raises(ValueError, match="shape"):
        Draft(root_tokens=np.array([1]), beams=beams, beam_lengths=np.array([3, 2]))
    with pytest.raises(ValueError, match="draft_probs"):
        Draft(
            root_tokens=np.array([1]),
            beams=beams,
            beam_lengths=np.array([[3, 2]]),
            draft_probs=np.zeros((1, 2, 2, 6)),
        )
