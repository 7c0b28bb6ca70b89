"""Lossy verifiers in MLX ops: ReDrafter's published rule and Medusa's typical acceptance.

They change the output distribution (``lossless = False``); same rules, uniforms and tie
breaks as ``specdec.reference.verify_lossy``. Shapes as in ``specdec_mlx.verify``.
"""

from __future__ import annotations

import mlx.core as mx

from specdec.types import Verdict
from specdec_mlx import ops
from specdec_mlx.acceptance import acceptance_probability, coin, entropy, subtract_draft
from specdec_mlx.arrays import to_mx
from specdec_mlx.verify import MlxVerifier, accepted_path, beam_nodes, gather_nodes


class RedrafterPublishedVerifier(MlxVerifier):
    """Per beam i and depth k, the drafted token passes when ``uniforms[b, k, 1+i] <
    target_probs[x] / draft_probs[b, i, k, x]`` (probabilities at the beam's node of depth k);
    the beam with the most leading passes wins (lowest index on ties); the bonus is drawn with
    ``uniforms[b, n, 0]`` from normalize(relu(target - draft)) at its first rejection, or from
    the target's probabilities when the whole beam passed. No top-50 is applied."""

    lossless = False
    needs_draft_probs = True
    uses_beam_uniforms = True

    def verify(self, tree, draft, target, sampling, uniforms=None) -> Verdict:
        depth, logits, uniforms = self.prepare(tree, draft, target, sampling, uniforms)
        nodes = beam_nodes(tree)  # (B, W, L)
        beams = to_mx(draft.beams).astype(mx.int32)
        draft_probs = to_mx(draft.draft_probs).astype(mx.float32)  # (B, W, L-1, V)
        batch, width, length = beams.shape
        beam_probs = gather_nodes(ops.target_probs(logits, sampling), nodes)  # (B, W, L, V)
        # (B, W, L-1)
        probability = acceptance_probability(beam_probs[:, :, :-1], draft_probs, beams[:, :, 1:])
        coins = (
            None
            if uniforms is None
            else uniforms[:, : length - 1, 1 : width + 1].transpose(0, 2, 1)
        )
        passes = coin(probability, coins).astype(mx.int32)
        leading = mx.sum(mx.cumprod(passes, axis=2), axis=2)  # (B, W): leading passes of each beam
        best_length = mx.max(leading, axis=1)  # (B,)
        best = ops.first_argmax(leading)  # lowest beam among the longest
        best_nodes = mx.take_along_axis(nodes, best[:, None, None], axis=1)[:, 0]  # (B, L)
        steps = mx.arange(length)[None, :]
        path = mx.where(steps <= best_length[:, None], best_nodes, -1)
        chosen = lambda values: (
            mx.take_along_axis(  # values (B, W, J, V) at beam best, depth best_length
                mx.take_along_axis(values, best[:, None, None, None], axis=1)[:, 0],
                mx.minimum(best_length, values.shape[2] - 1)[:, None, None],
                axis=1,
            )[:, 0]
        )
        probs = chosen(beam_probs)  # (B, V)
        residual = subtract_draft(probs, chosen(draft_probs))
        probs = mx.where((best_length < length - 1)[:, None], residual, probs)
        draw_uniforms = (
            None
            if uniforms is None
            else mx.take_along_axis(uniforms[:, :, 0], best_length[:, None], axis=1)[:, 0]
        )
        bonus = ops.categorical(probs, draw_uniforms)
        return Verdict(
            path=path.astype(mx.int32),
            num_accepted=best_length.astype(mx.int32),
            bonus_tokens=bonus,
        )


class TypicalVerifier(MlxVerifier):
    """Medusa's typical acceptance: from node u descend to the first child whose token has
    target probability above min(epsilon, delta * exp(-entropy)) at u; otherwise the bonus is
    drawn from target_probs at u with ``uniforms[b, depth(u), 0]`` (argmax when greedy)."""

    lossless = False

    def __init__(self, epsilon: float = 0.09, delta: float = 0.3):
        self.epsilon = float(epsilon)
        self.delta = float(delta)

    def verify(self, tree, draft, target, sampling, uniforms=None) -> Verdict:
        depth, logits, uniforms = self.prepare(tree, draft, target, sampling, uniforms)
        probs = ops.target_probs(logits, sampling)  # (B, N, V)
        threshold = mx.minimum(self.epsilon, self.delta * mx.exp(-entropy(probs)))  # (B, N)
        parents = mx.maximum(to_mx(tree.parents).astype(mx.int32), 0)
        tokens = to_mx(tree.tokens).astype(mx.int32)
        parent_probs = gather_nodes(probs, parents)  # (B, N, V)
        token_probs = mx.take_along_axis(parent_probs, tokens[..., None], axis=2)[..., 0]
        accepted = token_probs > mx.take_along_axis(threshold, parents, axis=1)
        path, num_accepted, last = accepted_path(tree, accepted, depth)
        last_probs = gather_nodes(probs, last[:, None])[:, 0]  # (B, V)
        draw_uniforms = (
            None
            if uniforms is None
            else mx.take_along_axis(uniforms[:, :, 0], num_accepted[:, None], axis=1)[:, 0]
        )
        bonus = ops.categorical(last_probs, draw_uniforms)
        return Verdict(path=path, num_accepted=num_accepted, bonus_tokens=bonus)
