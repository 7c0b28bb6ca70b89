"""ReDrafter drafter, float64 NumPy reference (arXiv 2403.09919, sections 3.1-3.2).

The drafter is a recurrent model over the target's own token embeddings. For a beam whose
tokens so far are x_1 (the root, already chosen by the target) .. x_t, the state s_t
summarises them (``rnn_step``), and the drafter's logits for x_{t+1} are

    x = [h ; s_t]                          (2H,)  h: the target's last hidden state, fixed
    x = input_proj(x)                      (E,)   only when exit_dim != 2H
    x = x + SiLU(Linear_i(x)), i < layers  (E,)   residual blocks
    logits = head(x)                       (V,)   full: Linear(E -> V); tied: lm_head @ head_proj
    logits = restrict_logits(logits, S)    (V,)   -inf outside the vocabulary shortlist, if any

(``drafter_logits``). Beam search of width W and length L (``beam_search``) turns them into W
candidate continuations of the root; with a sampling configuration the drafter can instead
draw W independent chains (``sample_chains``). Shapes: B batch, W beam width, L beam length
(root included), V vocab, H hidden, E exit_dim.
"""

from __future__ import annotations

import attrs
import numpy as np

from specdec.capabilities import DrafterCaps

from specdec.reference.quantize import (
    check_int8_option,
    dequantize_rows,
    quantize_rows,
    quantized_weights,
)
from specdec.reference.sampling import sample_from, target_probs
from specdec.drafting.shortlist import restrict_logits
from specdec.types import Draft, DraftContext, SamplingConfig
from specdec_redrafter.config import RedrafterConfig, beam_tree_size, check_weights

__all__ = [
    "BeamSearchResult",
    "RedrafterDrafter",
    "beam_search",
    "draft_log_probs",
    "drafter_features",
    "drafter_logits",
    "rnn_step",
    "sample_chains",
    "silu",
]


def product_weights(config: RedrafterConfig) -> list[str]:
    """Names of the weights that multiply an input (everything but biases and the shortlist)."""
    return [
        "input_proj.weight",
        "head_proj.weight",
        "rnn_w.weight",
        "rnn_u.weight",
        f"lm_head.{config.num_draft_layers}.weight",
    ] + [f"lm_head.{i}.linear.weight" for i in range(config.num_draft_layers)]


def silu(x: np.ndarray) -> np.ndarray:
    """SiLU(x) = x * sigmoid(x), written without overflow: x/2 * (1 + tanh(x/2))."""
    return 0.5 * x * (1.0 + np.tanh(0.5 * x))


def _linear(x: np.ndarray, weight: np.ndarray, bias: np.ndarray | None = None) -> np.ndarray:
    """x (..., in) @ weight.T (out, in) + bias (out,) -> (..., out)."""
    y = x @ weight.T
    return y if bias is None else y + bias


def rnn_step(
    config: RedrafterConfig, weights: dict, state: np.ndarray, embedding: np.ndarray, *, first: bool
) -> np.ndarray:
    """One step of the drafter's recurrence: s_{t-1}, e_t -> s_t (all (..., H)).

    ``embedding`` is the target's embedding of the beam's last token (e_1: the root);
    ``first`` marks t = 1, where ``state`` is ignored. See ``RedrafterConfig`` for the variants.
    """
    if not config.rnn:
        return embedding if first else state + embedding  # cumulative embedding sum
    w_e = _linear(embedding, weights["rnn_w.weight"])  # W e_t
    u, b = weights["rnn_u.weight"], weights["rnn_u.bias"]
    variant = config.rnn_variant
    if variant == "apple":  # s_0 = 0; s_t = SiLU(W e_t + U s_{t-1} + b)
        previous = np.zeros_like(embedding) if first else state
        return silu(w_e + _linear(previous, u, b))
    if variant == "trtllm":  # s_1 = W e_1; s_t = W e_t + U s_{t-1} + b (no activation)
        return w_e if first else w_e + _linear(state, u, b)
    if variant == "paper":  # s_1 = e_1; s_t = SiLU(W e_t + U s_{t-1} + b)
        return embedding if first else silu(w_e + _linear(state, u, b))
    raise ValueError(f"unknown rnn_variant {variant!r}")


def drafter_features(
    config: RedrafterConfig, weights: dict, hidden: np.ndarray, state: np.ndarray
) -> np.ndarray:
    """The head's input: [h ; s] through input_proj and the residual blocks.

    hidden (..., H) and state (..., H), broadcast against each other -> (..., E).
    """
    hidden, state = np.broadcast_arrays(hidden, state)
    x = np.concatenate([hidden, state], axis=-1)  # (..., 2H)
    if config.exit_dim != 2 * config.hidden_size:
        x = _linear(x, weights["input_proj.weight"], weights["input_proj.bias"])  # (..., E)
    for i in range(config.num_draft_layers):
        x = x + silu(
            _linear(x, weights[f"lm_head.{i}.linear.weight"], weights[f"lm_head.{i}.linear.bias"])
        )
    return x


def drafter_logits(
    config: RedrafterConfig,
    weights: dict,
    hidden: np.ndarray,
    state: np.ndarray,
    *,
    lm_head: np.ndarray | None = None,
) -> np.ndarray:
    """Drafter logits for the next token. hidden, state (..., H) -> (..., V).

    ``lm_head`` (V, H) is the target's LM head, needed when ``config.head == "tied"``. With a
    vocabulary shortlist (``weights["vocab_shortlist"]``), tokens outside it get -inf.
    """
    x = drafter_features(config, weights, hidden, state)
    if config.head == "full":
        logits = _linear(x, weights[f"lm_head.{config.num_draft_layers}.weight"])
    elif lm_head is None:
        raise ValueError(
            "a ReDrafter with head='tied' needs the target's lm_head (V, H); pass lm_head="
        )
    else:
        logits = _linear(_linear(x, weights["head_proj.weight"]), lm_head)  # (..., H) -> (..., V)
    return restrict_logits(logits, weights.get("vocab_shortlist"))


def draft_log_probs(logits: np.ndarray, *, top_k: int | None = None) -> np.ndarray:
    """log_softmax of the drafter's logits, keeping only the top-k (ties to the lower id) when
    given.

    logits (..., V) -> (..., V) float64; warped-out tokens get -inf.
    """
    z = np.asarray(logits, dtype=np.float64)
    if top_k is not None and top_k < z.shape[-1]:
        order = np.argsort(-z, axis=-1, kind="stable")  # best first, equal logits by ascending id
        rank = np.empty_like(order)
        np.put_along_axis(rank, order, np.arange(z.shape[-1]), axis=-1)
        z = np.where(rank < top_k, z, -np.inf)
    z = z - z.max(axis=-1, keepdims=True)
    return z - np.log(np.exp(z).sum(axis=-1, keepdims=True))


@attrs.frozen(kw_only=True)
class BeamSearchResult:
    """beams (B, W, L) int64, best first; scores (B, W) float64 joint log-probs of the drafted
    tokens; log_probs (B, W, L-1, V) float64: ``log_probs[b, i, k]`` is the drafter's
    distribution that scored ``beams[b, i, k+1]``."""

    beams: np.ndarray
    scores: np.ndarray
    log_probs: np.ndarray


def _check_beam_shape(vocab_size: int, beam_width: int, beam_length: int) -> None:
    if beam_width < 1 or beam_length < 2:
        raise ValueError(
            f"beam search needs beam_width >= 1 and beam_length >= 2 (root plus a drafted token), "
            f"got W={beam_width}, L={beam_length}"
        )
    if beam_width > vocab_size ** (beam_length - 1):
        raise ValueError(
            f"beam_width W={beam_width} exceeds the {vocab_size}**{beam_length - 1} distinct "
            f"drafts of length L={beam_length} over a vocabulary of V={vocab_size}; lower "
            "beam_width"
        )


def beam_search(
    config: RedrafterConfig,
    weights: dict,
    hidden: np.ndarray,
    root_tokens: np.ndarray,
    *,
    embed_tokens: np.ndarray,
    lm_head: np.ndarray | None = None,
    beam_width: int,
    beam_length: int,
) -> BeamSearchResult:
    """ReDrafter's beam search (paper section 3.2). hidden (B, H), root_tokens (B,) int.

    Every step extends each beam by every token, scores candidates by their joint log-prob,
    and keeps the top W of the W*V candidates, sorted descending, equal scores to the lower
    flat index (beam * V + token). Only beam 0 is alive at the first step, so the W beams do
    not start as W copies of the root. ``config.draft_top_k`` warps the drafter's log-probs.
    With a vocabulary shortlist of S ids the candidates are the W*S extensions by shortlisted
    tokens (flat index beam * S + position in the shortlist); ``log_probs`` stay over V.
    """
    hidden = np.asarray(hidden, dtype=np.float64)
    root_tokens = np.asarray(root_tokens, dtype=np.int64)
    # The candidates are the drafted vocabulary: the shortlist's ids (sorted), or every token.
    drafted = np.asarray(
        weights.get("vocab_shortlist", np.arange(config.vocab_size)), dtype=np.int64
    )
    batch, vocab, width = root_tokens.shape[0], drafted.shape[0], beam_width
    _check_beam_shape(vocab, beam_width, beam_length)
    beams = np.repeat(root_tokens[:, None, None], width, axis=1)  # (B, W, 1)
    scores = np.full((batch, width), -np.inf)
    scores[:, 0] = 0.0  # only beam 0 alive
    state = np.zeros((batch, width, config.hidden_size))
    history = np.zeros((batch, width, 0, config.vocab_size))
    for t in range(1, beam_length):
        # 1. Advance every beam's state with its last token, then score the next token.
        # (B, W, H)
        state = rnn_step(config, weights, state, embed_tokens[beams[:, :, -1]], first=t == 1)
        # (B, W, V)
        logits = drafter_logits(config, weights, hidden[:, None, :], state, lm_head=lm_head)
        log_probs = draft_log_probs(logits, top_k=config.draft_top_k)
        # 2. Joint log-prob of every (beam, token) extension; keep the best W
        # (stable: ties to lower index).
        candidates = (scores[:, :, None] + log_probs[:, :, drafted]).reshape(batch, width * vocab)
        best = np.argsort(-candidates, axis=1, kind="stable")[:, :width]  # (B, W)
        parent, token = best // vocab, drafted[best % vocab]
        scores = np.take_along_axis(candidates, best, axis=1)
        # 3. Gather the surviving beams' histories from their parents and append the new token.
        beams = np.concatenate(
            [np.take_along_axis(beams, parent[:, :, None], axis=1), token[:, :, None]], axis=2
        )
        state = np.take_along_axis(state, parent[:, :, None], axis=1)
        # (B, W, t, V)
        history = np.concatenate(
            [
                np.take_along_axis(history, parent[:, :, None, None], axis=1),
                np.take_along_axis(log_probs, parent[:, :, None], axis=1)[:, :, None, :],
            ],
            axis=2,
        )
    return BeamSearchResult(beams=beams, scores=scores, log_probs=history)


def sample_chains(
    config: RedrafterConfig,
    weights: dict,
    hidden: np.ndarray,
    root_tokens: np.ndarray,
    uniforms: np.ndarray,
    sampling: SamplingConfig,
    *,
    embed_tokens: np.ndarray,
    lm_head: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """W independent sampled drafts per row. uniforms (B, W, L) in [0, 1).

    Token k of chain i is ``sample_from(draft_probs[b, i, k-1], uniforms[b, i, k])`` with
    ``draft_probs = target_probs(drafter_logits, sampling)`` (temperature, top-k, top-p);
    ``uniforms[:, :, 0]`` is unused (position 0 is the root). ``config.draft_top_k`` is not
    applied: the sampling configuration shapes the distribution.
    Returns beams (B, W, L) int64 and draft_probs (B, W, L-1, V) float64.
    """
    hidden = np.asarray(hidden, dtype=np.float64)
    uniforms = np.asarray(uniforms, dtype=np.float64)
    batch, width, length = uniforms.shape
    beams = np.zeros((batch, width, length), dtype=np.int64)
    beams[:, :, 0] = np.asarray(root_tokens, dtype=np.int64)[:, None]
    draft_probs = np.zeros((batch, width, length - 1, config.vocab_size))
    state = np.zeros((batch, width, config.hidden_size))
    for t in range(1, length):
        # (B, W, H)
        state = rnn_step(config, weights, state, embed_tokens[beams[:, :, t - 1]], first=t == 1)
        # (B, W, V)
        logits = drafter_logits(config, weights, hidden[:, None, :], state, lm_head=lm_head)
        draft_probs[:, :, t - 1] = target_probs(logits, sampling)
        beams[:, :, t] = sample_from(draft_probs[:, :, t - 1], uniforms[:, :, t])
    return beams, draft_probs


def check_target_arrays(config: RedrafterConfig, embed_tokens, lm_head) -> None:
    """The target's embedding and LM head (any backend's arrays) have the drafter's (V, H)."""
    expected = (config.vocab_size, config.hidden_size)
    if tuple(embed_tokens.shape) != expected:
        raise ValueError(
            f"embed_tokens has shape {tuple(embed_tokens.shape)}, but the drafter was built for "
            f"(vocab_size, hidden_size) = {expected}; pass the target's input embedding"
        )
    if lm_head is not None and tuple(lm_head.shape) != expected:
        raise ValueError(
            f"lm_head has shape {tuple(lm_head.shape)}, expected {expected} (the target's LM head)"
        )
    if config.head == "tied" and lm_head is None:
        raise ValueError(
            "a ReDrafter with head='tied' needs the target's lm_head (V, H); pass lm_head="
        )


class BeamSettings:
    """Beam width, length and sampling mode, shared by the ReDrafter drafters of every backend.

    ``pairs_with_lookup``: ``specdec.generate`` adds a prompt-lookup beam to these drafts unless
    the caller says ``lookup=False`` (or the beams are sampled): the two drafters predict
    different tokens, and the extra beam costs one more branch of the tree."""

    pairs_with_lookup = True

    def set_beams(
        self, config: RedrafterConfig, beam_width: int | None, beam_length: int | None, sample: bool
    ):
        self.beam_width = config.beam_width if beam_width is None else int(beam_width)
        self.beam_length = config.beam_length if beam_length is None else int(beam_length)
        self.sample = bool(sample)
        _check_beam_shape(config.draft_vocab_size, self.beam_width, self.beam_length)

    @property
    def sample_shape(self) -> tuple[int, int] | None:
        """(W, L): per-row shape of the ``context.uniforms`` a sampling drafter needs; None
        otherwise."""
        return (self.beam_width, self.beam_length) if self.sample else None

    @property
    def sampled_proposals(self) -> bool:
        """True when sampled decoding gets independent sampled chains
        (verified by rejection sampling)."""
        return self.sample

    @property
    def caps(self) -> DrafterCaps:
        return DrafterCaps(
            sample_shape=self.sample_shape,
            sampled_proposals=self.sampled_proposals,
            max_tree_size=beam_tree_size(self.beam_width, self.beam_length),
        )


class RedrafterDrafter(BeamSettings):
    """ReDrafter as a ``specdec.protocols.Drafter`` (NumPy reference).

    weights: name -> array as in ``specdec_redrafter.config`` (checked, kept as float64).
    embed_tokens (V, H): the target's input embedding; lm_head (V, H): the target's LM head
    (required for ``head="tied"``). beam_width / beam_length override the config's defaults.
    sample: draw W independent chains when the context's sampling is not greedy (for exact
    multi-draft rejection sampling); greedy contexts always use beam search.
    int8: True computes with every product's weight rounded to int8 per row
    (``specdec.reference.quantize``; the target's LM head too for ``head="tied"``), the twin of
    the torch drafter's int8 weights; None and False keep the weights (the reference has no
    faster kernel to measure).
    """

    def __init__(
        self,
        config: RedrafterConfig,
        weights: dict,
        *,
        embed_tokens: np.ndarray,
        lm_head: np.ndarray | None = None,
        beam_width: int | None = None,
        beam_length: int | None = None,
        sample: bool = False,
        int8: bool | None = None,
    ):
        check_weights(config, weights)
        check_target_arrays(config, embed_tokens, lm_head)
        self.config = config
        self.weights = {
            name: np.asarray(array, dtype=np.int64 if name == "vocab_shortlist" else np.float64)
            for name, array in weights.items()
        }
        self.embed_tokens = np.asarray(embed_tokens, dtype=np.float64)
        self.lm_head = None if lm_head is None else np.asarray(lm_head, dtype=np.float64)
        check_int8_option(int8)
        if int8:
            self.weights = quantized_weights(self.weights, product_weights(config))
            if self.lm_head is not None and config.head == "tied":
                self.lm_head = dequantize_rows(*quantize_rows(self.lm_head))
        self.set_beams(config, beam_width, beam_length, sample)

    def propose(self, context: DraftContext) -> Draft:
        """Beams (B, W, L) continuing ``context.root_tokens`` given ``context.hidden`` (B, H)."""
        root_tokens = np.asarray(context.root_tokens, dtype=np.int64)
        hidden = np.asarray(context.hidden, dtype=np.float64)
        batch = root_tokens.shape[0]
        if hidden.shape != (batch, self.config.hidden_size):
            raise ValueError(
                f"context.hidden has shape {hidden.shape}, expected (B, H) = "
                f"{(batch, self.config.hidden_size)}"
            )
        if np.any(root_tokens < 0) or np.any(root_tokens >= self.config.vocab_size):
            raise ValueError(
                f"context.root_tokens must be token ids in [0, {self.config.vocab_size}), got "
                f"{root_tokens}"
            )
        pieces = dict(embed_tokens=self.embed_tokens, lm_head=self.lm_head)
        if self.sample and not context.sampling.greedy:
            shape = (batch, self.beam_width, self.beam_length)
            if context.uniforms is None or np.shape(context.uniforms) != shape:
                raise ValueError(
                    f"a sampling ReDrafter needs context.uniforms of shape (B, W, L) = {shape}, "
                    f"got {None if context.uniforms is None else np.shape(context.uniforms)}"
                )
            beams, draft_probs = sample_chains(
                self.config,
                self.weights,
                hidden,
                root_tokens,
                context.uniforms,
                context.sampling,
                **pieces,
            )
            return Draft(
                root_tokens=root_tokens, beams=beams, draft_probs=draft_probs, sampled=True
            )
        result = beam_search(
            self.config,
            self.weights,
            hidden,
            root_tokens,
            beam_width=self.beam_width,
            beam_length=self.beam_length,
            **pieces,
        )
        draft_probs = np.exp(result.log_probs) if context.want_draft_probs else None
        return Draft(
            root_tokens=root_tokens, beams=result.beams, draft_probs=draft_probs, sampled=False
        )
