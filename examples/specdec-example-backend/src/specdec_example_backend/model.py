"""A Llama-family target (llama, qwen2) in float32 NumPy: specdec.protocols.TargetModel.

The KV cache holds, per request slot and layer, keys and values of shape (kv_heads, capacity,
head_dim), allocated once. ``admit`` prefills a prompt into a free slot; ``forward_tree`` runs
prompt chunks (``context``, each alone, committed at once) and every tree node of slot
``slots[b]`` at position ``length + depth`` attending to the slot's cache and to its ancestors
(``tree.ancestor_mask``), and keeps the nodes' keys and values aside;
``commit`` appends those of the accepted path (root first) to each slot; ``release`` frees a slot.
The checks every target makes of its arguments come from ``specdec.slots``.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import specdec
from specdec.slots import (
    check_forward,
    check_layers,
    check_prompt,
    check_slot_arguments,
    check_slots,
)


def rms_norm(x, weight, eps):
    return (x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * weight).astype(np.float32)


def rotate_half(x):
    half = x.shape[-1] // 2
    return np.concatenate([-x[..., half:], x[..., :half]], axis=-1)


class Float32Target:
    """Attributes generate and drafters read: vocab_size, hidden_size, num_layers, num_slots,
    capacity, eos_token_ids, tokenizer, context_length, dtype, name, embed_tokens and lm_head
    (V, H)."""

    dtype = "float32"

    def __init__(self, folder, *, slots=1, capacity=None):
        from safetensors.numpy import load_file

        folder = Path(folder)
        config = json.loads((folder / "config.json").read_text())
        if config.get("rope_scaling") or (
            config.get("sliding_window") and config.get("use_sliding_window", True)
        ):
            raise ValueError(
                "the numpy32 backend runs Llama-family models without rope scaling or a sliding "
                "window"
            )
        weights = {
            k: np.asarray(v, dtype=np.float32)
            for k, v in load_file(str(folder / "model.safetensors")).items()
        }
        self.name = folder.name
        self.vocab_size, self.hidden_size = int(config["vocab_size"]), int(config["hidden_size"])
        self.heads = int(config["num_attention_heads"])
        self.kv_heads = int(config.get("num_key_value_heads") or self.heads)
        self.head_dim = int(config.get("head_dim") or self.hidden_size // self.heads)
        self.eps = float(config["rms_norm_eps"])
        self.context_length = int(config.get("max_position_embeddings") or 0) or None
        self.inv_freq = 1.0 / float(config.get("rope_theta", 10000.0)) ** (
            np.arange(0, self.head_dim, 2, dtype=np.float64) / self.head_dim
        )
        self.eos_token_ids = self._eos_ids(folder, config)
        tokenizer_file = folder / "tokenizer.json"
        if tokenizer_file.is_file():
            from tokenizers import Tokenizer

            self.tokenizer = Tokenizer.from_file(str(tokenizer_file))
        else:
            self.tokenizer = None
        self.embed_tokens = weights["model.embed_tokens.weight"]
        self.lm_head = (
            self.embed_tokens
            if config.get("tie_word_embeddings", True)
            else weights["lm_head.weight"]
        )
        self.final_norm = weights["model.norm.weight"]
        self.layers = []
        for i in range(int(config["num_hidden_layers"])):
            prefix = f"model.layers.{i}."
            self.layers.append(
                {
                    key[len(prefix) :]: value
                    for key, value in weights.items()
                    if key.startswith(prefix)
                }
            )
        self.num_layers = len(self.layers)
        self.num_slots, self.capacity = check_slot_arguments(
            slots, capacity, self.context_length or 4096
        )
        shape = (self.num_slots, self.num_layers, 2, self.kv_heads, self.capacity, self.head_dim)
        self.cache = np.zeros(shape, dtype=np.float32)  # [slot, layer, keys|values]
        self.lengths = np.zeros(self.num_slots, dtype=np.int64)
        self.admitted = np.zeros(self.num_slots, dtype=bool)
        self.staged = None  # (slots, per row and layer the tree nodes' (keys, values))

    @staticmethod
    def _eos_ids(folder: Path, config: dict) -> tuple[int, ...]:
        generation = folder / "generation_config.json"
        value = config.get("eos_token_id")
        if generation.is_file():
            value = json.loads(generation.read_text()).get("eos_token_id", value)
        return () if value is None else tuple(int(v) for v in np.atleast_1d(value))

    def _linear(self, x, layer, name):
        out = x @ layer[name + ".weight"].T
        bias = layer.get(name + ".bias")
        return out if bias is None else out + bias

    def _rope(self, x, positions):
        angles = positions[:, None].astype(np.float64) * self.inv_freq[None, :]  # (n, head_dim / 2)
        angles = np.concatenate([angles, angles], axis=-1)
        cos, sin = np.cos(angles).astype(np.float32), np.sin(angles).astype(np.float32)
        return x * cos + rotate_half(x) * sin

    def _run(self, slot, tokens, positions, mask, layers=()):
        """Hidden states (n, H) of new tokens of ``slot``, their (keys, values) per layer and the
        outputs {layer: (n, H)} of decoder ``layers``. positions (n,) absolute; mask (n, n): new
        token i sees new token j."""
        n = len(tokens)
        x = self.embed_tokens[tokens]
        entries, outputs = [], {}
        length = self.lengths[slot]
        for index, layer in enumerate(self.layers):
            h = rms_norm(x, layer["input_layernorm.weight"], self.eps)
            q = (
                self._linear(h, layer, "self_attn.q_proj")
                .reshape(n, self.heads, self.head_dim)
                .transpose(1, 0, 2)
            )
            k = (
                self._linear(h, layer, "self_attn.k_proj")
                .reshape(n, self.kv_heads, self.head_dim)
                .transpose(1, 0, 2)
            )
            v = (
                self._linear(h, layer, "self_attn.v_proj")
                .reshape(n, self.kv_heads, self.head_dim)
                .transpose(1, 0, 2)
            )
            q, k = self._rope(q, positions), self._rope(k, positions)
            entries.append((k, v))
            past_k, past_v = (
                self.cache[slot, index, 0, :, :length],
                self.cache[slot, index, 1, :, :length],
            )
            keys = np.repeat(
                np.concatenate([past_k, k], axis=1), self.heads // self.kv_heads, axis=0
            )
            values = np.repeat(
                np.concatenate([past_v, v], axis=1), self.heads // self.kv_heads, axis=0
            )
            scores = (
                q @ keys.transpose(0, 2, 1) / np.float32(np.sqrt(self.head_dim))
            )  # (heads, n, S + n)
            allowed = np.concatenate([np.ones((n, past_k.shape[1]), dtype=bool), mask], axis=1)
            scores = np.where(allowed, scores, -np.inf)
            probs = np.exp(scores - scores.max(axis=-1, keepdims=True))
            probs /= probs.sum(axis=-1, keepdims=True)
            out = (probs @ values).transpose(1, 0, 2).reshape(n, self.heads * self.head_dim)
            x = x + self._linear(out, layer, "self_attn.o_proj")
            h = rms_norm(x, layer["post_attention_layernorm.weight"], self.eps)
            gate = self._linear(h, layer, "mlp.gate_proj")
            x = x + self._linear(
                gate / (1 + np.exp(-gate)) * self._linear(h, layer, "mlp.up_proj"),
                layer,
                "mlp.down_proj",
            )
            if index in layers:
                outputs[index] = x
        return rms_norm(x, self.final_norm, self.eps), entries, outputs

    def _append(self, slot, entries, nodes=None):
        """Write per-layer (keys, values) (kv_heads, n, head_dim), or their ``nodes``, behind the
        slot's entries."""
        start = self.lengths[slot]
        for index, (k, v) in enumerate(entries):
            k, v = (k, v) if nodes is None else (k[:, nodes], v[:, nodes])
            self.cache[slot, index, 0, :, start : start + k.shape[1]] = k
            self.cache[slot, index, 1, :, start : start + k.shape[1]] = v
        self.lengths[slot] += entries[0][0].shape[1] if nodes is None else len(nodes)

    def admit(self, slot, prompt, *, layers=()):
        """Prefill ``prompt`` into the free ``slot``: logits (V,) at its last token, hidden (P, H)
        and the outputs of decoder ``layers`` (P, H) at every token."""
        tokens = check_prompt(prompt, self.vocab_size)
        check_slots(self.admitted, [slot], admitted_state=False, what="admit")
        return self.forward_tree(None, (), context=[(slot, tokens)], layers=layers).context[0]

    def release(self, slot):
        slot = int(check_slots(self.admitted, [slot], admitted_state=True, what="release")[0])
        self.admitted[slot], self.lengths[slot] = False, 0
        if self.staged is not None and slot in self.staged[0]:  # a staged tree of other slots stays
            self.staged = None

    def forward_tree(self, tree, slots, *, context=(), layers=()):
        """Prompt chunks (``context``: (slot, tokens) pairs, committed here; a free slot is claimed)
        and tree rows (logits (B, N, V) and hidden (B, N, H) of every node, kept until commit)."""
        wanted = check_layers(layers, self.num_layers)
        slots, chunks, _ = check_forward(
            tree, slots, context, self.admitted, self.lengths, self.capacity, self.vocab_size
        )
        prompts = []
        for slot, chunk in chunks:
            if not self.admitted[slot]:
                self.admitted[slot], self.lengths[slot] = True, 0
            start, causal = (
                self.lengths[slot],
                np.tril(np.ones((len(chunk), len(chunk)), dtype=bool)),
            )
            hidden, entries, outputs = self._run(
                slot, chunk, start + np.arange(len(chunk)), causal, wanted
            )
            self._append(slot, entries)
            prompts.append(
                specdec.PromptOutput(
                    logits=hidden[-1] @ self.lm_head.T, hidden=hidden, layers=outputs
                )
            )
        if tree is None:
            self.staged = None
            return specdec.TargetOutput(logits=None, hidden=None, context=prompts)
        tokens, depth = np.asarray(tree.tokens), np.asarray(tree.depth)
        mask = np.asarray(tree.ancestor_mask, dtype=bool)
        hidden = np.empty(tokens.shape + (self.hidden_size,), dtype=np.float32)
        outputs = {i: np.empty_like(hidden) for i in wanted}
        staged = []
        for b, slot in enumerate(slots):
            hidden[b], entries, row_outputs = self._run(
                slot, tokens[b], self.lengths[slot] + depth[b], mask[b], wanted
            )
            for i, value in row_outputs.items():
                outputs[i][b] = value
            staged.append(entries)
        self.staged = (slots, staged)
        return specdec.TargetOutput(
            logits=hidden @ self.lm_head.T, hidden=hidden, layers=outputs, context=prompts
        )

    def commit(self, tree, verdict):
        """Append the keys and values of each row's accepted path (root first) to its slot."""
        path, accepted = np.asarray(verdict.path), np.asarray(verdict.num_accepted)
        slots, staged = self.staged
        for b, (slot, entries) in enumerate(zip(slots, staged)):
            self._append(slot, entries, path[b, : accepted[b] + 1])
        self.staged = None
