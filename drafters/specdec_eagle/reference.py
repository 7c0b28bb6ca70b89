"""EAGLE drafter, float64 NumPy reference (EAGLE-1 draft model, arXiv 2401.15077; EAGLE-2 dynamic
tree, arXiv 2406.16858).

**The draft model.** Draft position p pairs the target's feature f_p (its last hidden state
after the final norm, what produced token x_{p+1}) with the embedding of x_{p+1}:

    x_p   = fc([embed(x_{p+1}) ; f_p])                            (H,)  Linear(2H -> H)
    h_p   = x_p + o_proj(attention(rope(q(x_p)), rope(k(.)), v(.)))     no norm before attention
    out_p = h_p + down(silu(gate(n_p)) * up(n_p)),  n_p = rms_norm(h_p)
    logits of x_{p+2} = lm_head(out_p)                               the target's LM head

``out_p`` is the draft's prediction of f_{p+1} (``fuse``, ``draft_layer``, ``draft_log_probs``).
Attention reaches every earlier draft position of the request (the draft's own KV cache) with
rotary positions p, as one Llama decoder layer does.

**Per request** (``EagleDrafter``, a stateful drafter): ``begin`` runs the layer over the prompt
(positions 0 .. P-2: tokens x_1 .. x_{P-1}, features f_0 .. f_{P-2}) and keeps f_{P-1}
*pending*: its token is the first root, not chosen yet. Each step's root entry pairs the
pending feature with the root; ``observe`` appends the committed entries (the root and the
accepted tokens, each with the feature before it) and keeps the last accepted feature pending.

**The tree** (``dynamic_tree``, EAGLE-2): the root entry's output scores level 1; its ``top_k``
tokens are the first frontier. Each further level runs the frontier's k nodes through the layer
(each node reads its parent's output as its feature and attends to the cache, the root entry and
its own ancestors), gives every one of them its top-k children scored by cumulative draft
log-prob, and keeps the k best of those k*k as the next frontier. After ``depth`` levels the
best-scored candidates are kept (a child never outscores its parent, and ties go to the earlier
node, so they form a subtree of the root) while the tree the target verifies holds at most
``total_tokens`` drafted nodes (``select_nodes``): every leaf is extended to level ``depth``
along its top-1 children, since the prefix-tree builder takes beams of one length. The draft is
one beam per leaf (``tree_beams``). Shapes: B batch, V vocab, H hidden, Hq/Hkv heads, Dh head size,
W beams, L = depth + 1 beam length (root included).
"""

from __future__ import annotations

import attrs
import numpy as np

from specdec.capabilities import DrafterCaps
from specdec.errors import InvalidInputError
from specdec.reference.model import apply_rotary, attend, rms_norm, rotary_cos_sin, silu
from specdec.reference.quantize import (
    check_int8_option,
    dequantize_rows,
    quantize_rows,
    quantized_weights,
)
from specdec.drafting.shortlist import restrict_logits
from specdec.types import Accepted, Draft, DraftContext, PromptOutput
from specdec_eagle.config import EagleConfig, check_weights, product_weights

# the tree's shape (specdec_eagle.tree), public here too
from specdec_eagle.tree import (
    TreeDraft,
    check_tree_options,
    finish_tree,
    select_nodes,
    top_indices,
    tree_beams,
    tree_options,
)

__all__ = [
    "EagleDrafter",
    "SlotCache",
    "TreeDraft",
    "check_tree_options",
    "draft_layer",
    "draft_log_probs",
    "dynamic_tree",
    "fuse",
    "inverse_frequencies",
    "run_entries",
    "select_nodes",
    "tree_beams",
]


def fuse(
    config: EagleConfig,
    weights: dict,
    embed_tokens: np.ndarray,
    tokens: np.ndarray,
    features: np.ndarray,
) -> np.ndarray:
    """fc([embed(tokens) ; features]): tokens (...) int, features (..., H) -> (..., H)."""
    x = np.concatenate([embed_tokens[tokens], features], axis=-1)  # (..., 2H)
    y = x @ weights["fc.weight"].T
    return y + weights["fc.bias"] if config.fc_bias else y


def inverse_frequencies(config: EagleConfig) -> np.ndarray:
    """(Dh/2,) rotary speeds theta ** (-2i / Dh) of the draft layer (no scaling)."""
    return 1.0 / config.rope_theta ** (
        np.arange(0, config.head_dim, 2, dtype=np.float64) / config.head_dim
    )


def draft_layer(
    config: EagleConfig,
    weights: dict,
    x: np.ndarray,
    positions: np.ndarray,
    past: tuple[np.ndarray, np.ndarray],
    past_allowed: np.ndarray,
    new_allowed: np.ndarray,
):
    """The draft decoder layer on n new entries.

    x (n, H) fused inputs; positions (n,) their rotary positions; past = (keys, values) each
    (Hkv, S, Dh), rotary applied; past_allowed (n, S), new_allowed (n, n) bool: what each new
    entry attends to. Returns out (n, H) and the new keys, values (Hkv, n, Dh).
    """
    attn_out, k, v = self_attention(
        config, weights, "layers.0.", x, positions, past, past_allowed, new_allowed
    )
    h = x + attn_out
    return h + mlp_block(config, weights, "layers.0.", h), k, v


def self_attention(
    config, weights: dict, prefix: str, y, positions, past, past_allowed, new_allowed
):
    """The draft layer's attention (EAGLE's and EAGLE-3's; weights under ``prefix``): y (n, I)
    the projections' input, the rest as ``draft_layer``'s -> (o_proj(attention) (n, H), the new
    keys and values (Hkv, n, Dh), rotary applied)."""
    n, heads, kv_heads, dim = len(y), config.num_heads, config.num_kv_heads, config.head_dim
    attn = prefix + "self_attn."
    q = (y @ weights[attn + "q_proj.weight"].T).reshape(n, heads, dim).transpose(1, 0, 2)
    k = (y @ weights[attn + "k_proj.weight"].T).reshape(n, kv_heads, dim).transpose(1, 0, 2)
    v = (y @ weights[attn + "v_proj.weight"].T).reshape(n, kv_heads, dim).transpose(1, 0, 2)
    # (n, Dh)
    cos, sin = rotary_cos_sin(np.asarray(positions, dtype=np.float64), inverse_frequencies(config))
    q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
    context = attend(q, past, (k, v), past_allowed, new_allowed)
    return context @ weights[attn + "o_proj.weight"].T, k, v


def mlp_block(config, weights: dict, prefix: str, h):
    """down(silu(gate(n)) * up(n)) of n = post_attention_layernorm(h): the layer's MLP branch
    (weights under ``prefix``)."""
    normed = rms_norm(h, weights[prefix + "post_attention_layernorm.weight"], config.rms_norm_eps)
    gate = silu(normed @ weights[prefix + "mlp.gate_proj.weight"].T)
    up = normed @ weights[prefix + "mlp.up_proj.weight"].T
    return (gate * up) @ weights[prefix + "mlp.down_proj.weight"].T


def draft_log_probs(weights: dict, lm_head: np.ndarray, out: np.ndarray) -> np.ndarray:
    """log_softmax of lm_head(out) over the drafted vocabulary: out (..., H) -> (..., V), -inf
    outside the shortlist (when the weights hold one)."""
    logits = restrict_logits(out @ lm_head.T, weights.get("vocab_shortlist"))
    z = logits - logits.max(axis=-1, keepdims=True)
    return z - np.log(np.exp(z).sum(axis=-1, keepdims=True))


@attrs.define
class SlotCache:
    """One request's draft KV cache: keys, values (Hkv, T, Dh) of positions 0 .. T-1, and the
    pending feature f_T (H,) that the next root joins; ``tokens``: the T + 1 tokens the cache
    stands for (the prompt's first, whose entry has no feature before it, then each entry's)."""

    keys: np.ndarray
    values: np.ndarray
    pending: np.ndarray
    tokens: tuple = ()

    @property
    def length(self) -> int:
        return int(self.keys.shape[1])


def run_entries(
    config: EagleConfig,
    weights: dict,
    embed_tokens: np.ndarray,
    cache: SlotCache,
    tokens: np.ndarray,
    features: np.ndarray,
):
    """Append entries at positions T .. T+n-1 (causal among themselves, after the whole cache).
    tokens (n,), features (n, H) -> (outputs (n, H), the cache with the entries appended)."""
    n, length = len(tokens), cache.length
    if n == 0:
        return np.zeros((0, config.hidden_size)), cache
    x = fuse(config, weights, embed_tokens, np.asarray(tokens, dtype=np.int64), features)
    out, k, v = draft_layer(
        config,
        weights,
        x,
        length + np.arange(n),
        (cache.keys, cache.values),
        np.ones((n, length), dtype=bool),
        np.tril(np.ones((n, n), dtype=bool)),
    )
    return out, grown_cache(cache, k, v, tokens)


def grown_cache(cache: SlotCache, keys, values, tokens) -> SlotCache:
    """``cache`` with entries of ``tokens`` (n,) appended: their keys and values (Hkv, n, Dh)."""
    return SlotCache(
        keys=np.concatenate([cache.keys, keys], axis=1),
        values=np.concatenate([cache.values, values], axis=1),
        pending=cache.pending,
        tokens=cache.tokens + tuple(int(t) for t in np.asarray(tokens).reshape(-1)),
    )


def dynamic_tree(
    config: EagleConfig,
    weights: dict,
    embed_tokens: np.ndarray,
    lm_head: np.ndarray,
    cache: SlotCache,
    root: int,
    feature: np.ndarray,
    *,
    top_k: int,
    depth: int,
    total_tokens: int,
) -> TreeDraft:
    """EAGLE-2's dynamic tree for one request (see the module docstring).

    cache: the request's draft cache (positions 0 .. T-1); root: the root token; feature (H,):
    the target's feature that produced it (the pending one). The root entry sits at position T, a
    node of level d at T + d. Nodes run through the layer one at a time, each attending to the
    cache, the root entry and its ancestors (the tree-masked forward of a backend gives the same).
    """
    check_tree_options(config, top_k, depth, total_tokens)
    length = cache.length
    tokens, parents, levels, scores = [int(root)], [-1], [0], [0.0]
    gaps: list[float] = []
    ran: dict[int, tuple] = {}  # node -> (out (H,), key (Hkv, Dh), value (Hkv, Dh), log_probs (V,))

    def ancestors(node: int) -> list[int]:
        path = []
        while node >= 0:
            path.append(node)
            node = parents[node]
        return path[::-1]  # root first

    def run(node: int) -> np.ndarray:
        """Run ``node`` through the layer (its ancestors have run); return its log-probs."""
        path = ancestors(node)[:-1]
        feature_in = feature if node == 0 else ran[parents[node]][0]
        x = fuse(config, weights, embed_tokens, np.array([tokens[node]]), feature_in[None])
        keys = np.concatenate([cache.keys] + [ran[a][1][:, None] for a in path], axis=1)
        values = np.concatenate([cache.values] + [ran[a][2][:, None] for a in path], axis=1)
        out, k, v = draft_layer(
            config,
            weights,
            x,
            np.array([length + levels[node]]),
            (keys, values),
            np.ones((1, keys.shape[1]), dtype=bool),
            np.ones((1, 1), dtype=bool),
        )
        log_probs = draft_log_probs(weights, lm_head, out[0])
        ran[node] = (out[0], k[:, 0], v[:, 0], log_probs)
        return log_probs

    def add(token: int, parent: int, score: float) -> int:
        tokens.append(int(token))
        parents.append(parent)
        levels.append(levels[parent] + 1)
        scores.append(float(score))
        return len(tokens) - 1

    # Level 1: the root's top-k children; all of them are the first frontier.
    log_probs = run(0)
    frontier = [add(t, 0, log_probs[t]) for t in top_indices(log_probs, top_k, gaps)]
    for _ in range(depth - 1):
        # Each frontier node (best first) proposes its top-k children, scored cumulatively.
        children = []
        for node in frontier:
            log_probs = run(node)
            children += [
                add(t, node, scores[node] + log_probs[t])
                for t in top_indices(log_probs, top_k, gaps)
            ]
        child_scores = np.array([scores[c] for c in children])
        frontier = [children[i] for i in top_indices(child_scores, top_k, gaps)]

    return finish_tree(tokens, parents, levels, scores, ran, run, add, depth, total_tokens, gaps)


def missing_slot(slot: int, drafter: str = "EAGLE") -> InvalidInputError:
    """The error for ``propose`` or ``observe`` on a slot that ``begin`` never started."""
    return InvalidInputError(
        f"{drafter} has no request in slot {slot}: a stateful drafter needs begin(slot, ...) "
        "before propose/observe (the decode loop calls it when it admits a request)"
    )


class SlotDrafter:
    """The request lifecycle EAGLE and EAGLE-3 share (the stateful ``Drafter``'s ``begin``,
    ``observe`` and ``end``, and ``SlotView``'s ``slot_tokens``): one ``SlotCache`` per slot.

    A subclass sets ``NAME`` (for errors), ``config`` and ``slots`` (an empty dict), and gives
    ``step_features(result)``, the per-position features of a ``PromptOutput`` (P, H) or an
    ``Accepted`` (B, A, H), and ``append(cache, tokens, features)``, the cache with the draft
    layer run over new entries after it (``run_entries``)."""

    NAME = "EAGLE"

    def begin(self, slot: int, prompt, output: PromptOutput) -> None:
        """Run the layer over the prompt's entries; keep its last feature pending."""
        prompt = np.asarray(prompt, dtype=np.int64)
        features = self.step_features(output)  # (P, H)
        empty = np.zeros((self.config.num_kv_heads, 0, self.config.head_dim))
        cache = SlotCache(
            keys=empty, values=empty.copy(), pending=features[-1], tokens=(int(prompt[0]),)
        )
        if len(prompt) > 1:
            cache = self.append(cache, prompt[1:], features[:-1])
        self.slots[int(slot)] = cache

    def observe(self, accepted: Accepted) -> None:
        """Append each row's root entry and accepted entries; the last accepted feature is
        pending."""
        features = self.step_features(accepted)  # (B, A, H)
        for b, slot in enumerate(np.asarray(accepted.slots).tolist()):
            count = int(accepted.num_accepted[b]) + 1  # the root and the accepted drafted tokens
            cache = self._cache(slot)
            entry_features = np.concatenate([cache.pending[None], features[b, : count - 1]])
            cache = self.append(cache, np.asarray(accepted.tokens[b, :count]), entry_features)
            cache.pending = features[b, count - 1]
            self.slots[slot] = cache

    def end(self, slot: int, reason: str) -> None:
        """The request in ``slot`` ended (any ``reason``): drop its state."""
        self.slots.pop(int(slot), None)

    def slot_tokens(self, slot: int) -> tuple:
        """The tokens the draft cache of ``slot`` stands for (``specdec.protocols.SlotView``)."""
        return self._cache(slot).tokens

    def _cache(self, slot: int) -> SlotCache:
        if slot not in self.slots:
            raise missing_slot(slot, self.NAME)
        return self.slots[slot]


class EagleDrafter(SlotDrafter):
    """EAGLE as a stateful ``specdec.protocols.Drafter`` (NumPy reference).

    weights: name -> array as in ``specdec_eagle.config`` (checked, kept as float64).
    embed_tokens, lm_head (V, H): the target's. top_k, depth, total_tokens override the config's
    tree defaults. Drafts are deterministic (the exact verifier serves sampled decoding); every
    row is computed alone, so a request's draft does not depend on the rest of its batch.
    int8: True computes with the fc's, the layer's and the head's weights rounded to int8 per row
    (``specdec.reference.quantize``), the twin of the torch drafter's int8 weights; None and False
    keep them (the reference has no faster kernel to measure).
    """

    @property
    def caps(self) -> DrafterCaps:
        return DrafterCaps(
            stateful=True, tree_builder=("prefix_tree", {}), max_tree_size=self.total_tokens + 1
        )

    def __init__(
        self,
        config: EagleConfig,
        weights: dict,
        *,
        embed_tokens,
        lm_head,
        top_k: int | None = None,
        depth: int | None = None,
        total_tokens: int | None = None,
        int8: bool | None = None,
    ):
        check_weights(config, weights)
        check_target_arrays(config, embed_tokens, lm_head)
        check_int8_option(int8)
        self.config = config
        self.weights = {
            name: np.asarray(array, dtype=np.int64 if name == "vocab_shortlist" else np.float64)
            for name, array in weights.items()
        }
        self.embed_tokens = np.asarray(embed_tokens, dtype=np.float64)
        self.lm_head = np.asarray(lm_head, dtype=np.float64)
        if int8:  # rows are rounded one by one, so the shortlisted rows round as they do alone
            self.weights = quantized_weights(self.weights, product_weights(config))
            self.lm_head = dequantize_rows(*quantize_rows(self.lm_head))
        self.top_k, self.depth, self.total_tokens = tree_options(config, top_k, depth, total_tokens)
        self.slots: dict[int, SlotCache] = {}

    def step_features(self, result) -> np.ndarray:
        """The target's last hidden states: (P, H) of a prompt, (B, A, H) of a step."""
        return np.asarray(result.hidden, dtype=np.float64)

    def append(self, cache: SlotCache, tokens, features) -> SlotCache:
        return run_entries(self.config, self.weights, self.embed_tokens, cache, tokens, features)[1]

    def propose(self, context: DraftContext) -> Draft:
        """Beams (B, W = total_tokens, L = depth + 1), one dynamic tree per row."""
        roots = np.asarray(context.root_tokens, dtype=np.int64)
        hidden = np.asarray(context.hidden, dtype=np.float64)
        check_propose_context(self.config, context, roots, hidden.shape)
        beams = np.stack(
            [
                dynamic_tree(
                    self.config,
                    self.weights,
                    self.embed_tokens,
                    self.lm_head,
                    self._cache(int(slot)),
                    int(roots[b]),
                    hidden[b],
                    top_k=self.top_k,
                    depth=self.depth,
                    total_tokens=self.total_tokens,
                ).beams
                for b, slot in enumerate(np.asarray(context.slots).tolist())
            ]
        )
        return Draft(root_tokens=roots, beams=beams, sampled=False)


def check_target_arrays(config: EagleConfig, embed_tokens, lm_head) -> None:
    """The target's embedding and LM head (any backend's arrays) have the drafter's (V, H)."""
    expected = (config.vocab_size, config.hidden_size)
    for name, array in (("embed_tokens", embed_tokens), ("lm_head", lm_head)):
        if array is None or tuple(array.shape) != expected:
            raise ValueError(
                f"{name} has shape {None if array is None else tuple(array.shape)}, but the EAGLE "
                f"drafter was built for (vocab_size, hidden_size) = {expected}; pass the target's "
                f"{name}"
            )


def check_propose_context(config: EagleConfig, context: DraftContext, roots, hidden_shape) -> None:
    """What ``propose`` needs: slots (the decode loop gives them), hidden (B, H), no draft
    probabilities."""
    batch = len(roots)
    if context.slots is None or len(context.slots) != batch:
        raise InvalidInputError(
            "EAGLE drafts per request: context.slots must name each row's slot (the decode loop "
            "gives them)"
        )
    if tuple(hidden_shape) != (batch, config.hidden_size):
        raise ValueError(
            f"context.hidden has shape {tuple(hidden_shape)}, expected (B, H) = "
            f"{(batch, config.hidden_size)}"
        )
    if context.want_draft_probs:
        raise InvalidInputError(
            "the EAGLE drafter gives no draft probabilities, which the chosen verifier needs; use "
            "the greedy or exact verifier (the defaults)"
        )
