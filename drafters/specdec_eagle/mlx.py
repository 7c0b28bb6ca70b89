"""EAGLE on MLX: the draft layer as an ``mlx.nn.Module``, per-slot draft caches and the dynamic
tree.

The MLX twin of ``specdec_eagle.torch`` (and of ``specdec_eagle.reference``, which explains the
draft model, the request lifecycle and the tree). Parameter names are the checkpoint's, so the
same ``model.safetensors`` loads unchanged; the target's embedding and LM head are borrowed. Every
level's frontier runs in one forward over (B, k) entries; rankings use ``ops.top_k_lowest_index``
(ties to the lower index); the beams are assembled on the host from the tree's (B, C)-sized
arrays by ``search.extended_beams``, as on torch. Indices are int32, computation float32.
"""

from __future__ import annotations

import math

import mlx.core as mx
import mlx.nn as nn
import numpy as np

from specdec.capabilities import DrafterCaps
from specdec.types import Accepted, Draft, DraftContext, PromptOutput
from specdec_eagle.config import EagleConfig, check_weights
from specdec_eagle.reference import (
    check_propose_context,
    check_target_arrays,
    inverse_frequencies,
    missing_slot,
)
from specdec_eagle.search import extended_beams
from specdec_eagle.tree import tree_options
from specdec_mlx import ops

__all__ = [
    "DraftAttention",
    "DraftMLP",
    "DraftNorm",
    "MlxEagleDrafter",
    "MlxEagleNet",
    "SlotDrafter",
    "TreeSearch",
]


class DraftNorm(nn.Module):
    def __init__(self, size: int, eps: float):
        super().__init__()
        self.weight = mx.ones((size,))
        self.eps = eps

    def __call__(self, x: mx.array) -> mx.array:
        z = x.astype(mx.float32)
        return (z * mx.rsqrt(mx.mean(z * z, axis=-1, keepdims=True) + self.eps)).astype(
            x.dtype
        ) * self.weight


class DraftAttention(nn.Module):
    """The draft layer's attention projections; ``inputs``: the width its q/k/v read (EAGLE's
    hidden size; EAGLE-3's twice that: the embedding and the fused feature side by side)."""

    def __init__(self, config, inputs: int | None = None):
        super().__init__()
        hidden, q_out, kv_out = (
            config.hidden_size,
            config.num_heads * config.head_dim,
            config.num_kv_heads * config.head_dim,
        )
        inputs = hidden if inputs is None else inputs
        self.q_proj = nn.Linear(inputs, q_out, bias=False)
        self.k_proj = nn.Linear(inputs, kv_out, bias=False)
        self.v_proj = nn.Linear(inputs, kv_out, bias=False)
        self.o_proj = nn.Linear(q_out, hidden, bias=False)
        self.heads, self.kv_heads, self.head_dim = (
            config.num_heads,
            config.num_kv_heads,
            config.head_dim,
        )
        self._inv_freq = mx.array(inverse_frequencies(config), dtype=mx.float32)  # not a weight

    def _rotate(self, x: mx.array, positions: mx.array) -> mx.array:
        angles = positions[:, None, :, None].astype(mx.float32) * self._inv_freq  # (B, 1, m, Dh/2)
        angles = mx.concatenate([angles, angles], axis=-1)
        cos, sin = mx.cos(angles).astype(x.dtype), mx.sin(angles).astype(x.dtype)
        half = x.shape[-1] // 2
        return x * cos + mx.concatenate([-x[..., half:], x[..., :half]], axis=-1) * sin

    def attend(self, y: mx.array, positions: mx.array, past_keys, past_values, mask: mx.array):
        """As ``specdec_eagle.torch.DraftAttention.attend``: y (B, m, inputs), positions (B, m),
        past keys and values (B, Hkv, S, Dh) or None, mask (B, m, S + m) -> o_proj(attention)
        (B, m, H), new keys, new values (B, Hkv, m, Dh)."""
        batch, m, _ = y.shape
        heads, kv_heads, dim = self.heads, self.kv_heads, self.head_dim
        q = self.q_proj(y).reshape(batch, m, heads, dim).transpose(0, 2, 1, 3)
        k = self.k_proj(y).reshape(batch, m, kv_heads, dim).transpose(0, 2, 1, 3)
        v = self.v_proj(y).reshape(batch, m, kv_heads, dim).transpose(0, 2, 1, 3)
        q, k = self._rotate(q, positions), self._rotate(k, positions)
        keys = k if past_keys is None else mx.concatenate([past_keys, k], axis=2)
        values = v if past_values is None else mx.concatenate([past_values, v], axis=2)
        group = heads // kv_heads
        keys, values = mx.repeat(keys, group, axis=1), mx.repeat(values, group, axis=1)
        scores = (q @ keys.transpose(0, 1, 3, 2)) / math.sqrt(dim)  # (B, Hq, m, S + m)
        scores = mx.where(mask[:, None], scores.astype(mx.float32), float("-inf"))
        weights = mx.softmax(scores, axis=-1).astype(y.dtype)
        context = (weights @ values).transpose(0, 2, 1, 3).reshape(batch, m, heads * dim)
        return self.o_proj(context), k, v


class DraftMLP(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.gate_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.up_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size, bias=False)

    def __call__(self, x: mx.array) -> mx.array:
        return self.down_proj(nn.silu(self.gate_proj(x)) * self.up_proj(x))


class _Layer(nn.Module):
    def __init__(self, config: EagleConfig):
        super().__init__()
        self.self_attn = DraftAttention(config)
        self.post_attention_layernorm = DraftNorm(config.hidden_size, config.rms_norm_eps)
        self.mlp = DraftMLP(config)


class MlxEagleNet(nn.Module):
    """The EAGLE draft model with the checkpoint's names (``fc.*``, ``layers.0.*``)."""

    def __init__(self, config: EagleConfig):
        super().__init__()
        self.config = config
        self.fc = nn.Linear(2 * config.hidden_size, config.hidden_size, bias=config.fc_bias)
        self.layers = [_Layer(config)]

    @classmethod
    def from_weights(cls, config: EagleConfig, weights: dict, *, like: mx.array) -> MlxEagleNet:
        check_weights(config, weights)
        net = cls(config)
        net.load_weights(
            [
                (name, ops.placed(w, like))
                for name, w in weights.items()
                if name != "vocab_shortlist"
            ],
            strict=True,
        )
        mx.eval(net.parameters())
        return net

    def fuse(self, embed_tokens: mx.array, tokens: mx.array, features: mx.array) -> mx.array:
        """fc([embed(tokens) ; features]): tokens (...), features (..., H) -> (..., H)."""
        return self.fc(
            mx.concatenate([embed_tokens[tokens], features.astype(embed_tokens.dtype)], axis=-1)
        )

    def layer(self, x: mx.array, positions: mx.array, past_keys, past_values, mask: mx.array):
        """As ``specdec_eagle.torch.EagleNet.layer``: x (B, m, H), positions (B, m), past keys
        and values (B, Hkv, S, Dh) or None, mask (B, m, S + m) -> out, new keys, new values."""
        layer = self.layers[0]
        attended, k, v = layer.self_attn.attend(x, positions, past_keys, past_values, mask)
        h = x + attended
        return h + layer.mlp(layer.post_attention_layernorm(h)), k, v


class SlotDrafter:
    """EAGLE's and EAGLE-3's request lifecycle on MLX (``reference.SlotDrafter``'s twin): per
    slot ``keys``, ``values`` (Hkv, T, Dh), ``length``, the ``pending`` feature and the
    ``tokens`` the cache stands for. A subclass sets ``NAME``, ``config``, ``embed_tokens``
    (the table tokens are embedded with), ``net`` (``fuse``, ``layer``) and ``slots`` (an empty
    dict), and gives ``step_features(result)``: the per-position features of a ``PromptOutput``
    (P, H) or an ``Accepted`` (B, A, H)."""

    NAME = "EAGLE"
    CATCH_UP = 32  # entries observed are run when the slot next drafts or this many wait

    def begin(self, slot: int, prompt, output: PromptOutput) -> None:
        """Run the layer over the prompt's entries; keep its last feature pending."""
        host = np.asarray(prompt, dtype=np.int64)
        features = self.step_features(output)  # (P, H)
        cfg = self.config
        empty = mx.zeros((cfg.num_kv_heads, 0, cfg.head_dim), dtype=self.embed_tokens.dtype)
        state = {
            "keys": empty,
            "values": empty,
            "length": 0,
            "pending": features[-1],
            "tokens": [int(host[0])],
            "waiting": [],  # (tokens (n,), features (n, H)) observed, not yet run
        }
        if len(host) > 1:
            self._append(state, host[1:], features[:-1])
            state["tokens"] += host[1:].tolist()
        self.slots[int(slot)] = state

    def observe(self, accepted: Accepted) -> None:
        """Queue each row's root entry and accepted entries, run through the layer in one
        forward when the slot next drafts (``context``) or ``CATCH_UP`` wait (torch's
        ``SlotDrafter.observe``); the last accepted feature is pending."""
        features = self.step_features(accepted)  # (B, A, H)
        tokens = np.asarray(accepted.tokens, dtype=np.int64)
        for b, slot in enumerate(np.asarray(accepted.slots).tolist()):
            count = int(accepted.num_accepted[b]) + 1  # the root and the accepted drafted tokens
            state = self._slot(slot)
            entry_features = mx.concatenate([state["pending"][None], features[b, : count - 1]])
            state["waiting"].append((tokens[b, :count], entry_features))
            state["tokens"] += tokens[b, :count].tolist()
            state["pending"] = features[b, count - 1]
            if sum(len(t) for t, _ in state["waiting"]) >= self.CATCH_UP:
                self._catch_up(state)

    def _catch_up(self, state: dict) -> None:
        """Run the slot's waiting entries through the layer, in one forward."""
        if state["waiting"]:
            tokens, features = zip(*state["waiting"])
            self._append(state, np.concatenate(tokens), mx.concatenate(features))
            state["waiting"] = []

    def end(self, slot: int, reason: str) -> None:
        """The request in ``slot`` ended (any ``reason``): drop its state."""
        self.slots.pop(int(slot), None)

    def slot_tokens(self, slot: int) -> tuple:
        """The tokens the draft cache of ``slot`` stands for (``specdec.protocols.SlotView``)."""
        return tuple(self._slot(slot)["tokens"])

    def _slot(self, slot: int) -> dict:
        if slot not in self.slots:
            raise missing_slot(slot, self.NAME)
        return self.slots[slot]

    def _append(self, state: dict, tokens: np.ndarray, features: mx.array) -> None:
        """Run entries of host ``tokens`` (n,) with (n, H) features after the cache, causally."""
        length, n = state["length"], len(tokens)
        positions = mx.arange(length, length + n)[None]
        mask = mx.array(np.tril(np.ones((n, length + n), dtype=bool), k=length))[None]
        x = self.net.fuse(
            self.embed_tokens, mx.array(tokens.astype(np.int32))[None], features[None]
        )
        _, k, v = self.net.layer(x, positions, state["keys"][None], state["values"][None], mask)
        state["keys"] = mx.concatenate([state["keys"], k[0]], axis=1)
        state["values"] = mx.concatenate([state["values"], v[0]], axis=1)
        state["length"] = length + n
        mx.eval(state["keys"], state["values"])

    def context(self, slots) -> tuple[list[dict], tuple]:
        """The states of ``slots`` and (keys, values (B, Hkv, span, Dh) padded to the longest,
        a mask (B, span) of the real positions, lengths (B,)): ``TreeSearch``'s context."""
        states = [self._slot(int(s)) for s in np.asarray(slots).tolist()]
        for state in states:
            self._catch_up(state)
        span = max(s["length"] for s in states)
        pad = lambda a: mx.pad(a, [(0, 0), (0, span - a.shape[1]), (0, 0)])  # noqa: E731
        keys = mx.stack([pad(s["keys"]) for s in states])
        values = mx.stack([pad(s["values"]) for s in states])
        lengths = mx.array([s["length"] for s in states], dtype=mx.int32)
        return states, (keys, values, mx.arange(span)[None] < lengths[:, None], lengths)


class MlxEagleDrafter(SlotDrafter):
    """EAGLE as a stateful ``specdec.protocols.Drafter`` on the mlx backend (same options as the
    reference's ``EagleDrafter``); each slot's draft cache is an (Hkv, T, Dh) pair of arrays.
    int8: as on torch, but MLX computes in the weights' dtype, so only None and False are taken
    (``ops.draft_weight``)."""

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
        embed_tokens, lm_head = ops.as_array(embed_tokens), ops.as_array(lm_head)
        ops.draft_weight(lm_head, int8=int8)  # refuses int8=True with the reason
        check_target_arrays(config, embed_tokens, lm_head)
        self.config, self.embed_tokens = config, embed_tokens
        self.net = MlxEagleNet.from_weights(config, weights, like=embed_tokens)
        self.shortlist = None
        if config.shortlist_size is not None:
            self.shortlist = ops.placed(weights["vocab_shortlist"], embed_tokens, index=True)
        self.head_rows = lm_head if self.shortlist is None else lm_head[self.shortlist]  # (S, H)
        self.top_k, self.depth, self.total_tokens = tree_options(config, top_k, depth, total_tokens)
        self.slots: dict[int, dict] = {}

    def step_features(self, result) -> mx.array:
        """The target's last hidden states: (P, H) of a prompt, (B, A, H) of a step."""
        return ops.as_array(result.hidden).astype(self.embed_tokens.dtype)

    def log_probs(self, out: mx.array) -> mx.array:
        return ops.log_softmax(out @ self.head_rows.T)

    def to_vocab(self, local: mx.array) -> mx.array:
        return local if self.shortlist is None else self.shortlist[local]

    def propose(self, context: DraftContext) -> Draft:
        """Beams (B, W = total_tokens, L = depth + 1), one dynamic tree per row."""
        roots = ops.as_array(context.root_tokens, dtype=mx.int32)
        hidden = ops.as_array(context.hidden).astype(self.embed_tokens.dtype)
        check_propose_context(self.config, context, roots, hidden.shape)
        _, tree_context = self.context(context.slots)
        beams = TreeSearch(self, *tree_context).run(roots, hidden)
        return Draft(root_tokens=roots, beams=beams, sampled=False)


class TreeSearch:
    """One step's dynamic trees (``specdec_eagle.torch.TreeSearch`` on MLX arrays)."""

    def __init__(self, drafter: MlxEagleDrafter, ctx_keys, ctx_values, ctx_mask, lengths):
        self.drafter, self.net = drafter, drafter.net
        self.ctx_keys, self.ctx_values, self.ctx_mask, self.lengths = (
            ctx_keys,
            ctx_values,
            ctx_mask,
            lengths,
        )
        self.keys = self.values = self.anc = self.outs = self.top1 = None

    def _run(self, tokens, features, levels, parents):
        batch, m = tokens.shape
        x = self.net.fuse(self.drafter.embed_tokens, tokens, features)
        positions = self.lengths[:, None] + levels
        eye = mx.broadcast_to(mx.eye(m, dtype=mx.bool_), (batch, m, m))
        if self.keys is None:
            tree_mask = mx.zeros((batch, m, 0), dtype=mx.bool_)
            past_keys, past_values = self.ctx_keys, self.ctx_values
        else:
            tree_mask = mx.take_along_axis(
                self.anc,
                mx.broadcast_to(parents[:, :, None], (batch, m, self.anc.shape[2])),
                axis=1,
            )
            past_keys = mx.concatenate([self.ctx_keys, self.keys], axis=2)
            past_values = mx.concatenate([self.ctx_values, self.values], axis=2)
        mask = mx.concatenate(
            [
                mx.broadcast_to(self.ctx_mask[:, None], (batch, m, self.ctx_mask.shape[1])),
                tree_mask,
                eye,
            ],
            axis=2,
        )
        out, k, v = self.net.layer(x, positions, past_keys, past_values, mask)
        log_probs = self.drafter.log_probs(out)
        top1 = ops.top_k_lowest_index(log_probs, 1)[1][..., 0]
        if self.keys is None:
            self.keys, self.values, self.anc, self.outs, self.top1 = k, v, eye, out, top1
        else:
            grown = mx.pad(self.anc, [(0, 0), (0, 0), (0, m)])
            self.anc = mx.concatenate([grown, mx.concatenate([tree_mask, eye], axis=2)], axis=1)
            self.keys, self.values = (
                mx.concatenate([self.keys, k], axis=2),
                mx.concatenate([self.values, v], axis=2),
            )
            self.outs, self.top1 = (
                mx.concatenate([self.outs, out], axis=1),
                mx.concatenate([self.top1, top1], axis=1),
            )
        return log_probs

    def _gather_outs(self, parents):
        batch, m = parents.shape
        return mx.take_along_axis(
            self.outs, mx.broadcast_to(parents[:, :, None], (batch, m, self.outs.shape[2])), axis=1
        )

    def run(self, roots: mx.array, hidden: mx.array) -> mx.array:
        drafter, batch = self.drafter, roots.shape[0]
        k, depth = drafter.top_k, drafter.depth
        zeros = mx.zeros((batch, 1), dtype=mx.int32)
        log_probs = self._run(roots[:, None], hidden[:, None], zeros, None)[:, 0]  # (B, S)
        scores, local = ops.top_k_lowest_index(log_probs, k)  # (B, k)
        cand_tokens = [roots[:, None], drafter.to_vocab(local).astype(mx.int32)]
        cand_parents = [zeros - 1, mx.broadcast_to(zeros, (batch, k))]
        cand_scores = [mx.zeros((batch, 1), dtype=scores.dtype), scores]
        cand_entry = [zeros, mx.full((batch, k), -1, dtype=mx.int32)]
        frontier = mx.broadcast_to(mx.arange(1, k + 1, dtype=mx.int32)[None], (batch, k))
        frontier_scores, frontier_parent = scores, mx.broadcast_to(zeros, (batch, k))
        count = 1 + k
        for level in range(2, depth + 1):
            first_entry = self.anc.shape[1]
            tokens = mx.take_along_axis(mx.concatenate(cand_tokens, axis=1), frontier, axis=1)
            log_probs = self._run(
                tokens,
                self._gather_outs(frontier_parent),
                mx.full(frontier.shape, level - 1, dtype=mx.int32),
                frontier_parent,
            )
            entries = mx.broadcast_to(
                mx.arange(first_entry, first_entry + k, dtype=mx.int32)[None], (batch, k)
            )
            entry_of = mx.concatenate(cand_entry, axis=1)
            hit = mx.arange(entry_of.shape[1])[None, :, None] == frontier[:, None, :]  # (B, C, k)
            entry_of = mx.where(
                hit.any(axis=2), mx.sum(mx.where(hit, entries[:, None, :], 0), axis=2), entry_of
            )
            child_scores, child_local = ops.top_k_lowest_index(log_probs, k)  # (B, k, k)
            child_scores = (frontier_scores[:, :, None] + child_scores).reshape(batch, k * k)
            cand_entry = [entry_of, mx.full((batch, k * k), -1, dtype=mx.int32)]
            cand_tokens.append(drafter.to_vocab(child_local).astype(mx.int32).reshape(batch, k * k))
            cand_parents.append(
                mx.broadcast_to(frontier[:, :, None], (batch, k, k)).reshape(batch, k * k)
            )
            cand_scores.append(child_scores)
            frontier_scores, best = ops.top_k_lowest_index(child_scores, k)
            frontier_parent = mx.take_along_axis(entries, best // k, axis=1)
            frontier = (count + best).astype(mx.int32)
            count += k * k
        tokens, parents = mx.concatenate(cand_tokens, axis=1), mx.concatenate(cand_parents, axis=1)
        all_scores, entry_of = (
            mx.concatenate(cand_scores, axis=1),
            mx.concatenate(cand_entry, axis=1),
        )
        return self._beams(
            np.array(tokens), np.array(parents), np.array(all_scores), np.array(entry_of)
        )

    def _beams(self, tokens, parents, scores, entry_of) -> mx.array:
        """Beams (B, W, L) of the kept candidates, short leaves extended along their top-1
        children (``specdec_eagle.search.extended_beams``, on the host)."""
        drafter = self.drafter

        def run(run_tokens, run_parent, run_level) -> int:
            first = self.anc.shape[1]
            parent = mx.array(run_parent.astype(np.int32))
            self._run(
                mx.array(run_tokens.astype(np.int32)),
                self._gather_outs(parent),
                mx.array(run_level.astype(np.int32)),
                parent,
            )
            return first

        beams = extended_beams(
            tokens,
            parents,
            scores,
            entry_of,
            depth=drafter.depth,
            width=drafter.total_tokens,
            run=run,
            top1=lambda: np.array(drafter.to_vocab(self.top1)),
        )
        return mx.array(beams.astype(np.int32))
