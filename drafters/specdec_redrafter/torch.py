"""ReDrafter on torch: the drafter as a ``torch.nn.Module`` and beam search vectorised on the
device.

The torch twin of ``specdec_redrafter.reference`` (read that first: the recurrence variants,
the head and the beam search are explained there). It loads the same checkpoint files (through
``load_redrafter_checkpoint``) and reads the target's embedding and LM head tensors in place.

Beam search keeps all W beams of all B rows in one tensor: each step runs the recurrence and
the head on (B, W) states, scores the W*V extensions and keeps the best W with
``top_k_lowest_index`` (descending, equal scores to the lower flat index ``beam * V + token``,
as the reference's stable argsort; ``torch.topk`` alone does not promise that order). First-step
trick: before the first token every beam is the root alone, so step 1 runs the drafter once per
row and takes the top W of its V tokens, which is what the reference's "only beam 0 alive"
selects. With a vocabulary shortlist of S ids the head multiplies by those S rows only (gathered
once at load), beam search runs over S "local" ids, and chosen ids map back through the
shortlist; the shortlist is sorted, so ties still go to the lower token id. Shapes: B batch,
W beam width, L beam length (root included), V vocab, S the drafted vocabulary (V without a
shortlist), H hidden, E exit_dim.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from specdec.types import Draft, DraftContext
from specdec_redrafter.config import RedrafterConfig, check_weights
from specdec_redrafter.reference import BeamSettings, check_target_arrays
from specdec_torch.ops import (
    compute_dtype,
    draft_weight,
    placed,
    sample_from,
    target_probs,
    top_k_lowest_index,
    top_k_mask,
)

__all__ = ["RedrafterModule", "TorchRedrafterDrafter", "draft_log_probs"]


def draft_log_probs(logits: torch.Tensor, *, top_k: int | None = None) -> torch.Tensor:
    """log_softmax of the drafter's logits in float32 (float64 for float64), keeping only the
    top-k (ties to the lower id) when given; warped-out tokens get -inf. (..., V) -> (..., V)."""
    z = logits.to(compute_dtype(logits.dtype))
    if top_k is not None and top_k < z.shape[-1]:
        z = torch.where(top_k_mask(z, top_k), z, float("-inf"))
    return torch.log_softmax(z, dim=-1)


def _product(weights: dict, name: str, like: torch.Tensor, bias: bool, int8: bool | None):
    """``x -> x @ W.T (+ b)`` for ``weights[name + ".weight"]`` (and ``.bias``), held as ``like``
    (``placed``) or, where ``int8`` says so, rounded to int8 per row
    (``specdec_torch.ops.draft_weight``)."""
    weight = placed(weights[f"{name}.weight"], like)
    return draft_weight(weight, placed(weights[f"{name}.bias"], like) if bias else None, int8=int8)


class RedrafterModule(torch.nn.Module):
    """The drafter's own weights as products; the target's embedding and LM head are borrowed.

    weights: name -> array as in ``specdec_redrafter.config`` (checked). embed_tokens (V, H):
    the target's input embedding; lm_head (V, H): its LM head (needed for ``head="tied"``).
    int8: every product's weight (the head rows included) in int8 per row (True), in the
    embedding's dtype (False, exact), or as measured fastest here (None):
    ``specdec_torch.ops.draft_weight``, whose rounding is ``specdec.reference.quantize``'s.
    """

    def __init__(
        self,
        config: RedrafterConfig,
        weights: dict,
        *,
        embed_tokens: torch.Tensor,
        lm_head: torch.Tensor | None = None,
        int8: bool | None = False,
    ):
        super().__init__()
        check_weights(config, weights)
        check_target_arrays(config, embed_tokens, lm_head)
        self.config = config
        self.embed_tokens, self.lm_head = embed_tokens, lm_head
        product = lambda name, bias: _product(weights, name, embed_tokens, bias, int8)  # noqa: E731
        self.input_proj = (
            product("input_proj", True) if config.exit_dim != 2 * config.hidden_size else None
        )
        self.blocks = [product(f"lm_head.{i}.linear", True) for i in range(config.num_draft_layers)]
        self.shortlist = None
        if config.shortlist_size is not None:
            self.shortlist = placed(weights["vocab_shortlist"], embed_tokens, index=True)
        if config.head == "full":
            rows = placed(weights[f"lm_head.{config.num_draft_layers}.weight"], embed_tokens)
        else:
            self.head_proj = product("head_proj", False)
            rows = lm_head
        # (S, E) or (S, H): only the shortlisted rows are multiplied
        self.head = draft_weight(
            rows if self.shortlist is None else rows[self.shortlist], int8=int8
        )
        if config.rnn:
            self.rnn_w = product("rnn_w", False)
            self.rnn_u = product("rnn_u", True)

    def rnn_step(self, state: torch.Tensor, tokens: torch.Tensor, *, first: bool) -> torch.Tensor:
        """s_{t-1} (..., H), tokens (...) -> s_t (..., H); ``first`` marks t = 1 (state ignored)."""
        embedding = F.embedding(tokens, self.embed_tokens)
        if not self.config.rnn:
            return embedding if first else state + embedding  # cumulative embedding sum
        variant = self.config.rnn_variant
        if variant == "apple":  # s_0 = 0; s_t = SiLU(W e_t + U s_{t-1} + b)
            previous = torch.zeros_like(embedding) if first else state
            return F.silu(self.rnn_w(embedding) + self.rnn_u(previous))
        if variant == "trtllm":  # s_1 = W e_1; s_t = W e_t + U s_{t-1} + b
            return self.rnn_w(embedding) if first else self.rnn_w(embedding) + self.rnn_u(state)
        if variant == "paper":  # s_1 = e_1; s_t = SiLU(W e_t + U s_{t-1} + b)
            return embedding if first else F.silu(self.rnn_w(embedding) + self.rnn_u(state))
        raise ValueError(f"unknown rnn_variant {variant!r}")

    def forward(self, hidden: torch.Tensor, state: torch.Tensor) -> torch.Tensor:
        """Drafter logits over the drafted vocabulary. hidden (B, 1, H), state (B, w, H) ->
        (B, w, S)."""
        x = torch.cat([hidden.expand(-1, state.shape[1], -1), state], dim=-1)  # (B, w, 2H)
        if self.input_proj is not None:
            x = self.input_proj(x)  # (B, w, E)
        for block in self.blocks:
            x = x + F.silu(block(x))
        if self.config.head == "tied":
            x = self.head_proj(x)  # (B, w, H)
        return self.head(x)  # (B, w, S)

    def to_vocab(self, local: torch.Tensor) -> torch.Tensor:
        """Token ids of drafted-vocabulary ids (the identity without a shortlist)."""
        return local if self.shortlist is None else self.shortlist[local]

    def scatter_vocab(self, values: torch.Tensor, fill: float) -> torch.Tensor:
        """(..., S) values over the drafted vocabulary -> (..., V), ``fill`` outside the
        shortlist."""
        if self.shortlist is None:
            return values
        out = values.new_full((*values.shape[:-1], self.config.vocab_size), fill)
        return out.index_copy_(-1, self.shortlist, values)

    def beam_search(
        self,
        hidden: torch.Tensor,
        roots: torch.Tensor,
        *,
        width: int,
        length: int,
        keep_log_probs: bool,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """hidden (B, H), roots (B,) -> beams (B, W, L) best first, scores (B, W) joint log-probs,
        log_probs (B, W, L-1, V) of the distributions that scored each drafted token (or None)."""
        batch, vocab = roots.shape[0], self.config.draft_vocab_size
        hidden = hidden[:, None, :]  # (B, 1, H)
        beams = roots[:, None, None]  # (B, 1, 1): every beam is the root alone
        scores = torch.zeros(batch, 1, dtype=compute_dtype(hidden.dtype), device=roots.device)
        if width > vocab:  # too wide for the first-step trick: W copies, only beam 0 alive
            beams = beams.expand(batch, width, 1)
            scores = torch.full(
                (batch, width), float("-inf"), dtype=scores.dtype, device=roots.device
            )
            scores[:, 0] = 0.0
        state = torch.zeros(
            batch, beams.shape[1], self.config.hidden_size, dtype=hidden.dtype, device=roots.device
        )
        history = None
        for t in range(1, length):
            # 1. Advance every beam's state with its last token, then score the next token.
            state = self.rnn_step(state, beams[:, :, -1], first=t == 1)  # (B, w, H)
            # (B, w, V)
            log_probs = draft_log_probs(self(hidden, state), top_k=self.config.draft_top_k)
            # 2. Joint log-prob of every (beam, token) extension; keep the best W, ties to the lower
            # index.
            candidates = (scores[:, :, None] + log_probs).reshape(batch, -1)  # (B, w*V)
            scores, best = top_k_lowest_index(candidates, width)  # (B, W)
            parent, token = best // vocab, self.to_vocab(best % vocab)
            # 3. Gather the survivors' histories from their parents and append the new token.
            beams = torch.cat(
                [torch.gather(beams, 1, parent[:, :, None].expand(-1, -1, t)), token[:, :, None]],
                dim=2,
            )
            state = torch.gather(state, 1, parent[:, :, None].expand(-1, -1, state.shape[2]))
            if keep_log_probs:
                # (B, W, 1, V)
                chosen = torch.gather(log_probs, 1, parent[:, :, None].expand(-1, -1, vocab))[
                    :, :, None
                ]
                history = (
                    chosen
                    if history is None
                    else torch.cat(
                        [
                            torch.gather(
                                history, 1, parent[:, :, None, None].expand(-1, -1, t - 1, vocab)
                            ),
                            chosen,
                        ],
                        dim=2,
                    )
                )
        if history is not None:
            history = self.scatter_vocab(history, float("-inf"))  # (B, W, L-1, V)
        return beams, scores, history

    def sample_chains(
        self, hidden: torch.Tensor, roots: torch.Tensor, uniforms: torch.Tensor, sampling
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """W independent sampled drafts per row. uniforms (B, W, L): token k of chain i is
        ``sample_from(draft_probs[b, i, k-1], uniforms[b, i, k])``; ``draft_probs`` is
        ``target_probs(drafter logits, sampling)``. -> beams (B, W, L), draft_probs
        (B, W, L-1, V)."""
        batch, width, length = uniforms.shape
        hidden = hidden[:, None, :]
        columns = [roots[:, None].expand(batch, width)]
        probs_per_step = []
        state = torch.zeros(
            batch, 1, self.config.hidden_size, dtype=hidden.dtype, device=roots.device
        )
        for t in range(1, length):
            last = columns[-1][:, :1] if t == 1 else columns[-1]  # step 1: every chain is the root
            state = self.rnn_step(state, last, first=t == 1)  # (B, 1 or W, H)
            # (B, W, S)
            probs = target_probs(self(hidden, state), sampling).expand(batch, width, -1)
            if t == 1:
                state = state.expand(batch, width, -1)
            columns.append(self.to_vocab(sample_from(probs, uniforms[:, :, t])))
            probs_per_step.append(probs)
        return torch.stack(columns, dim=2), self.scatter_vocab(
            torch.stack(probs_per_step, dim=2), 0.0
        )


class TorchRedrafterDrafter(BeamSettings):
    """ReDrafter as a ``specdec.protocols.Drafter`` on torch (same options as the reference's
    ``RedrafterDrafter``): beam search by default; with ``sample=True`` and a sampling
    configuration, W independent chains drawn with ``context.uniforms`` (shape ``sample_shape``).
    int8: the drafter's weights in int8 where measured faster (None, the default), always (True)
    or never (False); see ``RedrafterModule``. Drafts change slightly, the output does not (the
    target verifies every drafted token)."""

    def __init__(
        self,
        config: RedrafterConfig,
        weights: dict,
        *,
        embed_tokens: torch.Tensor,
        lm_head: torch.Tensor | None = None,
        beam_width: int | None = None,
        beam_length: int | None = None,
        sample: bool = False,
        int8: bool | None = None,
    ):
        self.config = config
        self.module = RedrafterModule(
            config, weights, embed_tokens=embed_tokens, lm_head=lm_head, int8=int8
        ).eval()
        self.set_beams(config, beam_width, beam_length, sample)

    @torch.inference_mode()
    def propose(self, context: DraftContext) -> Draft:
        """Beams (B, W, L) continuing ``context.root_tokens`` (B,) given ``context.hidden``
        (B, H)."""
        device, dtype = self.module.embed_tokens.device, self.module.embed_tokens.dtype
        roots = torch.as_tensor(context.root_tokens, device=device).to(torch.int64)
        hidden = torch.as_tensor(context.hidden, device=device).to(dtype)
        batch = roots.shape[0]
        if tuple(hidden.shape) != (batch, self.config.hidden_size):
            raise ValueError(
                f"context.hidden has shape {tuple(hidden.shape)}, expected (B, H) = "
                f"{(batch, self.config.hidden_size)}"
            )
        if self.sample and not context.sampling.greedy:
            shape = (batch, self.beam_width, self.beam_length)
            if context.uniforms is None or tuple(np.shape(context.uniforms)) != shape:
                raise ValueError(
                    f"a sampling ReDrafter needs context.uniforms of shape (B, W, L) = {shape}, "
                    f"got {None if context.uniforms is None else tuple(np.shape(context.uniforms))}"
                )
            uniforms = torch.as_tensor(
                np.asarray(context.uniforms), dtype=compute_dtype(dtype), device=device
            )
            beams, draft_probs = self.module.sample_chains(
                hidden, roots, uniforms, context.sampling
            )
            return Draft(root_tokens=roots, beams=beams, draft_probs=draft_probs, sampled=True)
        beams, _, log_probs = self.module.beam_search(
            hidden,
            roots,
            width=self.beam_width,
            length=self.beam_length,
            keep_log_probs=context.want_draft_probs,
        )
        draft_probs = torch.exp(log_probs) if context.want_draft_probs else None
        return Draft(root_tokens=roots, beams=beams, draft_probs=draft_probs, sampled=False)
