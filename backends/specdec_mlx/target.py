"""``MlxTarget``: an mlx-lm Llama-family model run as a ``specdec`` target with tree attention.

The mlx-lm module supplies the weights and the pieces that carry them (embedding, per-layer
q/k/v/o projections with their biases, RMSNorms, the MLP, the final norm, the LM head or the
tied embedding's ``as_linear``); quantized mlx-lm layers work unchanged. Attention, rotary
embeddings and the KV cache are this module's own, because a tree needs per-node positions
(``length[b] + depth[b, i]``) and a per-row ancestor mask, which mlx-lm's cache and rope
modules (one offset per row) do not express. The math is that of ``specdec.reference.model``
(Hugging Face "rotate_half" rotary with the reference's frequencies, grouped-query attention).

Everything is lazy; the decode loop's ``to_numpy`` evaluates a step at once (see ``MlxBackend``).
Shapes: B batch, n new tokens, N tree nodes, S attended slots, H hidden, Dh head size, V vocab.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Sequence

import attrs

import mlx.core as mx
from mlx.utils import tree_flatten
import numpy as np

from specdec.errors import InvalidInputError
from specdec.models.llama import LlamaConfig
from specdec.reference.model import rotary_inverse_frequencies
from specdec.reference import packing
from specdec.slots import SlotTarget, check_commit, check_forward, check_slot_arguments, check_slots
from specdec.types import DraftTree, TargetOutput, Verdict
from specdec_mlx.arrays import to_mx
from specdec_mlx.invariance import check_row_invariance
from specdec_mlx.exact import SplitOrder, attend_split, min_rows, split_order, rows_invariant
from specdec_mlx.kvcache import MlxKVCache
from specdec_mlx.packing import pack, unpack
from specdec_mlx.weights import fingerprint_of

PREFILL_CHUNK = 128  # prompt tokens per forward during prefill (bounds the attention matrix)


def rotate(x: mx.array, positions: mx.array, periods: mx.array) -> mx.array:
    """Rotary embedding ("rotate_half" pairs (x[i], x[i + Dh/2])) at arbitrary per-token positions.

    x (B, n, heads * Dh) as projected; positions (B, n) int; periods (Dh/2,) float32, the
    reciprocal rotation speeds. ``mx.fast.rope`` takes one offset per batch entry, so every
    token becomes its own batch entry of length 1. Returns (B, heads, n, Dh).
    """
    batch, n, _ = x.shape
    head_dim = 2 * periods.shape[0]
    tokens = x.reshape(batch * n, -1, 1, head_dim)  # (B*n, heads, 1, Dh)
    rotated = mx.fast.rope(
        tokens,
        head_dim,
        traditional=False,
        base=None,
        scale=1.0,
        offset=positions.reshape(-1),
        freqs=periods,
    )
    return rotated.reshape(batch, n, -1, head_dim).transpose(0, 2, 1, 3)


def _dequantized(module) -> mx.array:
    """The (out, in) weight of an mlx Linear or Embedding, dequantized when it is quantized."""
    if hasattr(module, "scales"):
        return mx.dequantize(
            module.weight,
            module.scales,
            module.get("biases"),
            module.group_size,
            module.bits,
            mode=getattr(module, "mode", "affine"),
        )
    return module.weight


class MlxTarget(SlotTarget):
    """Satisfies ``specdec.protocols.TargetModel`` for an mlx-lm llama / qwen2 / mistral model.

    model: the mlx-lm ``Model`` (``.model.embed_tokens``, ``.model.layers``, ``.model.norm``,
    optional ``.lm_head``); config: its ``LlamaConfig``. Attributes ``vocab_size``,
    ``hidden_size``, ``eos_token_ids``, ``tokenizer`` (a ``tokenizers.Tokenizer`` or None),
    ``name``, ``dtype``; ``embed_tokens`` and ``lm_head`` (V, H) MLX arrays; ``fingerprint``
    (as the reference computes it, from ``fingerprint_source``: the model folder, else the
    module's own parameters). ``exact``: compute rows in the forms of ``specdec_mlx.exact`` so that
    a row's results do not depend on what shares its forward (set by ``specdec.tuning.exactness``
    from ``check_row_invariance``).
    """

    def __init__(
        self,
        model,
        *,
        config: LlamaConfig,
        dtype,
        tokenizer: Any = None,
        name: str = "mlx-model",
        fingerprint_source: Any = None,
        slots: int = 1,
        capacity: int | None = None,
        exact: bool = False,
    ):
        self.model = model
        self.exact = bool(exact)
        self.config = config
        self.dtype = dtype
        self.tokenizer = tokenizer
        self.name = name
        self.vocab_size = config.vocab_size
        self.hidden_size = config.hidden_size
        self.num_layers = config.num_hidden_layers
        self.eos_token_ids = tuple(config.eos_token_ids)
        self._fingerprint_source = fingerprint_source
        inner = model.model
        self._embedding, self._layers, self._final_norm = (
            inner.embed_tokens,
            inner.layers,
            inner.norm,
        )
        self._lm_head_module = getattr(model, "lm_head", None)
        self._min_rows: dict = {}  # a product's rows in exact mode (_product)
        self.embed_tokens = _dequantized(self._embedding)  # (V, H)
        self.lm_head = (
            self.embed_tokens
            if self._lm_head_module is None
            else _dequantized(self._lm_head_module)
        )
        # (Dh/2,)
        self._periods = mx.array((1.0 / rotary_inverse_frequencies(config)).astype(np.float32))
        self._scale = 1.0 / math.sqrt(config.head_dim)
        slots, capacity = check_slot_arguments(
            slots,
            capacity,
            config.max_position_embeddings,
            position_bytes=config.num_hidden_layers
            * 2
            * config.num_key_value_heads
            * config.head_dim
            * dtype.size,
        )
        self.cache = MlxKVCache(
            num_layers=config.num_hidden_layers,
            num_kv_heads=config.num_key_value_heads,
            head_dim=config.head_dim,
            dtype=dtype,
            num_slots=slots,
            capacity=capacity,
        )
        self._staged: tuple[np.ndarray, int] | None = (
            None  # (slots, nodes) of the last forward_tree
        )
        self._pending = False  # the cache changed since the last evaluation point
        self._pending_extra: list[mx.array] = []

    # ------------------------------------------------------------------ attributes

    @property
    def _prefill_chunk(self) -> int:
        return PREFILL_CHUNK

    @staticmethod
    def _concatenate(arrays: list[mx.array]) -> mx.array:
        return mx.concatenate(arrays, axis=0)

    def _compute_fingerprint(self) -> str:
        return fingerprint_of(self._fingerprint_source if self._fingerprint_source else self.model)

    def take_pending(self) -> list[mx.array]:
        """Arrays changed since the last evaluation point (the backend evaluates them with the
        step)."""
        if not self._pending:
            return []
        self._pending = False
        extra, self._pending_extra = self._pending_extra, []
        return self.cache.arrays() + extra

    def check_row_invariance(self):
        """Whether this machine's MLX kernels keep exact mode's promise for this target's shapes
        and dtype (``specdec_mlx.invariance``; measured once, then cached)."""
        return check_row_invariance(self)

    # ------------------------------------------------------------------ the forward

    def _product(self, fn, x: mx.array) -> mx.array:
        """``fn(x)`` for a product (or a block of them: a module, or ``_head``) over rows x (T, H);
        in exact mode over the rows ``specdec_mlx.exact.min_rows`` asks for at least."""
        return self.exact_product(fn, x) if self.exact else fn(x)

    def exact_product(self, fn, x: mx.array) -> mx.array:
        """``_product``'s exact form, whatever ``exact`` says (the self-test checks it)."""
        key = "head" if fn == self._head else id(fn)
        rows = self._min_rows.get(key)
        if rows is None:
            module = (self._lm_head_module or self._embedding) if key == "head" else fn
            rows = self._min_rows[key] = min_rows(w for _, w in tree_flatten(module.parameters()))
        return rows_invariant(fn, x, rows)

    def _head(self, hidden: mx.array) -> mx.array:
        if self._lm_head_module is None:
            return self._embedding.as_linear(hidden)
        return self._lm_head_module(hidden)

    def _logits(self, hidden: mx.array) -> mx.array:
        rows = hidden.reshape(-1, hidden.shape[-1])
        return self._product(self._head, rows).reshape(*hidden.shape[:-1], -1)

    def _run(self, tokens: mx.array, segments: list["_Segment"], layers: set[int]):
        """The decoder over the packed new tokens (T,) (``specdec.reference.packing``): norms,
        projections and MLP run on the whole stream, attention per segment. Returns hidden (T,
        H) after the final norm and {layer: (T, H)} the outputs of decoder ``layers``."""
        cfg = self.config
        x = self._embedding(tokens)  # (T, H)
        outputs = {}
        for index, layer in enumerate(self._layers):
            # Attention block: pre-norm, projections, rotary, masked attention per segment,
            # residual.
            attention, product = layer.self_attn, self._product
            h = layer.input_layernorm(x)
            q, k, v = (
                product(attention.q_proj, h),
                product(attention.k_proj, h),
                product(attention.v_proj, h),
            )
            heads = []
            for s in segments:
                rows, width = s.shape
                part = lambda a: a[s.start : s.end].reshape(rows, width, -1)  # noqa: E731
                qs = rotate(part(q), s.positions, self._periods)  # (rows, Hq, width, Dh)
                ks = rotate(part(k), s.positions, self._periods)  # (rows, Hkv, width, Dh)
                vs = (
                    part(v)
                    .reshape(rows, width, cfg.num_key_value_heads, cfg.head_dim)
                    .transpose(0, 2, 1, 3)
                )
                keys, values = s.store(index, ks, vs)
                if s.plan is not None:  # exact mode
                    heads.append(
                        attend_split(qs, keys, values, s.plan, self._scale).reshape(
                            rows * width, -1
                        )
                    )
                    continue
                out = mx.fast.scaled_dot_product_attention(
                    qs, keys, values, scale=self._scale, mask=s.mask
                )
                heads.append(out.transpose(0, 2, 1, 3).reshape(rows * width, -1))
            x = x + product(
                attention.o_proj, heads[0] if len(heads) == 1 else mx.concatenate(heads, axis=0)
            )
            # MLP block: pre-norm, SwiGLU, residual.
            x = x + product(layer.mlp, layer.post_attention_layernorm(x))
            if index in layers:
                outputs[index] = x
        return self._final_norm(x), outputs

    def _chunk_segment(self, place, slot: int, start: int) -> "_Segment":
        """A prompt chunk of ``place.width`` tokens written at ``start ..`` of ``slot``: causal."""
        n = place.width
        positions = mx.arange(start, start + n)[None]  # (1, n)
        keys = mx.arange(start + n)[None, None, :]  # (1, 1, S)
        allowed = self._window(keys <= positions[..., None], positions, keys)  # causal (1, n, S)
        slots = mx.array([slot])

        def store(layer, k, v):
            self.cache.write(layer, slots, positions, k, v, (slot, slot + 1, start))
            return self.cache.view(layer, slots, start + n, (slot, slot + 1))

        return _Segment(
            place.offset,
            place.end,
            (1, n),
            positions,
            allowed[:, None],
            store,
            split_order(allowed[:, None]) if self.exact else None,
        )

    def _tree_segment(self, place, tree: DraftTree, slots: np.ndarray) -> "_Segment":
        """The tree rows: node i of row b at position ``length + depth``, written at
        ``length + i``."""
        batch, size = len(slots), tree.size
        depth = to_mx(tree.depth).astype(mx.int32)
        ancestor_mask = to_mx(tree.ancestor_mask).astype(mx.bool_)
        host_lengths = self.cache.lengths[slots]
        longest = int(host_lengths.max())
        span = longest + size
        consecutive = bool(np.all(np.diff(slots) == 1))
        rows = (int(slots[0]), int(slots[-1]) + 1) if consecutive else None
        block = rows + (longest,) if consecutive and int(host_lengths.min()) == longest else None
        lengths = mx.array(host_lengths.astype(np.int32))
        slot_index = mx.array(slots.astype(np.int32))
        positions = lengths[:, None] + depth  # (B, N)
        stored = lengths[:, None] + mx.arange(size)[None, :]  # (B, N): where the nodes are written
        # (B, 1, S): node index of a position
        relative = mx.arange(span)[None, None, :] - lengths[:, None, None]
        node = mx.clip(relative, 0, size - 1)
        in_tree = (relative >= 0) & (relative < size)
        sees_node = mx.take_along_axis(
            ancestor_mask, mx.broadcast_to(node, (batch, size, span)), axis=2
        )
        allowed = (relative < 0) | (in_tree & sees_node)  # (B, N, S)
        if self.config.sliding_window is not None:
            key_positions = mx.where(
                relative < 0,
                mx.arange(span)[None, None, :],
                lengths[:, None, None] + mx.take_along_axis(depth[:, None, :], node, axis=2),
            )
            allowed = self._window(allowed, positions, key_positions)

        def store(layer, k, v):
            self.cache.write(layer, slot_index, stored, k, v, block)
            return self.cache.view(layer, slot_index, span, rows)

        return _Segment(
            place.offset,
            place.end,
            (batch, size),
            positions,
            allowed[:, None],
            store,
            split_order(allowed[:, None]) if self.exact else None,
        )

    def _window(
        self, allowed: mx.array, query_positions: mx.array, key_positions: mx.array
    ) -> mx.array:
        """Apply the sliding window: a query sees keys at positions > its position - window."""
        if self.config.sliding_window is None:
            return allowed
        return allowed & (key_positions > query_positions[..., None] - self.config.sliding_window)

    # ------------------------------------------------------------------ the protocol

    def release(self, slot: int) -> None:
        """Free ``slot`` for another request."""
        slot = int(check_slots(self.cache.admitted, [slot], admitted_state=True, what="release")[0])
        self.cache.admitted[slot] = False
        self.cache.lengths[slot] = 0
        if self._staged is not None and slot in self._staged[0]:
            self._staged = None

    def forward_tree(
        self, tree: DraftTree | None, slots, *, context=(), layers: Sequence[int] = ()
    ) -> TargetOutput:
        """Prompt chunks and tree rows in one packed forward (``specdec.reference.packing``).

        ``context``: (slot, tokens) chunks; a free slot is claimed and its chunk starts at
        position 0, an admitted one continues at its length; their entries are committed here,
        ``context[i]`` of the result is chunk i's PromptOutput. ``tree`` (None for chunks only):
        logits (B, N, V) and hidden (B, N, H) of every node; node i of row b sits at position
        ``length[s] + depth[b, i]`` of slot s = ``slots[b]``, attends to the slot's committed
        entries and to the nodes j with ``ancestor_mask[b, i, j]``, and its keys and values are
        written at ``length[s] + i`` (kept by commit)."""
        cache = self.cache
        wanted = self._check_layers(layers)
        slots, chunks, starts = check_forward(
            tree, slots, context, cache.admitted, cache.lengths, self.capacity, self.vocab_size
        )
        places = packing.layout(
            [t.size for _, t in chunks], None if tree is None else (len(slots), tree.size)
        )
        segments = [
            self._chunk_segment(place, slot, start)
            for place, (slot, _), start in zip(places, chunks, starts)
        ]
        tokens = [mx.array(t.astype(np.int32)) for _, t in chunks]
        if tree is not None:
            segments.append(self._tree_segment(places[-1], tree, slots))
            tokens.append(to_mx(tree.tokens).astype(mx.int32))
        # lazy: nothing fails later
        hidden, outputs = self._run(pack(tokens, tree is not None), segments, wanted)
        output = packing.unpack_output(
            hidden,
            outputs,
            places,
            len(chunks),
            tree is not None,
            unpack=unpack,
            logits=self._logits,
        )
        for (slot, t), start in zip(chunks, starts):
            cache.admitted[slot] = True
            cache.lengths[slot] = start + t.size
        if chunks:
            self._pending = True
        self._staged = None if tree is None else (slots, tree.size)
        return output

    def commit(self, tree: DraftTree, verdict: Verdict) -> None:
        """Keep the entries of ``verdict.path[b, :num_accepted[b] + 1]`` (root first) behind each
        row's committed ones in its slot; the rest of the tree is dropped
        (its positions become scratch)."""
        check_commit(None if self._staged is None else self._staged[1], tree)
        slots = self._staged[0]
        path = to_mx(verdict.path).astype(mx.int32)
        if path.ndim != 2 or path.shape[0] != len(slots) or path.shape[1] > tree.size:
            raise InvalidInputError(
                f"verdict.path must be (B, D+1) with B = {len(slots)} and "
                f"D+1 <= {tree.size}, got {tuple(path.shape)}"
            )
        num_accepted = np.array(to_mx(verdict.num_accepted)).astype(np.int64).reshape(-1)
        self.cache.commit_path(slots, path, num_accepted)
        self._staged = None
        self._pending = True
        # The loop reads these right after commit: evaluate them with the cache, in one go.
        self._pending_extra = [
            a
            for a in (
                verdict.path,
                verdict.num_accepted,
                verdict.bonus_tokens,
                tree.tokens,
                tree.num_nodes,
            )
            if isinstance(a, mx.array)
        ]


@attrs.frozen
class _Segment:
    """Packed tokens ``start .. end - 1`` (``shape`` (rows, width)) that attend together:
    positions (rows, width), mask (rows, 1, width, S), ``store(layer, keys, values)`` writes
    their entries and returns the (rows, Hkv, S, Dh) keys and values to attend to; ``plan`` the
    mask's split of keys in exact mode (``specdec_mlx.exact``)."""

    start: int
    end: int
    shape: tuple[int, int]
    positions: mx.array
    mask: mx.array
    store: Callable
    plan: SplitOrder | None = None
