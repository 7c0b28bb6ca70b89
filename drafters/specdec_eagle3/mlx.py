"""EAGLE-3 on MLX: the draft layer as an ``mlx.nn.Module`` and per-slot draft caches; the dynamic
tree is EAGLE's batched search on MLX (``specdec_eagle.mlx.TreeSearch``) over this net.

The MLX twin of ``specdec_eagle3.torch`` (and of ``specdec_eagle3.reference``, which explains the
model). Parameter names are the checkpoint's; the target's embedding is borrowed unless the head
carries its own (``own_embedding``: ``embed_tokens.weight``). Indices int32, computation float32.
"""

from __future__ import annotations


import mlx.core as mx
import mlx.nn as nn

from specdec.capabilities import DrafterCaps
from specdec.types import Draft, DraftContext
from specdec_eagle.mlx import DraftAttention, DraftMLP, DraftNorm, SlotDrafter, TreeSearch
from specdec_eagle3.config import Eagle3Config, check_weights, draft_to_target
from specdec_eagle3.reference import (
    check_embedding,
    check_layers_given,
    check_layers_resolved,
    check_propose_context,
    tree_options,
)
from specdec_mlx import ops

__all__ = ["MlxEagle3Drafter", "MlxEagle3Net"]


class _MidLayer(nn.Module):
    def __init__(self, config: Eagle3Config):
        super().__init__()
        eps = config.rms_norm_eps
        self.input_layernorm, self.hidden_norm = (
            DraftNorm(config.hidden_size, eps),
            DraftNorm(config.hidden_size, eps),
        )
        self.self_attn = DraftAttention(config, 2 * config.hidden_size)
        self.post_attention_layernorm = DraftNorm(config.hidden_size, eps)
        self.mlp = DraftMLP(config)


class MlxEagle3Net(nn.Module):
    """The EAGLE-3 draft model with the checkpoint's names (``fc``, ``midlayer.*``, ``norm``,
    ``lm_head``, and ``input_norm`` / ``embed_tokens`` where the config has them)."""

    def __init__(self, config: Eagle3Config):
        super().__init__()
        self.config = config
        if config.own_embedding:
            self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        if config.norm_before_fc:
            self.input_norm = DraftNorm(3 * config.hidden_size, config.rms_norm_eps)
        self.fc = nn.Linear(3 * config.hidden_size, config.hidden_size, bias=False)
        self.midlayer = _MidLayer(config)
        self.norm = DraftNorm(config.hidden_size, config.rms_norm_eps)
        self.lm_head = nn.Linear(config.hidden_size, config.draft_vocab_size, bias=False)

    @classmethod
    def from_weights(cls, config: Eagle3Config, weights: dict, *, like: mx.array) -> MlxEagle3Net:
        check_weights(config, weights)
        net = cls(config)
        net.load_weights(
            [(name, ops.placed(w, like)) for name, w in weights.items() if name != "d2t"],
            strict=True,
        )
        mx.eval(net.parameters())
        return net

    def features(self, layers: list[mx.array]) -> mx.array:
        """g = fc([low ; mid ; high]) (through ``input_norm`` first where the head has it): three
        (..., H) -> (..., H)."""
        fused = mx.concatenate(layers, axis=-1)
        if self.config.norm_before_fc:
            fused = self.input_norm(fused)
        return self.fc(fused)

    def fuse(self, embed_tokens: mx.array, tokens: mx.array, g: mx.array) -> mx.array:
        """[input_layernorm(embed(tokens)) ; g]: tokens (...), g (..., H) -> (..., 2H)."""
        return mx.concatenate(
            [self.midlayer.input_layernorm(embed_tokens[tokens]), g.astype(embed_tokens.dtype)],
            axis=-1,
        )

    def layer(self, x: mx.array, positions: mx.array, past_keys, past_values, mask: mx.array):
        """As ``specdec_eagle3.torch.Eagle3Net.layer``: x (B, m, 2H), positions (B, m), past keys
        and values (B, Hkv, S, Dh), mask (B, m, S + m) -> out (pre-norm), new keys, new values."""
        cfg, layer = self.config, self.midlayer
        g = x[..., cfg.hidden_size :]
        normed_g = layer.hidden_norm(g)
        y = mx.concatenate([x[..., : cfg.hidden_size], normed_g], axis=-1)  # (B, m, 2H)
        attended, k, v = layer.self_attn.attend(y, positions, past_keys, past_values, mask)
        h = (normed_g if cfg.norm_before_residual else g) + attended
        return h + layer.mlp(layer.post_attention_layernorm(h)), k, v


class MlxEagle3Drafter(SlotDrafter):
    """EAGLE-3 as a stateful ``specdec.protocols.Drafter`` on the mlx backend (same options as the
    reference's ``Eagle3Drafter``); each slot's draft cache is an (Hkv, T, Dh) pair of arrays.
    int8: only None and False, as for ``MlxEagleDrafter``."""

    NAME = "EAGLE-3"

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
        embed_tokens = ops.as_array(embed_tokens)
        ops.draft_weight(embed_tokens, int8=int8)  # refuses int8=True with the reason
        check_embedding(config, embed_tokens)
        check_layers_resolved(config)
        self.config, self.embed_tokens = config, embed_tokens
        self.net = MlxEagle3Net.from_weights(config, weights, like=embed_tokens)
        if config.own_embedding:  # the head's table, in the target's dtype, instead of the target's
            self.embed_tokens = self.net.embed_tokens.weight
        # (N,) target ids
        self.ids = ops.placed(draft_to_target(weights["d2t"]), embed_tokens, index=True)
        self.top_k, self.depth, self.total_tokens = tree_options(config, top_k, depth, total_tokens)
        self.caps = DrafterCaps(
            stateful=True,
            tree_builder=("prefix_tree", {}),
            hidden_layers=config.hidden_layers,
            max_tree_size=self.total_tokens + 1,
        )
        self.slots: dict[int, dict] = {}

    def step_features(self, result) -> mx.array:
        """The fused features g of the config's three target layers: (P, H) of a prompt,
        (B, A, H) of a step."""
        check_layers_given(self.config, result.layers)
        dtype = self.embed_tokens.dtype
        return self.net.features(
            [ops.as_array(result.layers[i]).astype(dtype) for i in self.config.hidden_layers]
        )

    def log_probs(self, out: mx.array) -> mx.array:
        return ops.log_softmax(self.net.lm_head(self.net.norm(out)))

    def to_vocab(self, local: mx.array) -> mx.array:
        return self.ids[local]

    def propose(self, context: DraftContext) -> Draft:
        """Beams (B, W = total_tokens, L = depth + 1), one dynamic tree per row."""
        roots = ops.as_array(context.root_tokens, dtype=mx.int32)
        check_propose_context(context, roots.shape[0])
        states, tree_context = self.context(context.slots)
        pending = mx.stack([s["pending"] for s in states])  # (B, H)
        beams = TreeSearch(self, *tree_context).run(roots, pending)
        return Draft(root_tokens=roots, beams=beams, sampled=False)
