"""Verifiers on torch, vectorised over the batch (twins of ``specdec.reference.verify``).

Every rule walks the tree from the root one depth at a time, all rows together: at depth d each
row sits on one node, picks a child (or stops and draws its bonus token), and rows that stopped
stay put. The walk is D+1 rounds of small tensor ops with no host read; D is the draft's beam
length minus one (the prefix tree's depth), or for head drafts the tree's largest depth (one
host read of a scalar; static trees only).

Randomness as in the reference: ``uniforms[b, d, 0]`` draws the token at depth d
(``sample_from``), ``uniforms[b, d, 1 + i]`` tests beam i's token at depth d+1; with
``uniforms=None`` (greedy) a draw is the argmax and a test passes only with probability >= 1.
"""

from __future__ import annotations

from typing import Any, Callable

import torch

from specdec.capabilities import VerifierRule
from specdec.reference.verify import check_uniform_shape, check_verifier_inputs
from specdec.types import Draft, DraftTree, SamplingConfig, TargetOutput, Verdict
from specdec_torch.sampling import compute_dtype, greedy_tokens, sample_from, target_probs

__all__ = [
    "ExactTreeVerifier",
    "GreedyVerifier",
    "RejectionVerifier",
    "TorchVerifier",
    "acceptance_probability",
    "beam_nodes",
    "subtract_draft",
    "walk_depth",
]


def walk_depth(tree: DraftTree, draft: Draft | None) -> int:
    """D, the largest depth of a real node: L-1 for a tree packed from beams (B, W, L), else read
    from ``tree.depth`` (padding nodes sit at depth 1, never deeper than a real node)."""
    if draft is not None and draft.beams is not None:
        return int(draft.beams.shape[2]) - 1
    return int(tree.depth.max())


def acceptance_probability(
    residual_probs: torch.Tensor, draft_probs: torch.Tensor, tokens: torch.Tensor
) -> torch.Tensor:
    """min(1, residual_probs[x] / draft_probs[x]) per row; a token the drafter gave no mass is
    accepted iff the target gives it some. residual_probs, draft_probs (..., V), tokens (...) ->
    (...)."""
    numerator = torch.gather(residual_probs, -1, tokens[..., None])[..., 0]
    denominator = torch.gather(draft_probs, -1, tokens[..., None])[..., 0].to(numerator.dtype)
    ratio = torch.clamp(numerator / torch.where(denominator > 0, denominator, 1.0), max=1.0)
    return torch.where(denominator > 0, ratio, (numerator > 0).to(numerator.dtype))


def subtract_draft(residual_probs: torch.Tensor, draft_probs: torch.Tensor) -> torch.Tensor:
    """normalize(max(residual_probs - draft_probs, 0)); unchanged where nothing is left.
    (..., V)."""
    leftover = torch.clamp(residual_probs - draft_probs.to(residual_probs.dtype), min=0.0)
    mass = leftover.sum(dim=-1, keepdim=True)
    return torch.where(mass > 0, leftover / torch.where(mass > 0, mass, 1.0), residual_probs)


def beam_nodes(tree: DraftTree, draft: Draft) -> torch.Tensor:
    """The node of every beam token, (B, W, L) int64: ``tree.beam_to_node``, or found by walking
    each beam down the tree (first real child with the beam's token)."""
    if tree.beam_to_node is not None:
        return tree.beam_to_node
    beams = draft.beams
    batch, width, length = beams.shape
    real = _real_children(tree)  # (B, N)
    nodes = [torch.zeros(batch, width, dtype=torch.int64, device=beams.device)]
    for k in range(1, length):
        # (B, W, N)
        match = (
            real[:, None, :]
            & (tree.parents[:, None, :] == nodes[-1][..., None])
            & (tree.tokens[:, None, :] == beams[:, :, k, None])
        )
        nodes.append(torch.argmax(match.to(torch.int8), dim=-1))
    return torch.stack(nodes, dim=2)


def _real_children(tree: DraftTree) -> torch.Tensor:
    """(B, N) bool: node i is a real (unpadded) non-root node."""
    index = torch.arange(tree.size, device=tree.tokens.device)
    return (index[None, :] >= 1) & (index[None, :] < tree.num_nodes[:, None])


class TorchVerifier(VerifierRule):
    """Shared checks and the batched tree walk; subclasses implement ``verify`` and set the class
    attributes of ``specdec.capabilities.VerifierRule``."""

    def check_inputs(
        self,
        tree: DraftTree,
        draft: Draft,
        target: TargetOutput,
        sampling: SamplingConfig,
        uniforms: Any,
        depth: int,
    ) -> None:
        check_verifier_inputs(self, tree, draft, target, backend="torch")
        if not self.uses_uniforms:
            return
        width = 0 if draft is None or draft.beams is None else int(draft.beams.shape[1])
        check_uniform_shape(
            self,
            None if uniforms is None else tuple(uniforms.shape),
            sampling,
            tree.batch_size,
            depth,
            width,
            backend="torch",
        )

    @staticmethod
    def categorical(
        probs: torch.Tensor, uniforms: torch.Tensor | None, depth: torch.Tensor | int
    ) -> torch.Tensor:
        """A token per row from probs (B, V) with ``uniforms[b, depth, 0]`` (argmax when greedy)."""
        if uniforms is None:
            return greedy_tokens(probs)
        if isinstance(depth, int):
            u = uniforms[:, depth, 0]
        else:
            u = uniforms[torch.arange(probs.shape[0], device=probs.device), depth, 0]
        return sample_from(probs, u)

    @staticmethod
    def walk(
        tree: DraftTree,
        depth: int,
        choose: Callable[[torch.Tensor, int], tuple[torch.Tensor, torch.Tensor]],
    ) -> Verdict:
        """Walk all rows from the root for ``depth`` + 1 rounds.

        choose(node (B,), d) -> (accept (B, N) bool over candidate children, bonus (B,) int64):
        the row descends to the first real child of ``node`` (node order) marked in ``accept``,
        or stops and emits ``bonus``. Returns the Verdict with path (B, depth + 1).
        """
        batch, device = tree.batch_size, tree.tokens.device
        real = _real_children(tree)
        node = torch.zeros(batch, dtype=torch.int64, device=device)
        alive = torch.ones(batch, dtype=torch.bool, device=device)
        bonus = torch.zeros(batch, dtype=torch.int64, device=device)
        steps = [node]
        for d in range(depth + 1):
            accept, token = choose(node, d)
            candidates = accept & real & (tree.parents == node[:, None])  # (B, N)
            has_child = candidates.any(dim=1)
            child = torch.argmax(candidates.to(torch.int8), dim=1)  # first marked child
            bonus = torch.where(alive & ~has_child, token, bonus)
            alive = alive & has_child
            node = torch.where(alive, child, node)
            if d < depth:
                steps.append(torch.where(alive, child, -1))
        path = torch.stack(steps, dim=1)  # (B, D+1)
        return Verdict(path=path, num_accepted=(path >= 0).sum(dim=1) - 1, bonus_tokens=bonus)


def argmax_walk(tree: DraftTree, target: TargetOutput, depth: int) -> Verdict:
    """The walk that follows the target's argmax (lowest id on ties) while it is a drafted child:
    every node's argmax taken at once, (B, N), instead of a distribution per depth."""
    choice = greedy_tokens(target.logits)  # (B, N)
    rows = torch.arange(tree.batch_size, device=choice.device)

    def choose(node, d):
        token = choice[rows, node]
        return tree.tokens == token[:, None], token

    return TorchVerifier.walk(tree, depth, choose)


class GreedyVerifier(TorchVerifier):
    """Follow the target's argmax (lowest id on ties) while it is a drafted child; exactly plain
    greedy decoding of the target. Ignores temperature, top-k and top-p."""

    uses_uniforms = False

    @torch.inference_mode()
    def verify(self, tree, draft, target, sampling, uniforms=None) -> Verdict:
        depth = walk_depth(tree, draft)
        self.check_inputs(tree, draft, target, sampling, uniforms, depth)
        return argmax_walk(tree, target, depth)


class ExactTreeVerifier(TorchVerifier):
    """The exact tree walk: at node u of depth d draw x from target_probs(logits[u]) with
    ``uniforms[b, d, 0]``; descend if x is a drafted child, else emit x. Lossless for any tree
    fixed before the target's randomness (beam search, top-k heads)."""

    @torch.inference_mode()
    def verify(self, tree, draft, target, sampling, uniforms=None) -> Verdict:
        depth = walk_depth(tree, draft)
        self.check_inputs(tree, draft, target, sampling, uniforms, depth)
        if sampling.greedy:  # a one-hot distribution's draw is its argmax, whatever the uniform
            return argmax_walk(tree, target, depth)
        rows = torch.arange(tree.batch_size, device=tree.tokens.device)

        def choose(node, d):
            token = self.categorical(target_probs(target.logits[rows, node], sampling), uniforms, d)
            return tree.tokens == token[:, None], token

        return self.walk(tree, depth, choose)


class RejectionVerifier(TorchVerifier):
    """Multi-draft recursive rejection sampling on the prefix tree of sampled beams (see the
    reference for the rule and why it is exact). The beams through the current node are tried in
    increasing beam index, each a few (B, V) ops: a loop over W per depth, not over rows."""

    needs_draft_probs = True
    needs_sampled_draft = True
    uses_beam_uniforms = True

    @torch.inference_mode()
    def verify(self, tree, draft, target, sampling, uniforms=None) -> Verdict:
        depth = walk_depth(tree, draft)
        self.check_inputs(tree, draft, target, sampling, uniforms, depth)
        nodes = beam_nodes(tree, draft)  # (B, W, L)
        beams, draft_probs = draft.beams, draft.draft_probs  # (B, W, L), (B, W, L-1, V)
        width, length = beams.shape[1], beams.shape[2]
        rows = torch.arange(tree.batch_size, device=beams.device)
        dtype = compute_dtype(target.logits.dtype)

        def choose(node, d):
            residual = target_probs(target.logits[rows, node], sampling)  # (B, V)
            accepted = torch.full_like(node, -1)
            if d + 1 < length:
                for i in range(width):
                    # beam i passes through node, none accepted yet
                    on = (accepted < 0) & (nodes[:, i, d] == node)
                    proposal = draft_probs[:, i, d].to(dtype)  # (B, V)
                    probability = acceptance_probability(residual, proposal, beams[:, i, d + 1])
                    if uniforms is None:
                        passed = probability >= 1.0
                    else:
                        passed = uniforms[:, d, 1 + i] < probability
                    accepted = torch.where(on & passed, nodes[:, i, d + 1], accepted)
                    rejected = (on & ~passed)[:, None]
                    residual = torch.where(rejected, subtract_draft(residual, proposal), residual)
            accept = torch.arange(tree.size, device=node.device)[None, :] == accepted[:, None]
            return accept, self.categorical(residual, uniforms, d)

        return self.walk(tree, depth, choose)
