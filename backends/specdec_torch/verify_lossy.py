"""Lossy verifiers on torch (twins of ``specdec.reference.verify_lossy``): they change the output
distribution, are flagged ``lossless = False`` and are never a default."""

from __future__ import annotations

import torch

from specdec.types import Verdict
from specdec_torch.sampling import compute_dtype, target_probs
from specdec_torch.verify import (
    TorchVerifier,
    acceptance_probability,
    beam_nodes,
    subtract_draft,
    walk_depth,
)

__all__ = ["RedrafterPublishedVerifier", "TypicalVerifier", "entropy"]


def entropy(probs: torch.Tensor) -> torch.Tensor:
    """Shannon entropy in nats over the last axis, 0 log 0 = 0. (..., V) -> (...)."""
    safe = torch.where(probs > 0, probs, 1.0)
    return -(torch.where(probs > 0, probs * torch.log(safe), 0.0)).sum(dim=-1)


class RedrafterPublishedVerifier(TorchVerifier):
    """ReDrafter's published rule: beam i's token at depth k+1 passes when
    ``uniforms[b, k, 1+i] < target_probs[x] / draft_probs[b, i, k, x]``; the beam with the most
    leading passes (lowest index on ties) wins; the bonus is drawn with ``uniforms[b, n, 0]`` from
    normalize(relu(target_probs - draft_probs)) at its first rejection, or from target_probs when
    the whole beam passed. All beams and depths are scored at once."""

    lossless = False
    needs_draft_probs = True
    uses_beam_uniforms = True

    @torch.inference_mode()
    def verify(self, tree, draft, target, sampling, uniforms=None) -> Verdict:
        depth = walk_depth(tree, draft)
        self.check_inputs(tree, draft, target, sampling, uniforms, depth)
        nodes = beam_nodes(tree, draft)  # (B, W, L)
        beams = draft.beams
        batch, width, length = beams.shape
        dtype = compute_dtype(target.logits.dtype)
        draft_probs = draft.draft_probs.to(dtype)  # (B, W, L-1, V)
        rows = torch.arange(batch, device=beams.device)
        # Every drafted token's test: target probabilities at its parent node.
        parent_nodes = nodes[:, :, :-1].reshape(batch, -1)  # (B, W*(L-1))
        probs = target_probs(target.logits[rows[:, None], parent_nodes], sampling).view(
            batch, width, length - 1, -1
        )
        probability = acceptance_probability(probs, draft_probs, beams[:, :, 1:])  # (B, W, L-1)
        if uniforms is None:
            passed = probability >= 1.0
        else:
            # (B, W, L-1)
            passed = uniforms[:, : length - 1, 1 : 1 + width].transpose(1, 2) < probability
        # (B, W): leading passes per beam
        leading = torch.cumprod(passed.to(torch.int64), dim=2).sum(dim=2)
        best = torch.argmax(leading, dim=1)  # first (lowest-index) longest beam
        accepted = leading[rows, best]  # (B,)
        steps = torch.arange(length, device=beams.device)
        path = torch.where(steps[None, :] <= accepted[:, None], nodes[rows, best], -1)  # (B, L)
        last = nodes[rows, best, accepted]
        bonus_probs = target_probs(target.logits[rows, last], sampling)  # (B, V)
        stop = accepted.clamp(max=length - 2)
        residual = subtract_draft(bonus_probs, draft_probs[rows, best, stop])
        bonus_probs = torch.where((accepted < length - 1)[:, None], residual, bonus_probs)
        bonus = self.categorical(bonus_probs, uniforms, accepted)
        return Verdict(path=path[:, : depth + 1], num_accepted=accepted, bonus_tokens=bonus)


class TypicalVerifier(TorchVerifier):
    """Medusa's typical acceptance: at node u descend to the first child whose token has target
    probability above min(epsilon, delta * exp(-entropy)); otherwise draw the bonus from
    target_probs at u with ``uniforms[b, d, 0]`` (argmax when greedy)."""

    lossless = False

    def __init__(self, epsilon: float = 0.09, delta: float = 0.3):
        self.epsilon = float(epsilon)
        self.delta = float(delta)

    @torch.inference_mode()
    def verify(self, tree, draft, target, sampling, uniforms=None) -> Verdict:
        depth = walk_depth(tree, draft)
        self.check_inputs(tree, draft, target, sampling, uniforms, depth)
        rows = torch.arange(tree.batch_size, device=tree.tokens.device)

        def choose(node, d):
            probs = target_probs(target.logits[rows, node], sampling)  # (B, V)
            # (B,)
            threshold = torch.clamp(self.delta * torch.exp(-entropy(probs)), max=self.epsilon)
            accept = torch.gather(probs, 1, tree.tokens) > threshold[:, None]  # (B, N)
            return accept, self.categorical(probs, uniforms, d)

        return self.walk(tree, depth, choose)
