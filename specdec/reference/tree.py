"""Token trees: depths and ancestor masks from parents, and ReDrafter's dynamic tree attention.

Dynamic tree attention (ReDrafter, arXiv 2403.09919, section 3.3): the W beams of length L
drafted in one step all start with the same root token and often share longer prefixes. Each
distinct prefix is verified once: the beams are deduplicated into a prefix tree whose node i
is the last token of one distinct prefix, and the target attends from node i to exactly the
nodes of that prefix (its ancestors and itself). ``beam_to_node`` (ReDrafter's "unpacker")
maps every beam token back to its node, so per-beam logits are a gather.

This is the readable reference (a dict from prefix to node). The dense-tensor formulation a
backend vectorises (prefix match matrix, keep mask, exclusive cumsum) is worked through in
``docs/algorithms/dynamic_tree_attention.md``; both give the same node order.

Shapes: B batch, W beam width, L beam length (root included), N tree nodes (padded).
"""

from __future__ import annotations

import attrs
import numpy as np

from specdec.types import Draft, DraftTree

__all__ = [
    "PrefixTreeBuilder",
    "ancestor_mask_from_parents",
    "build_prefix_tree",
    "check_beam_lengths",
    "check_tree",
    "depth_from_parents",
]


def _check_parents(parents: np.ndarray) -> np.ndarray:
    """Validate parents (B, N): node 0 is the root with parent -1, and 0 <= parents[b, i] < i."""
    parents = np.asarray(parents)
    if parents.ndim != 2 or parents.shape[1] < 1:
        raise ValueError(f"parents must have shape (B, N) with N >= 1, got {parents.shape}")
    if not np.issubdtype(parents.dtype, np.integer):
        raise ValueError(f"parents must be an integer array, got dtype {parents.dtype}")
    parents = parents.astype(np.int64)
    for b in range(parents.shape[0]):
        if parents[b, 0] != -1:
            raise ValueError(
                f"tree invariant 'root at node 0 with parent -1' violated in row {b}: "
                f"parents[{b}, 0] = {parents[b, 0]}"
            )
        for i in range(1, parents.shape[1]):
            if not 0 <= parents[b, i] < i:
                raise ValueError(
                    f"tree invariant '0 <= parents[b, i] < i' violated at row {b}, node {i}: "
                    f"parent {parents[b, i]}; list every node after its parent"
                )
    return parents


def depth_from_parents(parents: np.ndarray) -> np.ndarray:
    """Depth of every node (root 0). parents (B, N) int -> depth (B, N) int64."""
    parents = _check_parents(parents)
    batch, num_nodes = parents.shape
    depth = np.zeros((batch, num_nodes), dtype=np.int64)
    for b in range(batch):
        for i in range(1, num_nodes):
            depth[b, i] = depth[b, parents[b, i]] + 1  # parents come first, so already known
    return depth


def ancestor_mask_from_parents(parents: np.ndarray) -> np.ndarray:
    """``mask[b, i, j]`` iff node j is node i or one of its ancestors.

    parents (B, N) int -> mask (B, N, N) bool. Row i is the attention row of node i.
    """
    parents = _check_parents(parents)
    batch, num_nodes = parents.shape
    mask = np.zeros((batch, num_nodes, num_nodes), dtype=bool)
    for b in range(batch):
        for i in range(num_nodes):
            if i > 0:
                mask[b, i] = mask[b, parents[b, i]]  # the parent's ancestors ...
            mask[b, i, i] = True  # ... and the node itself
    return mask


def build_prefix_tree(beams: np.ndarray, lengths: np.ndarray | None = None) -> DraftTree:
    """Deduplicate beams into a prefix tree (ReDrafter's dynamic tree attention).

    beams (B, W, L) int: candidate sequences; every beam of a row starts with the row's root.
    lengths (B, W) int or None: beam i of row b is ``beams[b, i, :lengths[b, i]]``
    (``Draft.beam_lengths``); the tokens after it are ignored.
    Node order is the first occurrence of each distinct prefix in row-major (beam, depth)
    order, so node 0 is the root and beam 0 (the drafter's best) occupies nodes 0..L-1.
    Rows with fewer nodes are padded to the batch's N with nodes of token 0 whose parent is
    the root (depth 1; they attend to the root and themselves; nothing refers to them).

    Returns a DraftTree of NumPy int64 arrays with ``beam_to_node`` (B, W, L):
    ``tokens[b, beam_to_node[b, i, k]] == beams[b, i, k]``, strictly increasing in k; -1 past
    a beam's length.
    """
    beams = np.asarray(beams)
    if beams.ndim != 3 or min(beams.shape) < 1:
        raise ValueError(f"beams must have shape (B, W, L) with B, W, L >= 1, got {beams.shape}")
    if not np.issubdtype(beams.dtype, np.integer):
        raise ValueError(f"beams must hold integer token ids, got dtype {beams.dtype}")
    batch, width, length = beams.shape
    lengths = check_beam_lengths(lengths, beams.shape)
    if np.any(np.where(np.arange(length) < lengths[..., None], beams, 0) < 0):
        raise ValueError("beams must hold token ids >= 0; found a negative id")
    beam_to_node = np.full((batch, width, length), -1, dtype=np.int64)
    row_tokens: list[list[int]] = []
    row_parents: list[list[int]] = []
    for b in range(batch):
        if np.any(beams[b, :, 0] != beams[b, 0, 0]):
            raise ValueError(
                f"beams of row {b} do not share their first token (the root): "
                f"{beams[b, :, 0].tolist()}; every beam must start with the row's root token"
            )
        node_of_prefix: dict[tuple[int, ...], int] = {}
        tokens: list[int] = []
        parents: list[int] = []
        for i in range(width):
            parent = -1
            for k in range(int(lengths[b, i])):
                prefix = tuple(int(t) for t in beams[b, i, : k + 1])
                if prefix not in node_of_prefix:  # first occurrence: a new node
                    node_of_prefix[prefix] = len(tokens)
                    tokens.append(int(beams[b, i, k]))
                    parents.append(parent)
                node = node_of_prefix[prefix]
                beam_to_node[b, i, k] = node
                parent = node
        row_tokens.append(tokens)
        row_parents.append(parents)

    num_nodes = np.array([len(t) for t in row_tokens], dtype=np.int64)
    size = int(num_nodes.max())
    tokens = np.zeros((batch, size), dtype=np.int64)  # padding: token 0 ...
    parents = np.zeros((batch, size), dtype=np.int64)  # ... hanging off the root
    for b in range(batch):
        tokens[b, : num_nodes[b]] = row_tokens[b]
        parents[b, : num_nodes[b]] = row_parents[b]
    return DraftTree(
        tokens=tokens,
        parents=parents,
        depth=depth_from_parents(parents),
        ancestor_mask=ancestor_mask_from_parents(parents),
        num_nodes=num_nodes,
        beam_to_node=beam_to_node,
    )


def check_beam_lengths(lengths, shape) -> np.ndarray:
    """``Draft.beam_lengths`` as (B, W) int64 for beams of ``shape`` (B, W, L): L everywhere when
    None; ValueError unless every length is an integer in [1, L]."""
    batch, width, length = shape
    if lengths is None:
        return np.full((batch, width), length, dtype=np.int64)
    lengths = np.asarray(lengths)
    if lengths.shape != (batch, width) or not np.issubdtype(lengths.dtype, np.integer):
        raise ValueError(
            f"beam_lengths must be integers of shape (B, W) = {(batch, width)}, "
            f"got {lengths.dtype} {lengths.shape}"
        )
    if np.any((lengths < 1) | (lengths > length)):
        raise ValueError(
            f"beam_lengths must lie in [1, L] = [1, {length}] (the root counts), "
            f"got {lengths.min()}..{lengths.max()}"
        )
    return lengths.astype(np.int64)


def check_tree(tree: DraftTree, *, beams: np.ndarray | None = None) -> None:
    """Raise ValueError naming the first violated DraftTree invariant; return None if all hold.

    Invariants: node 0 is the root with parent -1; ``0 <= parents[b, i] < i``; padding nodes
    (``i >= num_nodes[b]``) hang off the root; ``depth[b, 0] == 0`` and
    ``depth = depth[parent] + 1``; ``ancestor_mask`` is the one implied by ``parents``;
    ``beam_to_node`` (when present) starts every beam at the root, follows parent links and
    points at real nodes until the beam ends (-1 after, for the same beam in every later
    position). With ``beams`` (B, W, L) given, also ``tokens[beam_to_node] == beams`` where
    ``beam_to_node`` is not -1.
    """
    parents = _check_parents(tree.parents)
    batch, size = parents.shape
    num_nodes = np.asarray(tree.num_nodes, dtype=np.int64)
    depth = np.asarray(tree.depth)
    for b in range(batch):
        if not 1 <= num_nodes[b] <= size:
            raise ValueError(
                f"tree invariant '1 <= num_nodes <= N' violated in row {b}: {num_nodes[b]} with "
                f"N={size}"
            )
        for i in range(num_nodes[b], size):
            if parents[b, i] != 0:
                raise ValueError(
                    f"tree invariant 'padding nodes hang off the root' violated at row {b}, node "
                    f"{i} (num_nodes {num_nodes[b]}): parent {parents[b, i]}"
                )
        if depth[b, 0] != 0:
            raise ValueError(
                f"tree invariant 'root depth 0' violated in row {b}: depth {depth[b, 0]}"
            )
        for i in range(1, size):
            if depth[b, i] != depth[b, parents[b, i]] + 1:
                raise ValueError(
                    f"tree invariant 'depth = depth[parent] + 1' violated at row {b}, node {i}: "
                    f"depth {depth[b, i]}, parent {parents[b, i]} has depth "
                    f"{depth[b, parents[b, i]]}"
                )
    expected = ancestor_mask_from_parents(parents)
    mismatch = np.argwhere(np.asarray(tree.ancestor_mask, dtype=bool) != expected)
    if len(mismatch):
        b, i, j = (int(x) for x in mismatch[0])
        raise ValueError(
            f"tree invariant 'ancestor_mask consistent with parents' violated at row {b}: "
            f"ancestor_mask[{b}, {i}, {j}] should be {bool(expected[b, i, j])}"
        )
    if tree.beam_to_node is not None:
        _check_beam_to_node(np.asarray(tree.beam_to_node), parents, num_nodes)
        if beams is not None:
            beams = np.asarray(beams)
            beam_to_node = np.asarray(tree.beam_to_node)
            real = beam_to_node >= 0
            gathered = np.take_along_axis(
                np.asarray(tree.tokens), np.where(real, beam_to_node, 0).reshape(batch, -1), axis=1
            )
            if beams.shape != beam_to_node.shape or np.any(
                real & (gathered.reshape(beams.shape) != beams)
            ):
                raise ValueError(
                    "tree invariant 'tokens[b, beam_to_node[b, i, k]] == beams[b, i, k]' violated"
                )


def _check_beam_to_node(
    beam_to_node: np.ndarray, parents: np.ndarray, num_nodes: np.ndarray
) -> None:
    batch, width, length = beam_to_node.shape
    if batch != parents.shape[0]:
        raise ValueError(f"beam_to_node has batch {batch}, the tree has {parents.shape[0]} rows")
    for b in range(batch):
        for i in range(width):
            nodes = beam_to_node[b, i]
            if nodes[0] != 0:
                raise ValueError(
                    f"tree invariant 'every beam starts at the root' violated: beam_to_node[{b}, "
                    f"{i}, 0] = {nodes[0]}"
                )
            ended = np.flatnonzero(nodes < 0)
            end = int(ended[0]) if len(ended) else length
            if np.any(nodes[end:] != -1):
                raise ValueError(
                    f"tree invariant 'a beam that ended stays ended' violated: beam_to_node[{b}, "
                    f"{i}] = {nodes.tolist()}"
                )
            for k in range(1, end):
                if not 0 < nodes[k] < num_nodes[b] or parents[b, nodes[k]] != nodes[k - 1]:
                    raise ValueError(
                        "tree invariant 'beam_to_node follows parent links to real nodes' violated "
                        f"at row {b}, beam {i}, depth {k}: node {nodes[k]} after node "
                        f"{nodes[k - 1]}"
                    )


@attrs.frozen(kw_only=True)
class PrefixTreeBuilder:
    """TreeBuilder for drafts made of beams: ``build(draft)`` is
    ``build_prefix_tree(draft.beams)``."""

    def build(self, draft: Draft) -> DraftTree:
        if draft.beams is None:
            raise ValueError(
                "PrefixTreeBuilder needs a Draft with beams (B, W, L), but this draft has only "
                "head_tokens (B, K, T); use a tree builder for head top-k drafts (a static tree) "
                "instead"
            )
        beams = np.asarray(draft.beams)
        roots = np.asarray(draft.root_tokens)
        if beams.shape[0] != roots.shape[0] or np.any(beams[:, :, 0] != roots[:, None]):
            raise ValueError(
                "every beam must start with its row's root token: beams[:, :, 0] != "
                "draft.root_tokens"
            )
        return build_prefix_tree(beams, draft.beam_lengths)
