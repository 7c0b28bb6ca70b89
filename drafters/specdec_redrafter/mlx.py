"""ReDrafter on MLX: the drafter as an ``mlx.nn.Module`` and beam search as one lazy graph.

The MLX twin of ``specdec_redrafter.reference`` (read that first: recurrence variants, head,
beam search). ``RedrafterModule``'s parameter names are the checkpoint's names, so the same
``model.safetensors`` (trained in PyTorch or anywhere else) loads unchanged; the target's
embedding and LM head are borrowed, not copied.

Beam search keeps all W beams of all B rows in one array: each step runs the recurrence and the
head on (B, W) states and keeps the best W of the W*V extensions with ``top_indices`` (best
first, equal scores to the lower flat index ``beam * V + token``, as the reference's stable
argsort). Only beam 0 is alive at the first step (the others score -inf), the reference's
first-step trick. Nothing is evaluated here: the decode loop's evaluation point runs the draft
together with the target forward. With a vocabulary shortlist the head uses only the S
shortlisted rows (gathered once) and beam search runs over S local ids, mapped back through
the sorted shortlist (ties keep going to the lower token id). Shapes: B batch, W beam width,
L beam length (root included), V vocab, S the drafted vocabulary (V without a shortlist),
H hidden, E exit_dim.
"""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn
import numpy as np

from specdec.types import Draft, DraftContext
from specdec_mlx import ops
from specdec_redrafter.config import RedrafterConfig, check_weights
from specdec_redrafter.reference import BeamSettings, check_target_arrays

__all__ = ["MlxRedrafterDrafter", "RedrafterModule", "draft_log_probs"]


def draft_log_probs(logits: mx.array, *, top_k: int | None = None) -> mx.array:
    """log_softmax of the drafter's logits (float32), keeping only the top-k (ties to the lower
    id) when given; warped-out tokens get -inf. (..., V) -> (..., V)."""
    z = logits.astype(mx.float32)
    if top_k is not None and top_k < z.shape[-1]:
        z = mx.where(ops.top_k_mask(z, top_k), z, float("-inf"))
    return ops.log_softmax(z)


class _Block(nn.Module):
    """Residual SiLU block x + SiLU(Linear(x)); its weights are ``lm_head.{i}.linear.*``."""

    def __init__(self, dim: int):
        super().__init__()
        self.linear = nn.Linear(dim, dim)

    def __call__(self, x: mx.array) -> mx.array:
        return x + nn.silu(self.linear(x))


class RedrafterModule(nn.Module):
    """The drafter's own weights, named as in ``specdec_redrafter.config``; ``from_weights``
    loads a checkpoint's arrays (checked against the config) as ``like``, a target array
    (``specdec_mlx.ops.placed``)."""

    def __init__(self, config: RedrafterConfig):
        super().__init__()
        hidden, exit_dim = config.hidden_size, config.exit_dim
        self.config = config
        if exit_dim != 2 * hidden:
            self.input_proj = nn.Linear(2 * hidden, exit_dim)
        head = (
            [nn.Linear(exit_dim, config.draft_vocab_size, bias=False)]
            if config.head == "full"
            else []
        )
        self.lm_head = [_Block(exit_dim) for _ in range(config.num_draft_layers)] + head
        if config.head == "tied":
            self.head_proj = nn.Linear(exit_dim, hidden, bias=False)
        if config.rnn:
            self.rnn_w = nn.Linear(hidden, hidden, bias=False)
            self.rnn_u = nn.Linear(hidden, hidden)

    @classmethod
    def from_weights(
        cls, config: RedrafterConfig, weights: dict, *, like: mx.array
    ) -> RedrafterModule:
        check_weights(config, weights)
        module = cls(config)
        weights = dict(weights)
        shortlist = weights.pop("vocab_shortlist", None)
        full = f"lm_head.{config.num_draft_layers}.weight"
        if shortlist is not None and full in weights:  # a full head keeps only the shortlisted rows
            weights[full] = np.asarray(weights[full])[np.asarray(shortlist, dtype=np.int64)]
        module.load_weights(
            [(name, ops.placed(w, like)) for name, w in weights.items()],
            strict=True,
        )
        mx.eval(module.parameters())
        return module

    def rnn_step(self, state: mx.array, embedding: mx.array, *, first: bool) -> mx.array:
        """s_{t-1}, e_t -> s_t, all (..., H); ``first`` marks t = 1 (state ignored)."""
        cfg = self.config
        if not cfg.rnn:
            return embedding if first else state + embedding  # cumulative embedding sum
        w_e = self.rnn_w(embedding)
        if cfg.rnn_variant == "apple":  # s_0 = 0; s_t = SiLU(W e_t + U s_{t-1} + b)
            return nn.silu(w_e + self.rnn_u(mx.zeros_like(embedding) if first else state))
        if cfg.rnn_variant == "trtllm":  # s_1 = W e_1; s_t = W e_t + U s_{t-1} + b
            return w_e if first else w_e + self.rnn_u(state)
        return embedding if first else nn.silu(w_e + self.rnn_u(state))  # "paper": s_1 = e_1

    def __call__(
        self, hidden: mx.array, state: mx.array, lm_head: mx.array | None = None
    ) -> mx.array:
        """Drafter logits over the drafted vocabulary. hidden (B, 1, H) or (B, W, H), state
        (B, W, H), lm_head: the target's LM head rows of the drafted vocabulary (S, H) ->
        (B, W, S)."""
        hidden = mx.broadcast_to(hidden, state.shape)
        x = mx.concatenate([hidden, state], axis=-1)  # (B, W, 2H)
        if "input_proj" in self:
            x = self.input_proj(x)  # (B, W, E)
        blocks = self.lm_head[: self.config.num_draft_layers]
        for block in blocks:
            x = block(x)
        if self.config.head == "full":
            return self.lm_head[-1](x)
        return self.head_proj(x) @ lm_head.T  # (B, W, H) -> (B, W, S)


class MlxRedrafterDrafter(BeamSettings):
    """ReDrafter as a ``specdec.protocols.Drafter`` on the mlx backend.

    config, weights: as loaded by ``load_redrafter_checkpoint``; embed_tokens, lm_head (V, H):
    the target's MLX arrays (lm_head needed for ``head="tied"``); beam_width / beam_length
    override the config; sample: draw W independent chains with the loop's uniforms when the
    sampling is not greedy (``sample_shape`` (W, L), ``sampled_proposals``); int8: as on torch,
    but MLX computes in the weights' dtype, so only None and False are taken (``ops.draft_weight``).
    """

    def __init__(
        self,
        config: RedrafterConfig,
        weights: dict,
        *,
        embed_tokens: mx.array,
        lm_head: mx.array | None = None,
        beam_width: int | None = None,
        beam_length: int | None = None,
        sample: bool = False,
        int8: bool | None = None,
    ):
        ops.draft_weight(embed_tokens, int8=int8)  # refuses int8=True with the reason
        embed_tokens = ops.as_array(embed_tokens)
        lm_head = None if lm_head is None else ops.as_array(lm_head)
        check_target_arrays(config, embed_tokens, lm_head)
        self.config = config
        self.module = RedrafterModule.from_weights(config, weights, like=embed_tokens)
        self.embed_tokens, self.lm_head = embed_tokens, lm_head
        self.shortlist = None
        if config.shortlist_size is not None:
            self.shortlist = ops.placed(weights["vocab_shortlist"], embed_tokens, index=True)
        # (S, H)
        self.head_rows = (
            lm_head if lm_head is None or self.shortlist is None else lm_head[self.shortlist]
        )
        self.set_beams(config, beam_width, beam_length, sample)

    def _log_probs(self, hidden: mx.array, state: mx.array) -> mx.array:
        """Warped drafter log-probs of the next token. hidden (B, H), state (B, W, H) ->
        (B, W, S)."""
        return draft_log_probs(
            self.module(hidden[:, None, :], state, self.head_rows), top_k=self.config.draft_top_k
        )

    def _to_vocab(self, local: mx.array) -> mx.array:
        """Token ids of drafted-vocabulary ids (the identity without a shortlist)."""
        return local if self.shortlist is None else self.shortlist[local]

    def _scatter_vocab(self, values: mx.array, fill: float) -> mx.array:
        """(..., S) over the drafted vocabulary -> (..., V), ``fill`` outside the shortlist."""
        if self.shortlist is None:
            return values
        out = mx.full((*values.shape[:-1], self.config.vocab_size), fill, dtype=values.dtype)
        out[..., self.shortlist] = values
        return out

    def beam_search(self, hidden: mx.array, roots: mx.array, *, want_draft_probs: bool = False):
        """Beams (B, W, L) int32 best first, scores (B, W) and, when wanted, draft_probs
        (B, W, L-1, V). hidden (B, H), roots (B,).

        First step: every beam is the root alone and only beam 0 is alive, so the best W of
        the W*V extensions are beam 0's best W tokens (its flat indices come first on ties);
        the drafter runs once per row (needs W <= V, else the general step handles it).
        """
        batch, vocab, width = roots.shape[0], self.config.draft_vocab_size, self.beam_width
        start = mx.zeros((batch, 1, self.config.hidden_size), dtype=hidden.dtype)
        # (B, 1, H)
        state = self.module.rnn_step(start, self.embed_tokens[roots][:, None, :], first=True)
        log_probs = self._log_probs(hidden, state)  # (B, 1, S)
        history = [mx.broadcast_to(log_probs, (batch, width, vocab))] if want_draft_probs else []
        if width <= vocab:
            local = ops.top_indices(log_probs[:, 0], width)  # (B, W)
            scores = mx.take_along_axis(log_probs[:, 0], local, axis=1)
            token = self._to_vocab(local).astype(roots.dtype)
            beams = mx.concatenate(
                [mx.broadcast_to(roots[:, None, None], (batch, width, 1)), token[:, :, None]],
                axis=2,
            )
            state = mx.broadcast_to(state, (batch, width, state.shape[2]))
            first_step = 2
        else:  # W > V: some beams start dead; run the general step from "only beam 0 alive"
            beams = mx.broadcast_to(roots[:, None, None], (batch, width, 1))
            scores = mx.where(mx.arange(width) == 0, 0.0, float("-inf"))[None] + mx.zeros(
                (batch, 1)
            )
            state, history, first_step = (
                mx.zeros((batch, width, self.config.hidden_size), dtype=hidden.dtype),
                [],
                1,
            )
        for t in range(first_step, self.beam_length):
            # 1. Advance every beam's state with its last token, then score the next token.
            # (B, W, H)
            state = self.module.rnn_step(state, self.embed_tokens[beams[:, :, -1]], first=t == 1)
            log_probs = self._log_probs(hidden, state)  # (B, W, S)
            # 2. Joint log-prob of every (beam, token) extension; keep the best W, ties to the lower
            # index.
            candidates = (scores[:, :, None] + log_probs).reshape(batch, width * vocab)
            best = ops.top_indices(candidates, width)  # (B, W)
            parent, token = best // vocab, self._to_vocab(best % vocab).astype(beams.dtype)
            scores = mx.take_along_axis(candidates, best, axis=1)
            # 3. Gather the surviving beams' histories from their parents and append the new token.
            beams = mx.concatenate(
                [mx.take_along_axis(beams, parent[:, :, None], axis=1), token[:, :, None]], axis=2
            )
            state = mx.take_along_axis(state, parent[:, :, None], axis=1)
            if want_draft_probs:
                history = [mx.take_along_axis(h, parent[:, :, None], axis=1) for h in history]
                history.append(mx.take_along_axis(log_probs, parent[:, :, None], axis=1))
        draft_probs = (
            self._scatter_vocab(mx.exp(mx.stack(history, axis=2)), 0.0)
            if want_draft_probs
            else None
        )
        return beams.astype(mx.int32), scores, draft_probs

    def sample_chains(self, hidden: mx.array, roots: mx.array, uniforms: mx.array, sampling):
        """W independent chains per row: token k of chain i is drawn from draft_probs[b, i, k-1]
        with ``uniforms[b, i, k]``. Returns beams (B, W, L) int32 and draft_probs (B, W, L-1, V)."""
        batch, width, length = uniforms.shape
        tokens = [mx.broadcast_to(roots[:, None], (batch, width)).astype(mx.int32)]
        state = mx.zeros((batch, width, self.config.hidden_size), dtype=hidden.dtype)
        draft_probs = []
        for t in range(1, length):
            # (B, W, H)
            state = self.module.rnn_step(state, self.embed_tokens[tokens[-1]], first=t == 1)
            # (B, W, S)
            probs = ops.target_probs(
                self.module(hidden[:, None, :], state, self.head_rows), sampling
            )
            draft_probs.append(probs)
            tokens.append(
                self._to_vocab(ops.sample_from(probs, uniforms[:, :, t])).astype(mx.int32)
            )
        return mx.stack(tokens, axis=2), self._scatter_vocab(mx.stack(draft_probs, axis=2), 0.0)

    def propose(self, context: DraftContext) -> Draft:
        """Beams (B, W, L) continuing ``context.root_tokens`` given ``context.hidden`` (B, H)."""
        roots = ops.as_array(context.root_tokens, dtype=mx.int32)
        hidden = ops.as_array(context.hidden, dtype=self.embed_tokens.dtype)
        batch = roots.shape[0]
        if tuple(hidden.shape) != (batch, self.config.hidden_size):
            raise ValueError(
                f"context.hidden has shape {tuple(hidden.shape)}, expected (B, H) = "
                f"{(batch, self.config.hidden_size)}"
            )
        if self.sample and not context.sampling.greedy:
            shape = (batch, self.beam_width, self.beam_length)
            if context.uniforms is None or tuple(context.uniforms.shape) != shape:
                raise ValueError(
                    f"a sampling ReDrafter needs context.uniforms of shape (B, W, L) = {shape}, "
                    f"got {None if context.uniforms is None else tuple(context.uniforms.shape)}"
                )
            beams, draft_probs = self.sample_chains(
                hidden, roots, ops.as_array(context.uniforms), context.sampling
            )
            return Draft(root_tokens=roots, beams=beams, draft_probs=draft_probs, sampled=True)
        beams, _, draft_probs = self.beam_search(
            hidden, roots, want_draft_probs=context.want_draft_probs
        )
        return Draft(root_tokens=roots, beams=beams, draft_probs=draft_probs, sampled=False)
