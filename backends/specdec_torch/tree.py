"""Token trees on torch: ReDrafter's dynamic tree attention with dense tensor ops, and static trees.

``build_prefix_tree`` is the vectorised twin of ``specdec.reference.tree.build_prefix_tree``
(worked example: docs/algorithms/dynamic_tree_attention.md). For beams (B, W, L):

1. prefix match: ``same[b, i, j, k]`` iff beams i and j agree on tokens 0..k (cumulative AND);
2. keep mask: token (i, k) opens a new node iff no earlier beam j < i has the same prefix;
3. node ids: an inclusive cumulative sum of the keep mask in row-major (beam, depth) order,
   minus one, numbers the kept tokens in first-occurrence order, the reference's node order;
4. ``beam_to_node[b, i, k]`` is the node id of the first beam sharing that prefix;
5. tokens, parents, depth and the ancestor mask are scattered from there; rows are padded to
   the batch's N with token 0 hanging off the root at depth 1.

Only N (the batch's largest node count) is read on the host: the tree's size is a shape. A single
beam per row (W = 1: plain decoding, chain drafters) without beam lengths is its own tree and
needs no host read. Beams of different lengths (``Draft.beam_lengths``) keep only their running
tokens (docs/algorithms/dynamic_tree_attention.md, "Beams of different lengths").
"""

from __future__ import annotations

import torch

from specdec.types import Draft, DraftTree

__all__ = ["TorchPrefixTreeBuilder", "build_prefix_tree", "chain_tree", "padding_ancestor_mask"]


def padding_ancestor_mask(mask: torch.Tensor, num_nodes: torch.Tensor) -> torch.Tensor:
    """Give padding nodes (index >= num_nodes[b]) the mask of a child of the root: itself and node
    0.

    mask (B, N, N) bool, num_nodes (B,) -> (B, N, N) bool.
    """
    size = mask.shape[1]
    index = torch.arange(size, device=mask.device)
    padding = index[None, :] >= num_nodes[:, None]  # (B, N)
    own = (index[:, None] == index[None, :]) | (index[None, :] == 0)  # (N, N): self or root
    return mask | (padding[:, :, None] & own[None])


def chain_tree(chain: torch.Tensor) -> DraftTree:
    """The tree of a single beam per row, chain (B, L): node k is token k, its parent node k-1.
    What ``build_prefix_tree`` gives for W = 1, without any host read
    (plain decoding, chain drafters)."""
    batch, length = chain.shape
    index = torch.arange(length, device=chain.device)
    return DraftTree(
        tokens=chain.to(torch.int64),
        parents=(index - 1).expand(batch, length),
        depth=index.expand(batch, length),
        ancestor_mask=torch.ones(length, length, dtype=torch.bool, device=chain.device)
        .tril()
        .expand(batch, -1, -1),
        num_nodes=torch.full((batch,), length, dtype=torch.int64, device=chain.device),
        beam_to_node=index.expand(batch, 1, length),
    )


def build_prefix_tree(beams: torch.Tensor, lengths: torch.Tensor | None = None) -> DraftTree:
    """Deduplicate beams (B, W, L) int64 into a prefix tree; same nodes, order and padding as the
    reference. ``lengths`` (B, W) int64 on the beams' device or None: each beam's length
    (``Draft.beam_lengths``). Returns a DraftTree of tensors on the beams' device, with
    ``beam_to_node`` (B, W, L), -1 past a beam's length."""
    batch, width, length = beams.shape
    device = beams.device
    if width == 1 and lengths is None:
        return chain_tree(beams[:, 0])
    # 1. Prefix match between every pair of beams, per depth (both beams still running).
    # (B, W, L)
    running = (
        torch.ones(batch, width, length, dtype=torch.bool, device=device)
        if lengths is None
        else (torch.arange(length, device=device) < lengths[:, :, None])
    )
    equal = (
        (beams[:, :, None, :] == beams[:, None, :, :])
        & running[:, :, None, :]
        & running[:, None, :, :]
    )
    # same[b, i, j, k]: prefixes of length k+1 agree
    same = torch.cumprod(equal.to(torch.int64), dim=3).bool()
    # 2. Keep mask: a real token that no earlier beam shares the prefix of.
    # [i, j]: j < i
    earlier = torch.ones(width, width, dtype=torch.bool, device=device).tril(diagonal=-1)
    keep = running & ~(same & earlier[None, :, :, None]).any(dim=2)  # (B, W, L)
    flat_keep = keep.reshape(batch, width * length)
    # 3. Node ids in first-occurrence (row-major) order.
    node_of_token = torch.cumsum(flat_keep.to(torch.int64), dim=1) - 1  # (B, W*L), valid where kept
    num_nodes = flat_keep.sum(dim=1)  # (B,)
    size = int(num_nodes.max())  # the tree's N: the one host read
    # 4. The first beam with the same prefix owns the node.
    owner = torch.argmax(same.to(torch.int8), dim=2)  # (B, W, L): first j with same[b, i, j, k]
    owner_token = owner * length + torch.arange(length, device=device)  # flat (beam, depth) index
    beam_to_node = torch.gather(node_of_token, 1, owner_token.reshape(batch, -1)).reshape(
        batch, width, length
    )
    if lengths is not None:
        beam_to_node = torch.where(running, beam_to_node, -1)
    # 5. Scatter per-token facts to their nodes; dropped tokens go to a spare column N.
    destination = torch.where(flat_keep, node_of_token, size)  # (B, W*L)
    root_parent = torch.full((batch, width, 1), -1, dtype=torch.int64, device=device)
    parent_of_token = torch.cat([root_parent, beam_to_node[:, :, :-1]], dim=2).reshape(batch, -1)
    depth_of_token = torch.arange(length, device=device).repeat(width).expand(batch, -1)

    def scatter(fill: int, values: torch.Tensor) -> torch.Tensor:
        out = torch.full((batch, size + 1), fill, dtype=torch.int64, device=device)
        return out.scatter_(1, destination, values)[:, :size]

    tokens = scatter(0, beams.reshape(batch, -1).to(torch.int64))
    parents = scatter(0, parent_of_token)
    depth = scatter(1, depth_of_token)
    # Ancestor mask: node of token (i, k) sees the nodes of tokens (i, 0..k).
    # (padding tokens (-1) are never kept, so they reach no mask row; clamp keeps the index valid)
    # [.., k, k']
    ancestor_node = beam_to_node.clamp(min=0)[:, :, None, :].expand(batch, width, length, length)
    upto = torch.ones(length, length, dtype=torch.bool, device=device).tril()  # [k, k']: k' <= k
    row = torch.where(
        keep[:, :, :, None] & upto, destination.reshape(batch, width, length)[..., None], size
    )
    flat = (row * size + ancestor_node).reshape(batch, -1)
    mask = torch.zeros(batch, (size + 1) * size, dtype=torch.bool, device=device).scatter_(
        1, flat, True
    )
    mask = padding_ancestor_mask(mask.view(batch, size + 1, size)[:, :size], num_nodes)
    return DraftTree(
        tokens=tokens,
        parents=parents,
        depth=depth,
        ancestor_mask=mask,
        num_nodes=num_nodes,
        beam_to_node=beam_to_node,
    )


class TorchPrefixTreeBuilder:
    """TreeBuilder for drafts made of beams: ``build(draft)`` is ``build_prefix_tree(draft.beams)``.

    Unlike the reference it does not read the beams back to check that they start with the
    row's root (that would cost a host sync per step); drafters guarantee it.
    """

    def build(self, draft: Draft) -> DraftTree:
        if draft.beams is None:
            raise ValueError(
                "the prefix_tree builder needs a Draft with beams (B, W, L), but this draft has "
                "only head_tokens (B, K, T); use a tree builder for head top-k drafts (a static "
                "tree) instead"
            )
        lengths = (
            None
            if draft.beam_lengths is None
            else torch.as_tensor(draft.beam_lengths, dtype=torch.int64, device=draft.beams.device)
        )
        return build_prefix_tree(draft.beams, lengths)
