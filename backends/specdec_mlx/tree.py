"""Dynamic tree attention in MLX ops: beams (B, W, L) -> the reference's prefix tree.

The dense formulation of ``docs/algorithms/dynamic_tree_attention.md``: prefix match, first
owner of each prefix, keep mask, exclusive cumsum for node indices, then one-hot reductions
(exact integer sums) instead of scatters. Node order and padding are those of
``specdec.reference.tree.build_prefix_tree``.

N, the batch's largest node count, is data: a tree of that size needs one host read of
``max(num_nodes)`` after drafting (the step's second evaluation point). A single beam without
beam lengths (W = 1: chains, plain decoding) has N = L and needs none; ``static_size=True`` pads
every tree to the bound 1 + W (L - 1) and needs none either, at the cost of verifying the padding.
Beams of different lengths (``Draft.beam_lengths``) keep only their running tokens
(docs/algorithms/dynamic_tree_attention.md, "Beams of different lengths").
Shapes: B batch, W beams, L beam length (root included), N nodes, M = 1 + W (L - 1).
"""

from __future__ import annotations

import attrs
import mlx.core as mx
import numpy as np

from specdec.types import Draft, DraftTree
from specdec_mlx.arrays import to_mx


@attrs.frozen(kw_only=True)
class MlxDraftTree(DraftTree):
    """A DraftTree that also records D, its largest real depth, on the host, so verifiers size
    their (B, D+1) paths without reading the device. None means unknown."""

    max_depth: int | None = None


def static_depth(tree: DraftTree, draft: Draft | None) -> int:
    """D for a tree: recorded by the builder, implied by the beams of a prefix tree (L - 1), or
    read from the device as a last resort (a host sync)."""
    recorded = getattr(tree, "max_depth", None)
    if recorded is not None:
        return int(recorded)
    if draft is not None and draft.beams is not None and tree.beam_to_node is not None:
        return int(draft.beams.shape[2]) - 1
    depth = np.array(to_mx(tree.depth))
    real = np.arange(tree.size)[None, :] < np.array(to_mx(tree.num_nodes))[:, None]
    return int(np.max(np.where(real, depth, 0)))


def prefix_tree_arrays(beams: mx.array, lengths: mx.array | None = None) -> dict[str, mx.array]:
    """The prefix tree of beams (B, W, L) int32, padded to M = 1 + W (L - 1) nodes.
    ``lengths`` (B, W) int32 or None: each beam's length (``Draft.beam_lengths``).

    Returns tokens, parents, depth (B, M), ancestor_mask (B, M, M), num_nodes (B,),
    beam_to_node (B, W, L) (-1 past a beam's length), all int32 / bool.
    """
    batch, width, length = beams.shape
    bound = 1 + width * (length - 1)
    # (B, W, L)
    running = (
        mx.ones(beams.shape, dtype=mx.bool_)
        if lengths is None
        else (mx.arange(length)[None, None, :] < lengths[:, :, None])
    )
    # 1. Prefix match: shares[b, i, j, k] iff beams i and j agree on tokens 0..k (both running).
    # (B, W, W, L)
    match = (
        (beams[:, :, None, :] == beams[:, None, :, :])
        & running[:, :, None, :]
        & running[:, None, :, :]
    ).astype(mx.int32)
    shares = mx.cumprod(match, axis=-1) > 0
    # 2. First owner of each prefix (lowest beam index), 3. keep mask of first occurrences.
    # (B, W, L)
    owner = mx.min(mx.where(shares, mx.arange(width)[None, None, :, None], width), axis=2)
    keep = running & (owner == mx.arange(width)[None, :, None])
    owner = mx.where(running, owner, 0)  # padding: any beam, masked below
    # 4. Node index by exclusive cumsum over row-major (beam, depth) order.
    flat_keep = keep.reshape(batch, width * length).astype(mx.int32)
    node_index = (mx.cumsum(flat_keep, axis=1) - flat_keep).reshape(batch, width, length)
    num_nodes = mx.sum(flat_keep, axis=1)
    # 5. Unpacker: every beam token's node is its prefix owner's node.
    beam_to_node = mx.where(running, mx.take_along_axis(node_index, owner, axis=1), -1)  # (B, W, L)
    # 6. Scatter as exact one-hot sums: position (i, k) kept -> node node_index[i, k].
    nodes = mx.arange(bound)
    # (B, WL, M)
    creates = (keep[..., None] & (node_index[..., None] == nodes)).reshape(
        batch, width * length, bound
    )
    depth_of = mx.broadcast_to(mx.arange(length)[None, None, :], beams.shape)
    parent_of = mx.concatenate(
        [mx.full((batch, width, 1), -1, dtype=mx.int32), beam_to_node[:, :, :-1]], axis=2
    )

    # (B, W, L) -> (B, M), 0 where no position creates the node
    def scatter(
        values: mx.array,
    ) -> mx.array:
        return mx.sum(mx.where(creates, values.reshape(batch, width * length, 1), 0), axis=1)

    real = nodes[None, :] < num_nodes[:, None]  # (B, M)
    tokens = scatter(beams)
    parents = mx.where(real, scatter(parent_of), 0)
    depth = mx.where(real, scatter(depth_of), 1)
    # 7. Mask: position (i, k) sees the nodes of beam i up to depth k; a node's row is that of
    # the position that created it. Padding nodes see the root and themselves.
    on_beam = (beam_to_node[..., None] == nodes).astype(mx.int32)  # (B, W, L, M)
    seen = (mx.cummax(on_beam, axis=2) > 0).reshape(batch, width * length, bound).astype(mx.float32)
    ancestor_mask = (creates.astype(mx.float32).transpose(0, 2, 1) @ seen) > 0  # (B, M, M)
    padding_row = (
        ~real[:, :, None] & ((nodes[None, :] == nodes[:, None]) | (nodes[None, :] == 0))[None]
    )
    ancestor_mask = ancestor_mask | padding_row
    return dict(
        tokens=tokens.astype(mx.int32),
        parents=parents.astype(mx.int32),
        depth=depth.astype(mx.int32),
        ancestor_mask=ancestor_mask,
        num_nodes=num_nodes.astype(mx.int32),
        beam_to_node=beam_to_node.astype(mx.int32),
    )


@attrs.frozen(kw_only=True)
class PrefixTreeBuilder:
    """TreeBuilder for beam drafts on the mlx backend (same trees as the reference's).

    static_size: pad every tree to 1 + W (L - 1) nodes instead of reading the batch's largest
    node count from the device (no sync; more nodes verified). The data check that every beam
    starts with its row's root is left to the reference (it would read the device).
    """

    static_size: bool = False

    def build(self, draft: Draft) -> MlxDraftTree:
        if draft.beams is None:
            raise ValueError(
                "PrefixTreeBuilder needs a Draft with beams (B, W, L), but this draft has only "
                "head_tokens (B, K, T); use a tree builder for head top-k drafts (a static tree) "
                "instead"
            )
        beams = to_mx(draft.beams).astype(mx.int32)
        if beams.ndim != 3 or min(beams.shape) < 1:
            raise ValueError(
                f"beams must have shape (B, W, L) with B, W, L >= 1, got {tuple(beams.shape)}"
            )
        batch, width, length = beams.shape
        lengths = (
            None
            if draft.beam_lengths is None
            else mx.array(np.asarray(draft.beam_lengths, dtype=np.int32))
        )
        arrays = prefix_tree_arrays(beams, lengths)
        if width == 1 and lengths is None:
            size = length  # a single beam is a chain: every token is a node
        elif self.static_size:
            size = 1 + width * (length - 1)
        else:
            size = int(mx.max(arrays["num_nodes"]).item())  # host read: the tree's size is data
        arrays = {
            name: value[:, :size] if name in ("tokens", "parents", "depth") else value
            for name, value in arrays.items()
        }
        arrays["ancestor_mask"] = arrays["ancestor_mask"][:, :size, :size]
        depth = length if lengths is None else int(np.max(draft.beam_lengths))
        return MlxDraftTree(**arrays, max_depth=depth - 1)
