"""Verifiers in MLX ops, the same rules as ``specdec.reference.verify`` for every row at once.

The reference walks the tree from the root, one node at a time. Here every node's decision is
taken in parallel, because at each node it depends only on the node (its logits, its depth's
uniforms, the beams through it), never on the path above:

1. each node u gets a "next token" x_u (argmax, or a sample with ``uniforms[b, depth(u), 0]``)
   or, for rejection sampling, each beam position its acceptance;
2. a node is *chosen* when it is the first child (node order) of its parent to be accepted;
3. a node is on the accepted path when it and all its ancestors are chosen (ancestor mask);
4. the path lists the on-path node of every depth, the bonus comes from the deepest one.

Shapes: B batch, N nodes, D+1 path length, W beams, L beam length, V vocabulary. Verdicts are
int32. ``uniforms`` (B, D+1, W+1) may be NumPy or MLX; None when greedy.
"""

from __future__ import annotations

from typing import Any

import mlx.core as mx

from specdec.capabilities import VerifierRule
from specdec.errors import InvalidInputError
from specdec.reference.verify import check_uniform_shape, check_verifier_inputs
from specdec.types import Draft, DraftTree, SamplingConfig, TargetOutput, Verdict
from specdec_mlx import ops
from specdec_mlx.acceptance import acceptance_probability, coin, subtract_draft
from specdec_mlx.arrays import to_mx
from specdec_mlx.tree import static_depth


def gather_nodes(values: mx.array, nodes: mx.array) -> mx.array:
    """values (B, N, ...) at node indices nodes (B, ...) -> (B, ..., ...rest of values)."""
    batch = values.shape[0]
    flat = nodes.reshape(batch, -1)
    rest = values.shape[2:]
    index = flat.reshape(flat.shape + (1,) * len(rest))
    picked = mx.take_along_axis(values, index, axis=1)  # (B, n, ...)
    return picked.reshape(nodes.shape + rest)


def accepted_path(
    tree: DraftTree, accepted: mx.array, depth_limit: int
) -> tuple[mx.array, mx.array, mx.array]:
    """Walk the tree along accepted children. accepted (B, N) bool: node i would be taken from
    its parent. Returns path (B, D+1) (-1 padded), num_accepted (B,), last node (B,)."""
    parents = to_mx(tree.parents).astype(mx.int32)
    depth = to_mx(tree.depth).astype(mx.int32)
    ancestor_mask = to_mx(tree.ancestor_mask).astype(mx.bool_)
    size = tree.size
    ids = mx.arange(size)
    real = ids[None, :] < to_mx(tree.num_nodes)[:, None]
    candidate = accepted & real & (ids[None, :] > 0)
    # 2. Chosen: no earlier sibling (same parent, lower index) is a candidate too.
    sibling_before = (parents[:, :, None] == parents[:, None, :]) & (ids[None, :] < ids[:, None])[
        None
    ]
    shadowed = mx.any(sibling_before & candidate[:, None, :], axis=2)
    chosen = (candidate & ~shadowed) | (ids[None, :] == 0)
    # 3. On the path: every ancestor (self included) chosen.
    on_path = ~mx.any(ancestor_mask & ~chosen[:, None, :], axis=2)  # (B, N)
    # 4. The on-path node of each depth; the deepest is the largest index (parents come first).
    # (B, D+1, N)
    at_depth = on_path[:, None, :] & (
        depth[:, None, :] == mx.arange(depth_limit + 1)[None, :, None]
    )
    path = mx.where(mx.any(at_depth, axis=2), mx.sum(mx.where(at_depth, ids, 0), axis=2), -1)
    num_accepted = mx.sum(on_path, axis=1) - 1
    last = mx.max(mx.where(on_path, ids, 0), axis=1)
    return path.astype(mx.int32), num_accepted.astype(mx.int32), last.astype(mx.int32)


def node_uniforms(uniforms: mx.array | None, depth: mx.array, column: int = 0) -> mx.array | None:
    """uniforms[b, depth[b, ...], column] for node depths (B, ...); None stays None."""
    if uniforms is None:
        return None
    batch = depth.shape[0]
    flat = mx.clip(depth.reshape(batch, -1), 0, uniforms.shape[1] - 1)
    return mx.take_along_axis(uniforms[:, :, column], flat, axis=1).reshape(depth.shape)


class MlxVerifier(VerifierRule):
    """Input checks shared by the MLX verifiers; subclasses set the class attributes of
    ``specdec.capabilities.VerifierRule``."""

    def prepare(
        self,
        tree: DraftTree,
        draft: Draft,
        target: TargetOutput,
        sampling: SamplingConfig,
        uniforms: Any,
    ) -> tuple[int, mx.array, mx.array | None]:
        """Check the inputs; returns (D, logits (B, N, V) float32, uniforms (B, D+1, W+1) or
        None)."""
        check_verifier_inputs(self, tree, draft, target, backend="mlx")
        depth = static_depth(tree, draft)
        logits = to_mx(target.logits).astype(mx.float32)
        if not self.uses_uniforms:
            return depth, logits, None
        width = 0 if draft is None or draft.beams is None else int(draft.beams.shape[1])
        check_uniform_shape(
            self,
            None if uniforms is None else tuple(uniforms.shape),
            sampling,
            tree.batch_size,
            depth,
            width,
            backend="mlx",
        )
        return depth, logits, None if uniforms is None else to_mx(uniforms).astype(mx.float32)


def walk_by_tokens(tree: DraftTree, next_tokens: mx.array, depth: int) -> Verdict:
    """Descend while a child carries the node's next token (B, N); the bonus is the last node's."""
    if tree.size == 1:  # plain decoding: the root alone
        zeros = mx.zeros((tree.batch_size, 1), dtype=mx.int32)
        return Verdict(
            path=zeros, num_accepted=zeros[:, 0], bonus_tokens=next_tokens[:, 0].astype(mx.int32)
        )
    parents = mx.maximum(to_mx(tree.parents).astype(mx.int32), 0)
    accepted = to_mx(tree.tokens).astype(mx.int32) == mx.take_along_axis(
        next_tokens, parents, axis=1
    )
    path, num_accepted, last = accepted_path(tree, accepted, depth)
    bonus = mx.take_along_axis(next_tokens, last[:, None], axis=1)[:, 0]
    return Verdict(path=path, num_accepted=num_accepted, bonus_tokens=bonus)


class GreedyVerifier(MlxVerifier):
    """Follow the target's argmax (lowest id on ties) while it is a drafted child: plain greedy
    decoding. Ignores temperature, top-k, top-p and uniforms."""

    uses_uniforms = False

    def verify(self, tree, draft, target, sampling, uniforms=None) -> Verdict:
        depth, logits, _ = self.prepare(tree, draft, target, sampling, uniforms)
        return walk_by_tokens(tree, ops.first_argmax(logits), depth)


class ExactTreeVerifier(MlxVerifier):
    """The exact tree walk: at node u of depth d sample x from target_probs(logits[u]) with
    ``uniforms[b, d, 0]``; descend to the child carrying x, else x is the bonus. Every node's
    x is drawn at once (the uniform depends only on the depth)."""

    def verify(self, tree, draft, target, sampling, uniforms=None) -> Verdict:
        depth, logits, uniforms = self.prepare(tree, draft, target, sampling, uniforms)
        if uniforms is None:
            return walk_by_tokens(tree, ops.first_argmax(logits), depth)
        probs = ops.target_probs(logits, sampling)  # (B, N, V)
        draws = ops.sample_from(probs, node_uniforms(uniforms, to_mx(tree.depth).astype(mx.int32)))
        return walk_by_tokens(tree, draws, depth)


def beam_nodes(tree: DraftTree) -> mx.array:
    """(B, W, L) node of every beam token; needs a tree packed from beams."""
    if tree.beam_to_node is None:
        raise InvalidInputError(
            "this verifier needs a tree packed from beams (tree.beam_to_node), e.g. 'prefix_tree'"
        )
    return to_mx(tree.beam_to_node).astype(mx.int32)


class RejectionVerifier(MlxVerifier):
    """Multi-draft recursive rejection sampling on the prefix tree of sampled beams (exact).

    At node u of depth d, the beams through u test their next token in increasing index with
    coin ``uniforms[b, d, 1+i]`` against the residual left by the earlier beams through u; the
    first accepted beam's child is taken, else the bonus is drawn from the final residual with
    ``uniforms[b, d, 0]`` (the target's own probabilities at a leaf). The loop runs over the W
    beams for all depths and rows at once: the residual of beam i at depth d is inherited by
    the later beams through the same node.
    """

    needs_draft_probs = True
    needs_sampled_draft = True
    uses_beam_uniforms = True

    def verify(self, tree, draft, target, sampling, uniforms=None) -> Verdict:
        depth, logits, uniforms = self.prepare(tree, draft, target, sampling, uniforms)
        nodes = beam_nodes(tree)  # (B, W, L)
        beams = to_mx(draft.beams).astype(mx.int32)
        draft_probs = to_mx(draft.draft_probs).astype(mx.float32)  # (B, W, L-1, V)
        batch, width, length = beams.shape
        target_probs = ops.target_probs(logits, sampling)  # (B, N, V)
        inner = nodes[:, :, :-1]  # (B, W, L-1): the node each drafted token hangs from
        residual = gather_nodes(target_probs, inner)  # (B, W, L-1, V)
        same_node = inner[:, :, None, :] == inner[:, None, :, :]  # (B, W, W, L-1) [k, i]
        # (B, W, L-1)
        coins = (
            None
            if uniforms is None
            else uniforms[:, : length - 1, 1 : width + 1].transpose(0, 2, 1)
        )
        accepted, remaining = [], []
        for i in range(width):
            probability = acceptance_probability(residual[:, i], draft_probs[:, i], beams[:, i, 1:])
            accepted.append(coin(probability, None if coins is None else coins[:, i]))  # (B, L-1)
            left = subtract_draft(residual[:, i], draft_probs[:, i])  # (B, L-1, V)
            remaining.append(left)
            later = same_node[:, :, i, :] & (mx.arange(width) > i)[None, :, None]  # (B, W, L-1)
            residual = mx.where(later[..., None], left[:, None], residual)
        accepted = mx.stack(accepted, axis=1)  # (B, W, L-1)
        # The first accepted beam through a node decides its child.
        earlier = mx.arange(width)[None, :] < mx.arange(width)[:, None]  # [k, i]: i < k
        beaten = mx.any(same_node & earlier[None, :, :, None] & accepted[:, None, :, :], axis=2)
        takes = accepted & ~beaten  # (B, W, L-1)
        child = nodes[:, :, 1:]
        # (B, N)
        node_taken = mx.any(
            (takes[..., None] & (child[..., None] == mx.arange(tree.size))).reshape(
                batch, -1, tree.size
            ),
            axis=1,
        )
        path, num_accepted, last = accepted_path(tree, node_taken, depth)
        # Bonus: the final residual at the last node (the residual after its last beam), or the
        # target's probabilities at a leaf.
        remaining = mx.concatenate(
            [mx.stack(remaining, axis=1), gather_nodes(target_probs, nodes[:, :, -1:])], axis=2
        )
        same_all = nodes[:, :, None, :] == nodes[:, None, :, :]  # (B, W, W, L) [k, i]
        # a later beam shares the node
        later_same = mx.any(same_all & earlier.T[None, :, :, None], axis=2)
        depth_ids = mx.broadcast_to(mx.arange(length)[None, None, :], nodes.shape)
        draws = ops.categorical(remaining, node_uniforms(uniforms, depth_ids))  # (B, W, L)
        pick = (
            (nodes == last[:, None, None])
            & (depth_ids == num_accepted[:, None, None])
            & ~later_same
        )
        bonus = mx.sum(mx.where(pick, draws, 0), axis=(1, 2))
        return Verdict(path=path, num_accepted=num_accepted, bonus_tokens=bonus.astype(mx.int32))
