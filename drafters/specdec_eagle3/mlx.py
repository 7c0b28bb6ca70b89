"""EAGLE-3 on MLX: the draft layer as an ``mlx.nn.Module`` and per-slot draft caches; the dynamic
tree is EAGLE's batched search on MLX (``specdec_eagle.mlx.TreeSearch``) over this net.

The MLX twin of ``specdec_eagle3.torch`` (and of ``specdec_eagle3.reference``, which explains the
model). Parameter names are the checkpoint's; the target's embedding is borrowed unless the head
carries its own (``own_embedding``: ``embed_tokens.weight``). Indices int32, computation float32.
"""

from __future__ import annotations

import math

import mlx.core as mx
import mlx.nn as nn
import numpy as np

from specdec.capabilities import DrafterCaps
from specdec.errors import InvalidInputError
from specdec.types import Accepted, Draft, DraftContext, PromptOutput
from specdec_eagle.mlx import TreeSearch
from specdec_eagle.mlx import DraftAttention, DraftMLP, DraftNorm
from specdec_eagle3.config import Eagle3Config, check_weights, draft_to_target
from specdec_eagle3.reference import (
    check_embedding,
    check_layers_resolved,
    check_propose_context,
    missing_slot,
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
        dim = config.head_dim
        self._inv_freq = mx.array(
            1.0 / config.rope_theta ** (np.arange(0, dim, 2, dtype=np.float64) / dim),
            dtype=mx.float32,
        )

    @classmethod
    def from_weights(cls, config: Eagle3Config, weights: dict, *, dtype=mx.float32) -> MlxEagle3Net:
        check_weights(config, weights)
        net = cls(config)
        net.load_weights(
            [
                (name, mx.array(np.asarray(w, dtype=np.float32)).astype(dtype))
                for name, w in weights.items()
                if name != "d2t"
            ],
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

    def _rotate(self, x: mx.array, positions: mx.array) -> mx.array:
        angles = positions[:, None, :, None].astype(mx.float32) * self._inv_freq  # (B, 1, m, Dh/2)
        angles = mx.concatenate([angles, angles], axis=-1)
        cos, sin = mx.cos(angles).astype(x.dtype), mx.sin(angles).astype(x.dtype)
        half = x.shape[-1] // 2
        return x * cos + mx.concatenate([-x[..., half:], x[..., :half]], axis=-1) * sin

    def layer(self, x: mx.array, positions: mx.array, past_keys, past_values, mask: mx.array):
        """As ``specdec_eagle3.torch.Eagle3Net.layer``: x (B, m, 2H), positions (B, m), past keys
        and values (B, Hkv, S, Dh), mask (B, m, S + m) -> out (pre-norm), new keys, new values."""
        cfg, layer = self.config, self.midlayer
        batch, m, _ = x.shape
        g = x[..., cfg.hidden_size :]
        normed_g = layer.hidden_norm(g)
        y = mx.concatenate([x[..., : cfg.hidden_size], normed_g], axis=-1)  # (B, m, 2H)
        attn = layer.self_attn
        q = attn.q_proj(y).reshape(batch, m, cfg.num_heads, cfg.head_dim).transpose(0, 2, 1, 3)
        k = attn.k_proj(y).reshape(batch, m, cfg.num_kv_heads, cfg.head_dim).transpose(0, 2, 1, 3)
        v = attn.v_proj(y).reshape(batch, m, cfg.num_kv_heads, cfg.head_dim).transpose(0, 2, 1, 3)
        q, k = self._rotate(q, positions), self._rotate(k, positions)
        keys = mx.concatenate([past_keys, k], axis=2)
        values = mx.concatenate([past_values, v], axis=2)
        group = cfg.num_heads // cfg.num_kv_heads
        keys, values = mx.repeat(keys, group, axis=1), mx.repeat(values, group, axis=1)
        scores = (q @ keys.transpose(0, 1, 3, 2)) / math.sqrt(cfg.head_dim)  # (B, Hq, m, S + m)
        scores = mx.where(mask[:, None], scores.astype(mx.float32), float("-inf"))
        weights = mx.softmax(scores, axis=-1).astype(x.dtype)
        context = (
            (weights @ values).transpose(0, 2, 1, 3).reshape(batch, m, cfg.num_heads * cfg.head_dim)
        )
        h = (normed_g if cfg.norm_before_residual else g) + attn.o_proj(context)
        return h + layer.mlp(layer.post_attention_layernorm(h)), k, v


class MlxEagle3Drafter:
    """EAGLE-3 as a stateful ``specdec.protocols.Drafter`` on the mlx backend (same options as the
    reference's ``Eagle3Drafter``); each slot's draft cache is an (Hkv, T, Dh) pair of arrays.
    int8: only None and False, as for ``MlxEagleDrafter``."""

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
        self.net = MlxEagle3Net.from_weights(config, weights, dtype=embed_tokens.dtype)
        if config.own_embedding:  # the head's table, in the target's dtype, instead of the target's
            self.embed_tokens = self.net.embed_tokens.weight
        self.ids = mx.array(draft_to_target(weights["d2t"]).astype(np.int32))  # (N,) target ids
        self.top_k, self.depth, self.total_tokens = tree_options(config, top_k, depth, total_tokens)
        self.caps = DrafterCaps(
            stateful=True,
            tree_builder=("prefix_tree", {}),
            hidden_layers=config.hidden_layers,
            max_tree_size=self.total_tokens + 1,
        )
        self.slots: dict[int, dict] = {}

    def _features(self, layers) -> mx.array:
        missing = [i for i in self.config.hidden_layers if i not in layers]
        if missing:
            raise InvalidInputError(
                f"EAGLE-3 needs the outputs of target layers {list(self.config.hidden_layers)}, "
                f"missing {missing}: the target must return the layers in DrafterCaps.hidden_layers"
            )
        return self.net.features(
            [
                ops.as_array(layers[i]).astype(self.embed_tokens.dtype)
                for i in self.config.hidden_layers
            ]
        )

    def _slot(self, slot: int) -> dict:
        if slot not in self.slots:
            raise missing_slot(slot)
        return self.slots[slot]

    def _append(self, slot: int, tokens: mx.array, g: mx.array) -> None:
        state = self.slots[slot]
        length, n = state["length"], int(tokens.shape[0])
        positions = mx.arange(length, length + n)[None]
        mask = mx.array(np.tril(np.ones((n, length + n), dtype=bool), k=length))[None]
        x = self.net.fuse(self.embed_tokens, tokens[None], g[None])
        _, k, v = self.net.layer(x, positions, state["keys"][None], state["values"][None], mask)
        state["keys"] = mx.concatenate([state["keys"], k[0]], axis=1)
        state["values"] = mx.concatenate([state["values"], v[0]], axis=1)
        state["length"] = length + n
        mx.eval(state["keys"], state["values"])

    def begin(self, slot: int, prompt, output: PromptOutput) -> None:
        prompt = mx.array(np.asarray(prompt, dtype=np.int32))
        g = self._features(output.layers)  # (P, H)
        cfg = self.config
        empty = mx.zeros((cfg.num_kv_heads, 0, cfg.head_dim), dtype=self.embed_tokens.dtype)
        self.slots[int(slot)] = {"keys": empty, "values": empty, "length": 0, "pending": g[-1]}
        if prompt.shape[0] > 1:
            self._append(int(slot), prompt[1:], g[:-1])

    def observe(self, accepted: Accepted) -> None:
        g = self._features(accepted.layers)  # (B, A, H)
        tokens = np.asarray(accepted.tokens)
        for b, slot in enumerate(np.asarray(accepted.slots).tolist()):
            count = int(accepted.num_accepted[b]) + 1
            state = self._slot(slot)
            self._append(
                slot,
                mx.array(tokens[b, :count].astype(np.int32)),
                mx.concatenate([state["pending"][None], g[b, : count - 1]]),
            )
            state["pending"] = g[b, count - 1]

    def end(self, slot: int, reason: str) -> None:
        """The request in ``slot`` ended (any ``reason``): drop its state."""
        self.slots.pop(int(slot), None)

    def log_probs(self, out: mx.array) -> mx.array:
        return ops.log_softmax(self.net.lm_head(self.net.norm(out)))

    def to_vocab(self, local: mx.array) -> mx.array:
        return self.ids[local]

    def propose(self, context: DraftContext) -> Draft:
        """Beams (B, W = total_tokens, L = depth + 1), one dynamic tree per row."""
        roots = ops.as_array(context.root_tokens, dtype=mx.int32)
        check_propose_context(context, roots.shape[0])
        states = [self._slot(int(s)) for s in np.asarray(context.slots).tolist()]
        span = max(s["length"] for s in states)
        pad = lambda a: mx.pad(a, [(0, 0), (0, span - a.shape[1]), (0, 0)])  # noqa: E731
        ctx_keys = mx.stack([pad(s["keys"]) for s in states])
        ctx_values = mx.stack([pad(s["values"]) for s in states])
        lengths = mx.array([s["length"] for s in states], dtype=mx.int32)
        ctx_mask = mx.arange(span)[None] < lengths[:, None]
        pending = mx.stack([s["pending"] for s in states])  # (B, H)
        beams = TreeSearch(self, ctx_keys, ctx_values, ctx_mask, lengths).run(roots, pending)
        return Draft(root_tokens=roots, beams=beams, sampled=False)
