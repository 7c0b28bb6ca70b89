"""The float64 reference target: a Llama-family decoder (llama, qwen2, mistral) with tree attention.

One decoder layer (Touvron et al. 2023, "LLaMA", section 2.2):

    h = x + o_proj(attention(rope(q_proj(rms_norm(x))), rope(k_proj(...)), v_proj(...)))
    y = h + down_proj(silu(gate_proj(rms_norm(h))) * up_proj(rms_norm(h)))

with grouped-query attention (each key/value head serves ``heads / kv_heads`` query heads) and
rotary embeddings in the Hugging Face "rotate_half" convention. After the last layer a final
RMSNorm gives the hidden state the drafters read, and the LM head gives the logits.

Tree attention: node i of a draft tree sits at position ``cache_length + depth[i]`` and
attends to every committed entry of its row plus the tree nodes j with ``ancestor_mask[i, j]``;
a prompt is the special case of a chain with a causal mask.
"""

from __future__ import annotations

import hashlib
import os
from typing import Any, Mapping, Sequence

import attrs
import numpy as np

from specdec.errors import InvalidInputError
from specdec.models.llama import LlamaConfig, check_folder, load_tensors, load_tokenizer
from specdec.reference.kvcache import TreeKVCache
from specdec.reference.weights import check_weights_header
from specdec.slots import SlotTarget, check_forward, check_slot_arguments
from specdec.types import DraftTree, PromptOutput, TargetOutput, Verdict

__all__ = [
    "LlamaConfig",
    "ReferenceTarget",
    "apply_rotary",
    "attend",
    "load_target",
    "rms_norm",
    "rotary_cos_sin",
    "rotary_inverse_frequencies",
    "silu",
]

PREFILL_CHUNK = 128  # prompt tokens per forward during prefill (bounds the attention matrix)


def rms_norm(x: np.ndarray, weight: np.ndarray, eps: float) -> np.ndarray:
    """x (..., H) scaled to unit root-mean-square, then by ``weight`` (H,)."""
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * weight


def silu(x: np.ndarray) -> np.ndarray:
    """x * sigmoid(x), with sigmoid written through tanh so that no exp overflows."""
    return x * 0.5 * (1.0 + np.tanh(0.5 * x))


def rotary_inverse_frequencies(config: LlamaConfig) -> np.ndarray:
    """(Dh/2,) rotation speeds ``theta ** (-2i / Dh)``, with llama3 scaling when configured."""
    dim = config.head_dim
    inv_freq = 1.0 / config.rope_theta ** (np.arange(0, dim, 2, dtype=np.float64) / dim)
    scaling = config.rope_scaling
    if scaling is None:
        return inv_freq
    # Llama 3.1: wavelengths longer than the original context / low_freq_factor are stretched by
    # `factor`, shorter than original / high_freq_factor kept, and the band between blended.
    wavelength = 2 * np.pi / inv_freq
    original = scaling.original_max_position_embeddings
    blend = (original / wavelength - scaling.low_freq_factor) / (
        scaling.high_freq_factor - scaling.low_freq_factor
    )
    blended = (1 - blend) * inv_freq / scaling.factor + blend * inv_freq
    stretched = np.where(
        wavelength > original / scaling.low_freq_factor, inv_freq / scaling.factor, inv_freq
    )
    medium = (wavelength >= original / scaling.high_freq_factor) & (
        wavelength <= original / scaling.low_freq_factor
    )
    return np.where(medium, blended, stretched)


def rotary_cos_sin(positions: np.ndarray, inv_freq: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """positions (...) int -> cos, sin (..., Dh): each angle repeated for both halves of a head."""
    angles = positions[..., None] * inv_freq  # (..., Dh/2)
    angles = np.concatenate([angles, angles], axis=-1)
    return np.cos(angles), np.sin(angles)


def apply_rotary(x: np.ndarray, cos: np.ndarray, sin: np.ndarray) -> np.ndarray:
    """Rotate pairs (x[i], x[i + Dh/2]) by the position's angle. x (..., Dh), cos/sin
    broadcastable."""
    half = x.shape[-1] // 2
    rotated_half = np.concatenate([-x[..., half:], x[..., :half]], axis=-1)
    return x * cos + rotated_half * sin


def attend(
    query: np.ndarray,
    cached: tuple[np.ndarray, np.ndarray],
    new: tuple[np.ndarray, np.ndarray],
    cached_allowed: np.ndarray,
    new_allowed: np.ndarray,
) -> np.ndarray:
    """Grouped-query attention of n new queries over S cached and n new keys.

    query (Hq, n, Dh); cached = (keys, values) each (Hkv, S, Dh); new = (keys, values) each
    (Hkv, n, Dh); cached_allowed (n, S) and new_allowed (n, n) bool. Returns (n, Hq * Dh).
    """
    heads, n, dim = query.shape
    kv_heads = cached[0].shape[0]
    grouped = query.reshape(kv_heads, (heads // kv_heads) * n, dim)  # (Hkv, G*n, Dh)
    scores = np.concatenate(
        [grouped @ cached[0].transpose(0, 2, 1), grouped @ new[0].transpose(0, 2, 1)], axis=-1
    )
    scores = scores.reshape(heads, n, -1) / np.sqrt(dim)  # (Hq, n, S+n)
    allowed = np.concatenate([cached_allowed, new_allowed], axis=-1)  # (n, S+n)
    scores = np.where(allowed, scores, -np.inf)
    weights = np.exp(scores - scores.max(axis=-1, keepdims=True))
    weights = (weights / weights.sum(axis=-1, keepdims=True)).reshape(
        kv_heads, -1, scores.shape[-1]
    )
    split = cached[0].shape[1]
    out = weights[..., :split] @ cached[1] + weights[..., split:] @ new[1]  # (Hkv, G*n, Dh)
    return out.reshape(heads, n, dim).transpose(1, 0, 2).reshape(n, heads * dim)


def _linear(x: np.ndarray, weight: np.ndarray, bias: np.ndarray | None) -> np.ndarray:
    """x (..., in) @ weight (out, in).T + bias (out,) -> (..., out), as one matrix product."""
    y = (x.reshape(-1, x.shape[-1]) @ weight.T).reshape(x.shape[:-1] + (weight.shape[0],))
    return y if bias is None else y + bias


@attrs.frozen(kw_only=True)
class _Layer:
    input_norm: np.ndarray
    q_proj: np.ndarray
    k_proj: np.ndarray
    v_proj: np.ndarray
    o_proj: np.ndarray
    q_bias: np.ndarray | None
    k_bias: np.ndarray | None
    v_bias: np.ndarray | None
    o_bias: np.ndarray | None
    post_norm: np.ndarray
    gate_proj: np.ndarray
    up_proj: np.ndarray
    down_proj: np.ndarray
    gate_bias: np.ndarray | None
    up_bias: np.ndarray | None
    down_bias: np.ndarray | None


class ReferenceTarget(SlotTarget):
    """A Llama-family target in float64 NumPy that satisfies ``specdec.protocols.TargetModel``.

    ``tensors`` maps Hugging Face weight names (``model.layers.0.self_attn.q_proj.weight`` ...)
    to arrays; ``lm_head.weight`` may be absent when ``config.tie_word_embeddings``.
    Attributes: ``embed_tokens`` and ``lm_head`` (V, H) float64 (one array when tied),
    ``eos_token_ids``, ``tokenizer`` (a ``tokenizers.Tokenizer`` or None), ``name``.
    """

    def __init__(
        self,
        *,
        config: LlamaConfig,
        tensors: Mapping[str, Any],
        tokenizer: Any = None,
        name: str = "reference",
        slots: int = 1,
        capacity: int | None = None,
    ):
        self.config = config
        self.tokenizer = tokenizer
        self.name = name
        self.vocab_size = config.vocab_size
        self.hidden_size = config.hidden_size
        self.num_layers = config.num_hidden_layers
        self.eos_token_ids = tuple(config.eos_token_ids)
        self._tensors = {key: np.asarray(value, dtype=np.float64) for key, value in tensors.items()}

        vocab, hidden, inner = config.vocab_size, config.hidden_size, config.intermediate_size
        q_out = config.num_attention_heads * config.head_dim
        kv_out = config.num_key_value_heads * config.head_dim
        self.embed_tokens = self._weight("model.embed_tokens.weight", (vocab, hidden))
        if config.tie_word_embeddings:
            self.lm_head = self.embed_tokens
        else:
            self.lm_head = self._weight(
                "lm_head.weight", (vocab, hidden), hint="or set tie_word_embeddings"
            )
        self.final_norm = self._weight("model.norm.weight", (hidden,))
        self.layers = []
        for i in range(config.num_hidden_layers):
            attn, mlp = f"model.layers.{i}.self_attn.", f"model.layers.{i}.mlp."
            qkv_bias, o_bias, mlp_bias = (
                config.attention_bias,
                config.attention_out_bias,
                config.mlp_bias,
            )
            self.layers.append(
                _Layer(
                    input_norm=self._weight(f"model.layers.{i}.input_layernorm.weight", (hidden,)),
                    q_proj=self._weight(attn + "q_proj.weight", (q_out, hidden)),
                    k_proj=self._weight(attn + "k_proj.weight", (kv_out, hidden)),
                    v_proj=self._weight(attn + "v_proj.weight", (kv_out, hidden)),
                    o_proj=self._weight(attn + "o_proj.weight", (hidden, q_out)),
                    q_bias=self._weight(attn + "q_proj.bias", (q_out,)) if qkv_bias else None,
                    k_bias=self._weight(attn + "k_proj.bias", (kv_out,)) if qkv_bias else None,
                    v_bias=self._weight(attn + "v_proj.bias", (kv_out,)) if qkv_bias else None,
                    o_bias=self._weight(attn + "o_proj.bias", (hidden,)) if o_bias else None,
                    post_norm=self._weight(
                        f"model.layers.{i}.post_attention_layernorm.weight", (hidden,)
                    ),
                    gate_proj=self._weight(mlp + "gate_proj.weight", (inner, hidden)),
                    up_proj=self._weight(mlp + "up_proj.weight", (inner, hidden)),
                    down_proj=self._weight(mlp + "down_proj.weight", (hidden, inner)),
                    gate_bias=self._weight(mlp + "gate_proj.bias", (inner,)) if mlp_bias else None,
                    up_bias=self._weight(mlp + "up_proj.bias", (inner,)) if mlp_bias else None,
                    down_bias=self._weight(mlp + "down_proj.bias", (hidden,)) if mlp_bias else None,
                )
            )
        self.inv_freq = rotary_inverse_frequencies(config)
        slots, capacity = check_slot_arguments(
            slots,
            capacity,
            config.max_position_embeddings,
            position_bytes=config.num_hidden_layers
            * 2
            * config.num_key_value_heads
            * config.head_dim
            * 8,  # float64
        )
        self.cache = TreeKVCache(
            num_layers=config.num_hidden_layers,
            num_kv_heads=config.num_key_value_heads,
            head_dim=config.head_dim,
            num_slots=slots,
            capacity=capacity,
        )

    @property
    def _prefill_chunk(self) -> int:
        return PREFILL_CHUNK

    def _weight(self, key: str, shape: tuple[int, ...], hint: str = "") -> np.ndarray:
        if key not in self._tensors:
            raise InvalidInputError(
                f"the {self.config.model_type} checkpoint lacks tensor {key!r} of shape {shape}"
                + (f" ({hint})" if hint else "")
            )
        value = self._tensors[key]
        if value.shape != shape:
            raise InvalidInputError(
                f"tensor {key!r} has shape {value.shape}, the config implies {shape}"
            )
        return value

    def _compute_fingerprint(self) -> str:
        """Hex sha256 over the sorted tensor names, their shapes and their float32 bytes."""
        digest = hashlib.sha256()
        for key in sorted(self._tensors):
            value = self._tensors[key]
            digest.update(key.encode())
            digest.update(repr(tuple(value.shape)).encode())
            digest.update(np.ascontiguousarray(value, dtype="<f4").tobytes())
        return digest.hexdigest()

    def _forward(
        self,
        rows: Sequence[int],
        tokens: np.ndarray,
        depth: np.ndarray,
        mask: np.ndarray,
        layers: Sequence[int] = (),
    ):
        """Run new tokens of some slots on top of their committed caches.

        tokens (R, n) int64 for cache slots ``rows``; depth (R, n): token i sits at position
        ``cache_length + depth[r, i]``; mask (R, n, n) bool: token i sees new token j.
        Returns hidden (R, n, H) after the final norm, the new keys and values
        (R, layers, 2, Hkv, n, Dh), rotary already applied to the keys, and {layer: (R, n, H)}
        the outputs of decoder ``layers``.
        """
        cfg = self.config
        num_rows, n = tokens.shape
        heads, kv_heads, dim = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        lengths = self.cache.lengths[list(rows)]
        positions = lengths[:, None] + depth  # (R, n)
        cos, sin = rotary_cos_sin(positions[:, None], self.inv_freq)  # (R, 1, n, Dh)
        # (n, S) each
        cached_allowed = [np.ones((n, lengths[r]), dtype=bool) for r in range(num_rows)]
        if cfg.sliding_window is not None:
            # (R, n): a query sees keys at positions > this
            earliest = positions - cfg.sliding_window
            mask = mask & (positions[:, None, :] > earliest[:, :, None])
            cached_allowed = [
                allowed & (np.arange(lengths[r])[None, :] > earliest[r][:, None])
                for r, allowed in enumerate(cached_allowed)
            ]

        wanted, outputs = self._check_layers(layers), {}
        x = self.embed_tokens[tokens]  # (R, n, H)
        entries = np.empty((num_rows, cfg.num_hidden_layers, 2, kv_heads, n, dim))
        for index, layer in enumerate(self.layers):
            # Attention block: pre-norm, projections, rotary, tree-masked attention, residual.
            h = rms_norm(x, layer.input_norm, cfg.rms_norm_eps)
            q = (
                _linear(h, layer.q_proj, layer.q_bias)
                .reshape(num_rows, n, heads, dim)
                .transpose(0, 2, 1, 3)
            )
            k = (
                _linear(h, layer.k_proj, layer.k_bias)
                .reshape(num_rows, n, kv_heads, dim)
                .transpose(0, 2, 1, 3)
            )
            v = (
                _linear(h, layer.v_proj, layer.v_bias)
                .reshape(num_rows, n, kv_heads, dim)
                .transpose(0, 2, 1, 3)
            )
            q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)  # (R, Hq|Hkv, n, Dh)
            entries[:, index, 0], entries[:, index, 1] = k, v
            out = np.empty((num_rows, n, heads * dim))
            for r, row in enumerate(rows):
                cached = (self.cache.keys(index, row), self.cache.values(index, row))
                out[r] = attend(q[r], cached, (k[r], v[r]), cached_allowed[r], mask[r])
            x = x + _linear(out, layer.o_proj, layer.o_bias)
            # MLP block: pre-norm, SwiGLU, residual.
            h = rms_norm(x, layer.post_norm, cfg.rms_norm_eps)
            gate = silu(_linear(h, layer.gate_proj, layer.gate_bias))
            x = x + _linear(
                gate * _linear(h, layer.up_proj, layer.up_bias), layer.down_proj, layer.down_bias
            )
            if index in wanted:
                outputs[index] = x
        return rms_norm(x, self.final_norm, cfg.rms_norm_eps), entries, outputs

    def _check_tokens(self, tokens: np.ndarray, what: str) -> None:
        if tokens.size and (tokens.min() < 0 or tokens.max() >= self.vocab_size):
            raise InvalidInputError(
                f"{what} holds token ids outside [0, {self.vocab_size}): "
                f"{tokens.min()}..{tokens.max()}"
            )

    def release(self, slot: int) -> None:
        """Free ``slot`` for another request."""
        self.cache.release(slot)

    def forward_tree(
        self, tree: DraftTree | None, slots, *, context=(), layers: Sequence[int] = ()
    ) -> TargetOutput:
        """Prompt chunks and tree rows in one forward (docs/design.md section 2).

        ``context``: (slot, tokens) prompt chunks; a chunk for a free slot starts its request
        there (position 0), one for an admitted slot continues at the slot's length; its keys
        and values are committed by this forward, and its PromptOutput is ``context[i]`` of the
        result. ``tree`` (None when there are only chunks): logits (B, N, V) and hidden (B, N,
        H) of every node; node i of row b sits at position ``length[slots[b]] + depth[b, i]``
        and attends to the slot's cache and to nodes j with ``ancestor_mask[b, i, j]``; the
        nodes' keys and values are staged for ``commit``.

        Each chunk and each tree row runs alone over its real tokens (padding nodes get zeros),
        so a row's numbers are exactly those it gets in any other forward: the reference is
        batch-independent by construction, which the per-request determinism tests rely on."""
        self._check_layers(layers)
        slots, chunks, _ = check_forward(
            tree,
            slots,
            context,
            self.cache.admitted,
            self.cache.lengths,
            self.capacity,
            self.vocab_size,
        )
        prompts, appends = [], []
        # computed first, committed at the end: a failed forward commits nothing
        for (
            slot,
            tokens,
        ) in chunks:
            causal = np.tril(np.ones((tokens.size, tokens.size), dtype=bool))
            hidden, entries, outputs = self._forward(
                [slot], tokens[None], np.arange(tokens.size)[None], causal[None], layers
            )
            prompts.append(
                PromptOutput(
                    logits=hidden[0, -1] @ self.lm_head.T,
                    hidden=hidden[0],
                    layers={i: v[0] for i, v in outputs.items()},
                )
            )
            appends.append((slot, entries[0]))
        output = self._forward_rows(tree, slots, layers) if tree is not None else None
        for slot, entries in appends:
            if not self.cache.admitted[slot]:
                self.cache.admit(slot)
            self.cache.append(slot, entries)
        if output is None:
            self.cache.discard()
            return TargetOutput(logits=None, hidden=None, context=prompts)
        return attrs.evolve(output, context=prompts)

    def _forward_rows(
        self, tree: DraftTree, slots: np.ndarray, layers: Sequence[int]
    ) -> TargetOutput:
        """The tree part of forward_tree: each row alone; stages the nodes' keys and values."""
        tokens = np.asarray(tree.tokens, dtype=np.int64)
        depth = np.asarray(tree.depth, dtype=np.int64)
        mask = np.asarray(tree.ancestor_mask, dtype=bool)
        self._check_tokens(tokens, "tree.tokens")
        if np.any(depth < 0) or not np.all(np.diagonal(mask, axis1=1, axis2=2)):
            raise InvalidInputError(
                "tree.depth must be >= 0 and tree.ancestor_mask[b, i, i] True for every node"
            )
        cfg, (batch, size) = self.config, tokens.shape
        real = np.clip(np.asarray(tree.num_nodes, dtype=np.int64), 1, size)
        hidden, logits = (
            np.zeros((batch, size, self.hidden_size)),
            np.zeros((batch, size, self.vocab_size)),
        )
        entries = np.zeros(
            (batch, cfg.num_hidden_layers, 2, cfg.num_key_value_heads, size, cfg.head_dim)
        )
        outputs = {int(i): np.zeros_like(hidden) for i in layers}
        for b, (slot, n) in enumerate(zip(slots.tolist(), real)):
            row_hidden, row_entries, row_outputs = self._forward(
                [slot], tokens[b : b + 1, :n], depth[b : b + 1, :n], mask[b : b + 1, :n, :n], layers
            )
            hidden[b, :n], entries[b, ..., :n, :] = row_hidden[0], row_entries[0]
            logits[b, :n] = row_hidden[0] @ self.lm_head.T
            for i, value in row_outputs.items():
                outputs[i][b, :n] = value[0]
        self.cache.stage(tree, slots, entries)
        return TargetOutput(logits=logits, hidden=hidden, layers=outputs)

    def commit(self, tree: DraftTree, verdict: Verdict) -> None:
        """Append the keys and values of ``verdict.path[b, :num_accepted[b] + 1]`` (root first)
        to each row's slot and drop the rest of the tree."""
        self.cache.commit(tree, verdict)


def load_target(
    path: str | os.PathLike, *, name: str | None = None, slots: int = 1, capacity: int | None = None
):
    """Load a local Hugging Face-format Llama-family folder as a float64 ``ReferenceTarget`` with
    ``slots`` request slots of ``capacity`` positions (None: the model's context length)."""
    folder = check_folder(path)
    config = LlamaConfig.from_folder(folder)
    check_weights_header(folder, config)  # before reading any tensor
    return ReferenceTarget(
        config=config,
        tensors=load_tensors(folder),
        tokenizer=load_tokenizer(folder),
        name=name or folder.resolve().name,
        slots=slots,
        capacity=capacity,
    )
