"""EAGLE-3 drafter, float64 NumPy reference (arXiv 2503.01840; EAGLE-2's dynamic tree, arXiv
2406.16858).

**The draft model** (paper section 3; SafeAILab/EAGLE ``eagle/model/cnets.py``). Draft position p
reads a feature g_p and the embedding of the token x_{p+1} that follows it:

    g_p   = fc([low_p ; mid_p ; high_p])        (H,)  Linear(3H -> H): the target's three layers
                                                (through input_norm first: ``norm_before_fc``)
    y_p   = [input_layernorm(embed(x_{p+1})) ; hidden_norm(g_p)]     (2H,)  embed: the target's,
                                                or the head's own (``own_embedding``)
    h_p   = g_p + o_proj(attention(rope(q(y_p)), rope(k(.)), v(.)))  (the normed g_p when
                                                                      ``norm_before_residual``)
    out_p = h_p + down(silu(gate(n_p)) * up(n_p)),  n_p = post_attention_layernorm(h_p)
    logits of x_{p+2} over the draft vocabulary = lm_head(norm(out_p))      (N,)

At a drafted step the feature is the draft's own ``out`` of the parent (before ``norm``, no fc),
which is what training-time test trains it to read (``features``, ``draft_layer``,
``draft_log_probs``). Draft id i is target token i + d2t[i].

**Per request** (``Eagle3Drafter``, stateful like EAGLE): ``begin`` runs the layer over the
prompt (positions 0 .. P-2) and keeps the fused feature of position P-1 pending; ``observe``
appends the root and accepted entries and keeps the last accepted position's fused feature
pending. The features come from ``PromptOutput.layers`` / ``Accepted.layers`` (the config's
``hidden_layers``, asked for through ``DrafterCaps.hidden_layers``), at no extra forward.

**The tree** is EAGLE-2's (``specdec_eagle.reference``): level by level, each frontier node's
top-k children scored by cumulative draft log-prob, the best k the next frontier, the best
candidates kept within ``total_tokens`` verified nodes (``select_nodes``), short leaves extended
along their top-1 children (``tree_beams``). Rankings run over draft ids (ties to the lower id).
Shapes: V target vocab, N draft vocab, H hidden, Hkv heads, Dh head size, W beams, L = depth + 1.
"""

from __future__ import annotations

import numpy as np

from specdec.capabilities import DrafterCaps
from specdec.errors import InvalidInputError
from specdec.reference.model import rms_norm
from specdec.reference.quantize import check_int8_option, quantized_weights
from specdec.types import Draft, DraftContext
from specdec_eagle.reference import SlotCache, SlotDrafter, grown_cache, mlp_block, self_attention
from specdec_eagle.tree import TreeDraft, finish_tree, top_indices
from specdec_eagle.tree import tree_options as eagle_tree_options
from specdec_eagle3.config import Eagle3Config, check_weights, draft_to_target, product_weights

__all__ = [
    "Eagle3Drafter",
    "check_layers_given",
    "check_tree_options",
    "draft_layer",
    "draft_log_probs",
    "dynamic_tree",
    "features",
    "run_entries",
    "tree_options",
]


def features(config: Eagle3Config, weights: dict, layers) -> np.ndarray:
    """g = fc([low ; mid ; high]) (the concatenation RMS-normed by ``input_norm`` first when
    ``config.norm_before_fc``): layers maps each of ``config.hidden_layers`` to (..., H) ->
    (..., H)."""
    check_layers_given(config, layers)
    # (..., 3H)
    fused = np.concatenate(
        [np.asarray(layers[i], dtype=np.float64) for i in config.hidden_layers], axis=-1
    )
    if config.norm_before_fc:
        fused = rms_norm(fused, weights["input_norm.weight"], config.rms_norm_eps)
    return fused @ weights["fc.weight"].T


def check_layers_given(config: Eagle3Config, layers) -> None:
    """``layers`` (a ``PromptOutput``'s or ``Accepted``'s) holds each of the config's three."""
    missing = [i for i in config.hidden_layers if layers is None or i not in layers]
    if missing:
        raise InvalidInputError(
            f"EAGLE-3 needs the outputs of target layers {list(config.hidden_layers)}, missing "
            f"{missing}: the target must return the layers named in DrafterCaps.hidden_layers"
        )


def draft_layer(
    config: Eagle3Config,
    weights: dict,
    embed_tokens: np.ndarray,
    tokens: np.ndarray,
    g: np.ndarray,
    positions: np.ndarray,
    past: tuple[np.ndarray, np.ndarray],
    past_allowed: np.ndarray,
    new_allowed: np.ndarray,
):
    """The draft decoder layer on n new entries: tokens (n,) int, g (n, H) their features,
    positions (n,) rotary positions; past = (keys, values) each (Hkv, S, Dh), rotary applied;
    past_allowed (n, S), new_allowed (n, n) bool. -> out (n, H) (before ``norm``), keys, values
    (Hkv, n, Dh)."""
    eps = config.rms_norm_eps
    normed_g = rms_norm(g, weights["midlayer.hidden_norm.weight"], eps)
    embedded = rms_norm(embed_tokens[tokens], weights["midlayer.input_layernorm.weight"], eps)
    y = np.concatenate([embedded, normed_g], axis=-1)  # (n, 2H)
    attn_out, k, v = self_attention(
        config, weights, "midlayer.", y, positions, past, past_allowed, new_allowed
    )
    h = (normed_g if config.norm_before_residual else g) + attn_out
    return h + mlp_block(config, weights, "midlayer.", h), k, v


def draft_log_probs(config: Eagle3Config, weights: dict, out: np.ndarray) -> np.ndarray:
    """log_softmax of lm_head(norm(out)) over the draft vocabulary: out (..., H) -> (..., N)."""
    logits = (
        rms_norm(out, weights["norm.weight"], config.rms_norm_eps) @ weights["lm_head.weight"].T
    )
    z = logits - logits.max(axis=-1, keepdims=True)
    return z - np.log(np.exp(z).sum(axis=-1, keepdims=True))


def run_entries(
    config: Eagle3Config,
    weights: dict,
    embed_tokens: np.ndarray,
    cache: SlotCache,
    tokens: np.ndarray,
    g: np.ndarray,
):
    """Append entries at positions T .. T+n-1 (causal among themselves, after the whole cache).
    tokens (n,), g (n, H) -> (outputs (n, H), the cache with the entries appended)."""
    n, length = len(tokens), cache.length
    if n == 0:
        return np.zeros((0, config.hidden_size)), cache
    out, k, v = draft_layer(
        config,
        weights,
        embed_tokens,
        np.asarray(tokens, dtype=np.int64),
        g,
        length + np.arange(n),
        (cache.keys, cache.values),
        np.ones((n, length), dtype=bool),
        np.tril(np.ones((n, n), dtype=bool)),
    )
    return out, grown_cache(cache, k, v, tokens)


def dynamic_tree(
    config: Eagle3Config,
    weights: dict,
    embed_tokens: np.ndarray,
    cache: SlotCache,
    root: int,
    feature: np.ndarray,
    *,
    top_k: int,
    depth: int,
    total_tokens: int,
) -> TreeDraft:
    """EAGLE-2's dynamic tree over the EAGLE-3 layer for one request. cache: positions 0 .. T-1;
    root: the root token; feature (H,): the pending fused feature. A node of level d sits at
    position T + d and attends to the cache, the root entry and its ancestors; its children read
    its ``out`` as their feature. Node tokens are target ids."""
    check_tree_options(config, top_k, depth, total_tokens)
    ids = draft_to_target(weights["d2t"])
    length = cache.length
    tokens, parents, levels, scores = [int(root)], [-1], [0], [0.0]
    gaps: list[float] = []
    ran: dict[int, tuple] = {}  # node -> (out (H,), key (Hkv, Dh), value (Hkv, Dh), log_probs (N,))

    def run(node: int) -> np.ndarray:
        path, above = [], parents[node]
        while above >= 0:
            path.append(above)
            above = parents[above]
        path = path[::-1]  # the node's ancestors, root first
        g = feature if node == 0 else ran[parents[node]][0]
        keys = np.concatenate([cache.keys] + [ran[a][1][:, None] for a in path], axis=1)
        values = np.concatenate([cache.values] + [ran[a][2][:, None] for a in path], axis=1)
        out, k, v = draft_layer(
            config,
            weights,
            embed_tokens,
            np.array([tokens[node]]),
            g[None],
            np.array([length + levels[node]]),
            (keys, values),
            np.ones((1, keys.shape[1]), dtype=bool),
            np.ones((1, 1), dtype=bool),
        )
        ran[node] = (out[0], k[:, 0], v[:, 0], draft_log_probs(config, weights, out[0]))
        return ran[node][3]

    def add(local: int, parent: int, score: float) -> int:
        tokens.append(int(ids[local]))
        parents.append(parent)
        levels.append(levels[parent] + 1)
        scores.append(float(score))
        return len(tokens) - 1

    # Level 1: the root's top-k children are the first frontier.
    log_probs = run(0)
    frontier = [add(i, 0, log_probs[i]) for i in top_indices(log_probs, top_k, gaps)]
    for _ in range(depth - 1):
        # Each frontier node proposes its top-k children, scored cumulatively; the best k go on.
        children = []
        for node in frontier:
            log_probs = run(node)
            children += [
                add(i, node, scores[node] + log_probs[i])
                for i in top_indices(log_probs, top_k, gaps)
            ]
        frontier = [
            children[i] for i in top_indices(np.array([scores[c] for c in children]), top_k, gaps)
        ]

    return finish_tree(tokens, parents, levels, scores, ran, run, add, depth, total_tokens, gaps)


def check_tree_options(config: Eagle3Config, top_k, depth, total_tokens) -> None:
    """top_k <= the draft vocabulary, depth >= 1, depth <= total_tokens (a ValueError otherwise)."""
    for name, value in (("top_k", top_k), ("depth", depth), ("total_tokens", total_tokens)):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
            raise ValueError(f"EAGLE-3's {name} must be a positive integer, got {value!r}")
    if top_k > config.draft_vocab_size:
        raise ValueError(
            f"EAGLE-3's top_k={top_k} exceeds its draft vocabulary of {config.draft_vocab_size} "
            "tokens"
        )
    if total_tokens < depth:
        raise ValueError(
            f"EAGLE-3's total_tokens={total_tokens} cannot hold one path of depth={depth} drafted "
            "tokens; give total_tokens >= depth"
        )


def tree_options(config: Eagle3Config, top_k, depth, total_tokens) -> tuple[int, int, int]:
    """The tree's (top_k, depth, total_tokens): the given ones, else the config's; checked
    (``specdec_eagle.reference.tree_options`` with EAGLE-3's checks)."""
    return eagle_tree_options(config, top_k, depth, total_tokens, check=check_tree_options)


def check_embedding(config: Eagle3Config, embed_tokens) -> None:
    """The target's embedding (any backend's array) has the drafter's (V, H)."""
    expected = (config.vocab_size, config.hidden_size)
    if embed_tokens is None or tuple(embed_tokens.shape) != expected:
        raise ValueError(
            "embed_tokens has shape "
            f"{None if embed_tokens is None else tuple(embed_tokens.shape)}, but the EAGLE-3 "
            f"drafter was built for (vocab_size, hidden_size) = {expected}; pass the target's"
        )


def check_layers_resolved(config: Eagle3Config) -> None:
    if config.hidden_layers is None:
        raise ValueError(
            "this EAGLE-3 config names no fused layers; resolve them for the target first "
            "(specdec_eagle3.config.resolve_layers, as drafter=... does)"
        )


def check_propose_context(context: DraftContext, batch: int) -> None:
    """What ``propose`` needs: slots (the decode loop gives them), no draft probabilities."""
    if context.slots is None or len(context.slots) != batch:
        raise InvalidInputError(
            "EAGLE-3 drafts per request: context.slots must name each row's slot (the decode loop "
            "gives them)"
        )
    if context.want_draft_probs:
        raise InvalidInputError(
            "the EAGLE-3 drafter gives no draft probabilities, which the chosen verifier needs; "
            "use the greedy or exact verifier (the defaults)"
        )


class Eagle3Drafter(SlotDrafter):
    """EAGLE-3 as a stateful ``specdec.protocols.Drafter`` (NumPy reference).

    weights: name -> array as in ``specdec_eagle3.config`` (checked; float64, ``d2t`` int64).
    embed_tokens (V, H): the target's, which the draft embeds tokens with unless the head carries
    its own (``config.own_embedding``: ``weights["embed_tokens.weight"]``). top_k, depth,
    total_tokens override the config's tree
    defaults. ``caps.hidden_layers`` asks the target for the config's three layers. The root's
    feature is the drafter's own pending fused feature (``context.hidden`` is not read).
    int8: True computes with the fc's, the layer's and the head's weights rounded to int8 per row
    (``specdec.reference.quantize``), the torch drafter's int8 twin; None and False keep them.
    """

    def __init__(
        self,
        config: Eagle3Config,
        weights: dict,
        *,
        embed_tokens,
        top_k: int | None = None,
        depth: int | None = None,
        total_tokens: int | None = None,
        int8: bool | None = None,
    ):
        check_weights(config, weights)
        check_embedding(config, embed_tokens)
        check_layers_resolved(config)
        check_int8_option(int8)
        self.config = config
        self.weights = {
            name: np.asarray(array, dtype=np.int64 if name == "d2t" else np.float64)
            for name, array in weights.items()
        }
        if int8:
            self.weights = quantized_weights(self.weights, product_weights(config))
        self.embed_tokens = (
            self.weights["embed_tokens.weight"]
            if config.own_embedding
            else np.asarray(embed_tokens, dtype=np.float64)
        )
        self.top_k, self.depth, self.total_tokens = tree_options(config, top_k, depth, total_tokens)
        self.caps = DrafterCaps(
            stateful=True,
            tree_builder=("prefix_tree", {}),
            hidden_layers=config.hidden_layers,
            max_tree_size=self.total_tokens + 1,
        )
        self.slots: dict[int, SlotCache] = {}

    NAME = "EAGLE-3"

    def step_features(self, result) -> np.ndarray:
        """The fused features g of the config's three target layers: (P, H) of a prompt,
        (B, A, H) of a step."""
        return features(self.config, self.weights, result.layers)

    def append(self, cache: SlotCache, tokens, g) -> SlotCache:
        return run_entries(self.config, self.weights, self.embed_tokens, cache, tokens, g)[1]

    def propose(self, context: DraftContext) -> Draft:
        """Beams (B, W = total_tokens, L = depth + 1), one dynamic tree per row."""
        roots = np.asarray(context.root_tokens, dtype=np.int64)
        check_propose_context(context, len(roots))
        beams = np.stack(
            [
                dynamic_tree(
                    self.config,
                    self.weights,
                    self.embed_tokens,
                    cache,
                    int(roots[b]),
                    cache.pending,
                    top_k=self.top_k,
                    depth=self.depth,
                    total_tokens=self.total_tokens,
                ).beams
                for b, cache in enumerate(
                    self._cache(int(s)) for s in np.asarray(context.slots).tolist()
                )
            ]
        )
        return Draft(root_tokens=roots, beams=beams, sampled=False)
