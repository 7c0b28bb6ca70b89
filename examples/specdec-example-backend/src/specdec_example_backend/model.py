"""A Llama-family target (llama, qwen2) in float32 NumPy: specdec.protocols.TargetModel.

The KV cache holds, per row and layer, keys and values of shape (kv_heads, S, head_dim).
``forward_tree`` runs every tree node at position ``cache length + depth`` attending to the cache
and to its ancestors (``tree.ancestor_mask``), and keeps the nodes' keys and values aside;
``commit`` appends those of the accepted path (root first) to the cache. The cache grows by
concatenation, which is simple and slow; a real backend preallocates.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import specdec


def rms_norm(x, weight, eps):
    return (x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * weight).astype(np.float32)


def rotate_half(x):
    half = x.shape[-1] // 2
    return np.concatenate([-x[..., half:], x[..., :half]], axis=-1)


class Float32Target:
    """Attributes generate and drafters read: vocab_size, hidden_size, eos_token_ids, tokenizer,
    context_length, dtype, name, embed_tokens and lm_head (V, H)."""

    dtype = "float32"

    def __init__(self, folder):
        from safetensors.numpy import load_file

        folder = Path(folder)
        config = json.loads((folder / "config.json").read_text())
        if config.get("rope_scaling") or (config.get("sliding_window") and config.get("use_sliding_window", True)):
            raise ValueError("the numpy32 backend runs Llama-family models without rope scaling or a sliding window")
        weights = {k: np.asarray(v, dtype=np.float32) for k, v in load_file(str(folder / "model.safetensors")).items()}
        self.name = folder.name
        self.vocab_size, self.hidden_size = int(config["vocab_size"]), int(config["hidden_size"])
        self.heads = int(config["num_attention_heads"])
        self.kv_heads = int(config.get("num_key_value_heads") or self.heads)
        self.head_dim = int(config.get("head_dim") or self.hidden_size // self.heads)
        self.eps = float(config["rms_norm_eps"])
        self.context_length = int(config.get("max_position_embeddings") or 0) or None
        self.inv_freq = 1.0 / float(config.get("rope_theta", 10000.0)) ** (
            np.arange(0, self.head_dim, 2, dtype=np.float64) / self.head_dim)
        self.eos_token_ids = self._eos_ids(folder, config)
        tokenizer_file = folder / "tokenizer.json"
        if tokenizer_file.is_file():
            from tokenizers import Tokenizer

            self.tokenizer = Tokenizer.from_file(str(tokenizer_file))
        else:
            self.tokenizer = None
        self.embed_tokens = weights["model.embed_tokens.weight"]
        self.lm_head = self.embed_tokens if config.get("tie_word_embeddings", True) else weights["lm_head.weight"]
        self.final_norm = weights["model.norm.weight"]
        self.layers = []
        for i in range(int(config["num_hidden_layers"])):
            prefix = f"model.layers.{i}."
            self.layers.append({key[len(prefix):]: value for key, value in weights.items() if key.startswith(prefix)})
        self.cache: list[list[tuple[np.ndarray, np.ndarray]]] = []  # [row][layer] -> (keys, values)
        self.staged = None  # per row, per layer: the tree nodes' (keys, values)

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

    def _run(self, row, tokens, positions, mask):
        """Hidden states (n, H) of new tokens of cache row ``row`` and their (keys, values) per layer.
        positions (n,) absolute; mask (n, n): new token i sees new token j."""
        n = len(tokens)
        x = self.embed_tokens[tokens]
        entries = []
        for index, layer in enumerate(self.layers):
            h = rms_norm(x, layer["input_layernorm.weight"], self.eps)
            q = self._linear(h, layer, "self_attn.q_proj").reshape(n, self.heads, self.head_dim).transpose(1, 0, 2)
            k = self._linear(h, layer, "self_attn.k_proj").reshape(n, self.kv_heads, self.head_dim).transpose(1, 0, 2)
            v = self._linear(h, layer, "self_attn.v_proj").reshape(n, self.kv_heads, self.head_dim).transpose(1, 0, 2)
            q, k = self._rope(q, positions), self._rope(k, positions)
            entries.append((k, v))
            past_k, past_v = self.cache[row][index] if self.cache[row] else (k[:, :0], v[:, :0])
            keys = np.repeat(np.concatenate([past_k, k], axis=1), self.heads // self.kv_heads, axis=0)
            values = np.repeat(np.concatenate([past_v, v], axis=1), self.heads // self.kv_heads, axis=0)
            scores = q @ keys.transpose(0, 2, 1) / np.float32(np.sqrt(self.head_dim))  # (heads, n, S + n)
            allowed = np.concatenate([np.ones((n, past_k.shape[1]), dtype=bool), mask], axis=1)
            scores = np.where(allowed, scores, -np.inf)
            probs = np.exp(scores - scores.max(axis=-1, keepdims=True))
            probs /= probs.sum(axis=-1, keepdims=True)
            out = (probs @ values).transpose(1, 0, 2).reshape(n, self.heads * self.head_dim)
            x = x + self._linear(out, layer, "self_attn.o_proj")
            h = rms_norm(x, layer["post_attention_layernorm.weight"], self.eps)
            gate = self._linear(h, layer, "mlp.gate_proj")
            x = x + self._linear(gate / (1 + np.exp(-gate)) * self._linear(h, layer, "mlp.up_proj"), layer, "mlp.down_proj")
        return rms_norm(x, self.final_norm, self.eps), entries

    def _length(self, row):
        return self.cache[row][0][0].shape[1] if self.cache[row] else 0

    def prefill(self, prompts):
        """Start a new cache for these prompts; logits (B, 1, V) and hidden (B, 1, H) at each last token."""
        self.cache, self.staged = [[] for _ in prompts], None
        hidden = np.empty((len(prompts), 1, self.hidden_size), dtype=np.float32)
        for b, prompt in enumerate(prompts):
            tokens = np.asarray(prompt, dtype=np.int64)
            causal = np.tril(np.ones((len(tokens), len(tokens)), dtype=bool))
            out, self.cache[b] = self._run(b, tokens, np.arange(len(tokens)), causal)
            hidden[b, 0] = out[-1]
        return specdec.TargetOutput(logits=hidden @ self.lm_head.T, hidden=hidden)

    def forward_tree(self, tree):
        """Logits (B, N, V) and hidden (B, N, H) of every node; the cache is unchanged until commit."""
        tokens, depth = np.asarray(tree.tokens), np.asarray(tree.depth)
        mask = np.asarray(tree.ancestor_mask, dtype=bool)
        if tokens.shape[0] != len(self.cache):
            raise specdec.InvalidInputError(f"the tree has {tokens.shape[0]} rows, the cache {len(self.cache)}")
        hidden = np.empty(tokens.shape + (self.hidden_size,), dtype=np.float32)
        self.staged = []
        for b in range(tokens.shape[0]):
            hidden[b], entries = self._run(b, tokens[b], self._length(b) + depth[b], mask[b])
            self.staged.append(entries)
        return specdec.TargetOutput(logits=hidden @ self.lm_head.T, hidden=hidden)

    def commit(self, tree, verdict):
        """Append the keys and values of each row's accepted path (root first) to its cache."""
        path, accepted = np.asarray(verdict.path), np.asarray(verdict.num_accepted)
        for b, entries in enumerate(self.staged):
            nodes = path[b, : accepted[b] + 1]
            self.cache[b] = [(np.concatenate([k0, k[:, nodes]], axis=1), np.concatenate([v0, v[:, nodes]], axis=1))
                             for (k0, v0), (k, v) in zip(self.cache[b], entries)]
        self.staged = None
