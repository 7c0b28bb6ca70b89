"""``TorchTarget``: a ``transformers`` Llama-family causal LM (llama, qwen2, mistral) as a
``specdec.protocols.TargetModel``, with tree attention over its own KV cache.

The Hugging Face module supplies the weights (embeddings, q/k/v/o projections with their
biases, norms, MLP, final norm, LM head); the forward is ours: rotary embeddings at explicit
positions, ``scaled_dot_product_attention`` with a 4D boolean mask over a preallocated cache
(``specdec_torch.kvcache``), so no ``transformers`` cache class is involved. One code path for
cpu, cuda and mps; every entry point runs under ``torch.inference_mode``.

Shapes: B batch, N tree nodes, n new tokens, S key slots, V vocab, H hidden.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import numpy as np
import torch
import torch.nn.functional as F

import attrs

from specdec.errors import InvalidInputError
from specdec.reference import packing
from specdec.slots import SlotTarget, check_commit, check_forward, check_slot_arguments, check_slots
from specdec.types import DraftTree, TargetOutput, Verdict
from specdec_torch.device import device_memory
from specdec_torch.exact import (
    KernelChoice,
    SplitOrder,
    attend_kernel,
    attend_split,
    in_row_blocks,
    linear_rows,
    plan_kernel,
    split_order,
)
from specdec_torch.invariance import check_row_invariance
from specdec_torch.kernels import attention_kernel
from specdec_torch.kvcache import TorchKVCache
from specdec_torch.layers import apply_rotary, attend, inverse_frequencies, rms_norm, rotary_cos_sin
from specdec_torch.packing import pack as pack_stream, unpack as unpack_stream
from specdec_torch.forms import describe_forms, layer_product
from specdec_torch.products import head_product

__all__ = ["PREFILL_CHUNK", "TorchTarget", "pack_layer", "tree_attention_mask"]

PREFILL_CHUNK = 512  # prompt tokens per forward during prefill (bounds the attention matrix)
# Tree rows of ascending slots read their keys and values as one view of the slots between the
# first and the last when those are at most this many times as many as the rows (in-flight
# batching frees slots in any order); sparser rows gather a copy of their own slots' cache.
SPAN_SPARSITY = 2


def tree_attention_mask(
    lengths: torch.Tensor, ancestor_mask: torch.Tensor, size: int
) -> torch.Tensor:
    """Which key slots each tree node may attend to. lengths (B,), ancestor_mask (B, N, N) bool
    -> (B, N, S) bool with S = ``size``: slot j is allowed for node i of row b iff
    ``j < lengths[b]`` (committed) or ``j = lengths[b] + m`` with ``ancestor_mask[b, i, m]``."""
    batch, nodes, _ = ancestor_mask.shape
    slot = torch.arange(size, device=lengths.device)[None, :]  # (1, S)
    committed = slot < lengths[:, None]  # (B, S)
    relative = slot - lengths[:, None]  # (B, S): tree node stored at this slot
    in_tree = (relative >= 0) & (relative < nodes)
    index = relative.clamp(0, nodes - 1)[:, None, :].expand(batch, nodes, size)  # (B, N, S)
    tree_part = torch.gather(ancestor_mask, 2, index) & in_tree[:, None, :]
    return committed[:, None, :] | tree_part


def pack_layer(
    layer,
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor, torch.Tensor | None]:
    """(qkv weight, qkv bias, gate-up weight, gate-up bias) of a decoder layer, each in one buffer
    (a bias is None where the projections have none).

    The q, k, v projections (and the gate and up projections) become one matrix each, so a step
    runs 4 matmuls per layer instead of 7. The module's own parameters are re-pointed at slices
    of the packed buffers, so the weights are held once and the module computes as before; only
    modules specdec loaded itself are packed (a caller's model object is left as it is).
    """
    attention, mlp_ = layer.self_attn, layer.mlp
    qkv, qkv_bias = _pack([attention.q_proj, attention.k_proj, attention.v_proj])
    gate_up, gate_up_bias = _pack([mlp_.gate_proj, mlp_.up_proj])
    return qkv, qkv_bias, gate_up, gate_up_bias


def _pack(projections) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Concatenate the weights (and biases: zeros for a projection without one) of ``projections``
    along their outputs; each module's parameters become views of the packed buffers."""
    weight = torch.cat([p.weight.data for p in projections])
    bias = None
    if any(p.bias is not None for p in projections):
        bias = torch.cat(
            [
                p.bias.data if p.bias is not None else p.weight.new_zeros(p.weight.shape[0])
                for p in projections
            ]
        )
    start = 0
    for projection in projections:
        rows = projection.weight.shape[0]
        projection.weight.data = weight[start : start + rows]
        if projection.bias is not None:
            projection.bias.data = bias[start : start + rows]
        start += rows
    return weight, bias


def _tree_key_positions(lengths: torch.Tensor, depth: torch.Tensor, size: int) -> torch.Tensor:
    """Position of the entry in each key slot: committed slot j holds position j, tree slot
    ``lengths[b] + m`` holds node m at ``lengths[b] + depth[b, m]``. -> (B, S) int64."""
    slot = torch.arange(size, device=lengths.device)[None, :]  # (1, S)
    node = (slot - lengths[:, None]).clamp(0, depth.shape[1] - 1)  # (B, S)
    return torch.where(
        slot < lengths[:, None], slot, lengths[:, None] + torch.gather(depth, 1, node)
    )


class TorchTarget(SlotTarget):
    """A Llama-family ``transformers`` model with a tree-attention KV cache.

    model: the ``*ForCausalLM`` module (already in its dtype and on its device); config: its
    ``specdec.models.llama.LlamaConfig``; fingerprint_fn: computes the weights' fingerprint
    exactly as the reference does (called once, when a drafter checkpoint asks for it).
    Attributes: ``embed_tokens`` and ``lm_head`` (V, H) tensors (the same tensor when tied),
    ``vocab_size``, ``hidden_size``, ``num_layers``, ``num_slots``, ``capacity``, ``eos_token_ids``,
    ``tokenizer`` (``tokenizers.Tokenizer`` or None), ``name``, ``dtype``, ``device``,
    ``cache_lengths`` (num_slots,) on the host.

    ``exact``: compute every row in the row-invariant forms of ``specdec_torch.exact`` (products
    of one row as two, the canonical attention), so that a row's results do not depend on what
    shares its forward; ``check_row_invariance`` says whether this machine's kernels keep that
    promise (``specdec.tuning.exactness`` sets ``exact`` from it when the target is loaded).
    """

    def __init__(
        self,
        model: Any,
        *,
        config,
        fingerprint_fn: Callable[[], str],
        tokenizer: Any = None,
        name: str = "torch",
        eos_token_ids: Sequence[int] = (),
        pack: bool = False,
        slots: int = 1,
        capacity: int | None = None,
        exact: bool = False,
    ):
        self.model = model
        self._kernel = None
        self.row_block: int | None = None  # exact mode's largest product call (None: any)
        # row classes whose products run transposed outside exact mode (specdec_torch.forms)
        self.transposed_rows: frozenset[int] = frozenset()
        self.config = config
        self.tokenizer = tokenizer
        self.name = name
        self.eos_token_ids = tuple(int(t) for t in eos_token_ids)
        self._fingerprint_fn = fingerprint_fn
        decoder = model.model
        self.embed_tokens = decoder.embed_tokens.weight
        self.lm_head = model.lm_head.weight
        self.dtype = self.embed_tokens.dtype
        self.device = self.embed_tokens.device
        self.vocab_size = int(self.embed_tokens.shape[0])
        self.hidden_size = int(self.embed_tokens.shape[1])
        if (self.vocab_size, self.hidden_size) != (config.vocab_size, config.hidden_size):
            raise InvalidInputError(
                f"the model's embedding is {tuple(self.embed_tokens.shape)}, its config says "
                f"(vocab_size, hidden_size) = {(config.vocab_size, config.hidden_size)}"
            )
        self._layers = list(decoder.layers)
        self._packed = [pack_layer(layer) for layer in self._layers] if pack else None
        self._final_norm = decoder.norm
        self._qkv_sizes = [config.num_attention_heads * config.head_dim] + [
            config.num_key_value_heads * config.head_dim
        ] * 2
        self._inv_freq = inverse_frequencies(config, self.device)
        self.num_layers = config.num_hidden_layers
        memory, where = device_memory(self.device)
        slots, capacity = check_slot_arguments(
            slots,
            capacity,
            config.max_position_embeddings,
            position_bytes=config.num_hidden_layers
            * 2
            * config.num_key_value_heads
            * config.head_dim
            * self.embed_tokens.element_size(),
            memory=memory,
            where=where,
        )
        self.cache = TorchKVCache(
            num_layers=config.num_hidden_layers,
            num_kv_heads=config.num_key_value_heads,
            head_dim=config.head_dim,
            dtype=self.dtype,
            device=self.device,
            num_slots=slots,
            capacity=capacity,
        )
        self.exact = exact

    @property
    def exact(self) -> bool:
        """Whether forwards run in the row-invariant forms (``specdec_torch.exact``)."""
        return self._exact

    @exact.setter
    def exact(self, value: bool) -> None:
        self._exact = bool(value)
        if self._exact and self.device.type == "cpu" and self._kernel is None:
            self._kernel = attention_kernel()  # None: the split form of torch operations

    def check_row_invariance(self):
        """Whether this machine's kernels keep exact mode's promise for this target's shapes and
        dtype (``specdec_torch.invariance``; measured once, then cached); products then run in
        the blocks of rows it found invariant (``row_block``)."""
        check = check_row_invariance(self)
        self.row_block = check.row_block
        return check

    @property
    def exact_form(self) -> str | None:
        """How exact mode computes attention: "kernel" (compiled, CPU) or "split" (torch
        operations); None when exact mode is off."""
        return None if not self._exact else "kernel" if self._kernel is not None else "split"

    @property
    def product_forms(self) -> str:
        """How the layers' products run outside exact mode (``specdec_torch.forms``), in words:
        what a measured step cost depends on besides the dtype and exact mode."""
        return describe_forms(self.transposed_rows)

    @property
    def _prefill_chunk(self) -> int:
        return PREFILL_CHUNK

    _concatenate = staticmethod(torch.cat)

    def _compute_fingerprint(self) -> str:
        return self._fingerprint_fn()

    # ------------------------------------------------------------------------------------
    # The forward pass: packed segments (specdec.reference.packing), attention per segment

    def _product(
        self, x: torch.Tensor, projection: torch.nn.Module | torch.Tensor, bias=None
    ) -> torch.Tensor:
        """``x @ W.T + b`` of a projection module or a weight, one row as two in exact mode,
        else in the form measured fastest for its row count (``specdec_torch.forms``)."""
        if isinstance(projection, torch.nn.Module):
            projection, bias = projection.weight, projection.bias
        if not self.exact:
            return layer_product(x, projection, bias, self.transposed_rows)
        return linear_rows(x, projection, bias, self.row_block)

    def _layer(self, index: int, x: torch.Tensor, segments: list["_Segment"]) -> torch.Tensor:
        """One decoder layer on the packed new tokens x (T, H); each segment's keys and values
        are written at its rows and its queries attend through its own mask."""
        layer, cfg, product = self._layers[index], self.config, self._product
        attention, mlp_ = layer.self_attn, layer.mlp
        h = rms_norm(x, layer.input_layernorm.weight, cfg.rms_norm_eps)
        if self._packed is not None:  # one matmul for q, k and v
            qkv_weight, qkv_bias, gate_up, gate_up_bias = self._packed[index]
            q, k, v = product(h, qkv_weight, qkv_bias).split(self._qkv_sizes, dim=-1)
        else:
            q, k, v = (
                product(h, attention.q_proj),
                product(h, attention.k_proj),
                product(h, attention.v_proj),
            )
        heads = [
            self._attend_segment(
                index, s, q[s.start : s.end], k[s.start : s.end], v[s.start : s.end]
            )
            for s in segments
        ]
        x = x + product(heads[0] if len(heads) == 1 else torch.cat(heads), attention.o_proj)
        h = rms_norm(x, layer.post_attention_layernorm.weight, cfg.rms_norm_eps)
        if self._packed is not None:  # one matmul for the gate and up projections
            gate, up = product(h, gate_up, gate_up_bias).chunk(2, dim=-1)
        else:
            gate, up = product(h, mlp_.gate_proj), product(h, mlp_.up_proj)
        return x + product(F.silu(gate) * up, mlp_.down_proj)

    def _attend_segment(self, index: int, segment: "_Segment", q, k, v) -> torch.Tensor:
        """Attention of one segment's tokens (rows * width, .) -> (rows * width, Hq * Dh)."""
        cfg, (batch, n) = self.config, segment.shape
        q = q.view(batch, n, cfg.num_attention_heads, cfg.head_dim).transpose(1, 2)
        k = k.view(batch, n, cfg.num_key_value_heads, cfg.head_dim).transpose(1, 2)
        v = v.view(batch, n, cfg.num_key_value_heads, cfg.head_dim).transpose(1, 2)
        q, k = apply_rotary(q, segment.cos, segment.sin), apply_rotary(k, segment.cos, segment.sin)
        rows = segment.rows
        self.cache.write(index, rows.slots, rows.positions, k, v, rows.block)
        if isinstance(segment.plan, KernelChoice):  # the kernel reads the cache itself
            data = self.cache.data[index]
            return attend_kernel(self._kernel, q, data[0], data[1], segment.plan).reshape(
                batch * n, -1
            )
        keys, values = self.cache.view(index, rows.slots, segment.key_size, rows.span)
        # the span's other slots attend with zero queries; their rows are dropped
        if rows.within is not None:
            q = q.new_zeros((keys.shape[0],) + tuple(q.shape[1:])).index_copy_(0, rows.within, q)
            return self._attend(q, keys, values, segment)[rows.within].reshape(batch * n, -1)
        return self._attend(q, keys, values, segment).reshape(batch * n, -1)

    @staticmethod
    def _attend(q, keys, values, segment: "_Segment") -> torch.Tensor:
        if segment.plan is not None:  # exact mode, split form
            return attend_split(q, keys, values, segment.plan)
        return attend(q, keys, values, segment.mask)

    def _forward(
        self, tokens: torch.Tensor, segments: list["_Segment"], layers: set[int]
    ) -> tuple[torch.Tensor, dict[int, torch.Tensor]]:
        """Hidden states (T, H) after the final norm of the packed new tokens (T,), and {layer:
        (T, H)} the outputs of decoder ``layers``."""
        x = torch.nn.functional.embedding(tokens, self.embed_tokens)
        outputs = {}
        for index in range(len(self._layers)):
            x = self._layer(index, x, segments)
            if index in layers:
                outputs[index] = x
        return rms_norm(x, self._final_norm.weight, self.config.rms_norm_eps), outputs

    def _segment(
        self, place: "packing.Segment", positions: torch.Tensor, rows: "_Rows", mask: torch.Tensor
    ) -> "_Segment":
        """A segment with its rotary angles at ``positions`` (rows, width) and mask
        (rows, width, S)."""
        cos, sin = rotary_cos_sin(positions, self._inv_freq, self.dtype)
        mask = mask[:, None]
        plan = None
        if self.exact:
            plan = plan_kernel(mask, rows.slots) if self._kernel is not None else split_order(mask)
        return _Segment(
            start=place.offset,
            end=place.end,
            shape=(place.rows, place.width),
            cos=cos,
            sin=sin,
            rows=rows,
            mask=mask,
            key_size=int(mask.shape[-1]),
            plan=plan,
        )

    def _chunk_segment(self, place: "packing.Segment", slot: int, start: int) -> "_Segment":
        """A prompt chunk of ``place.width`` tokens written at ``start ..`` of ``slot``: causal."""
        positions = torch.arange(start, start + place.width, device=self.device)[None]  # (1, c)
        keys = torch.arange(start + place.width, device=self.device)[None]  # (1, S)
        # (1, c, S)
        mask = self._sliding(keys[:, None, :] <= positions[:, :, None], positions, keys)
        slots = torch.tensor([slot], device=self.device)
        rows = _Rows(
            slots=slots,
            positions=positions,
            block=(slot, slot + 1, start),
            span=(slot, slot + 1),
            within=None,
        )
        return self._segment(place, positions, rows, mask)

    def _tree_segment(
        self, place: "packing.Segment", tree: DraftTree, slots: np.ndarray
    ) -> "_Segment":
        """The tree rows: node i of row b stored at ``length + i``, at position
        ``length + depth``."""
        host_lengths = self.cache.lengths[slots]
        longest, nodes = int(host_lengths.max()), tree.size
        lengths = torch.from_numpy(host_lengths).to(self.device)
        consecutive = bool(np.all(np.diff(slots) == 1))
        width = int(slots[-1]) - int(slots[0]) + 1
        ascending_and_dense = bool(np.all(np.diff(slots) > 0)) and width <= SPAN_SPARSITY * len(
            slots
        )
        # the kernel reads slots itself
        ascending_and_dense = ascending_and_dense and self.exact_form != "kernel"
        span = (int(slots[0]), int(slots[-1]) + 1) if consecutive or ascending_and_dense else None
        within = (
            None
            if consecutive or span is None
            else torch.from_numpy(slots - slots[0]).to(self.device)
        )
        block = span + (longest,) if consecutive and int(host_lengths.min()) == longest else None
        # (B, N) where the nodes are stored
        stored = lengths[:, None] + torch.arange(nodes, device=self.device)
        depth = tree.depth.to(self.device)
        # (B, N, S)
        mask = tree_attention_mask(lengths, tree.ancestor_mask.to(self.device), longest + nodes)
        if self.config.sliding_window is not None:
            key_positions = _tree_key_positions(lengths, depth, longest + nodes)
            mask = self._sliding(mask, lengths[:, None] + depth, key_positions)
        # every slot of the span gets a mask row; those not in the tree see all keys
        if within is not None:
            mask = torch.ones(
                (width,) + tuple(mask.shape[1:]), dtype=torch.bool, device=self.device
            ).index_copy_(0, within, mask)
        rows = _Rows(
            slots=torch.from_numpy(slots).to(self.device),
            positions=stored,
            block=block,
            span=span,
            within=within,
        )
        return self._segment(place, lengths[:, None] + depth, rows, mask)

    def _sliding(
        self, mask: torch.Tensor, query_positions: torch.Tensor, key_positions: torch.Tensor
    ) -> torch.Tensor:
        """Apply the sliding window (mistral): a query sees keys at positions > its
        position - window."""
        window = self.config.sliding_window
        if window is None:
            return mask
        return mask & (key_positions[:, None, :] > query_positions[:, :, None] - window)

    def _logits(self, hidden: torch.Tensor) -> torch.Tensor:
        # the formulation measured fastest here (specdec_torch.products), one for every row count
        # when exact
        if not self.exact:
            return head_product(hidden, self.lm_head)
        product = lambda rows: head_product(rows, self.lm_head, exact=True)  # noqa: E731
        return in_row_blocks(product, hidden, self.row_block)

    # ------------------------------------------------------------------------------------
    # TargetModel

    def _check_slots(self, slots, *, admitted: bool, what: str) -> np.ndarray:
        return check_slots(self.cache.admitted, slots, admitted_state=admitted, what=what)

    admit = torch.inference_mode()(SlotTarget.admit)

    def release(self, slot: int) -> None:
        """Free ``slot`` for another request."""
        slot = int(self._check_slots([slot], admitted=True, what="release")[0])
        self.cache.admitted[slot] = False
        self.cache.set_length(slot, 0)
        if self.cache.staged_slots is not None and slot in self.cache.staged_slots:
            self.cache.staged_slots, self.cache.staged_size = None, 0

    @torch.inference_mode()
    def forward_tree(
        self, tree: DraftTree | None, slots, *, context=(), layers: Sequence[int] = ()
    ) -> TargetOutput:
        """Prompt chunks and tree rows in one packed forward (``specdec.reference.packing``).

        ``context``: (slot, tokens) chunks; a free slot is claimed and its chunk starts at
        position 0, an admitted one continues at its length; their keys and values are
        committed here, ``context[i]`` of the result is chunk i's PromptOutput. ``tree`` (None
        for chunks only): logits (B, N, V) and hidden (B, N, H) of every node; node i of row b
        sits at position ``length[s] + depth[b, i]`` of slot s = ``slots[b]``, is stored at
        ``length[s] + i`` and attends to the slot's committed entries and to its ancestors;
        nothing of the tree is committed until commit."""
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
        tokens = [torch.from_numpy(t).to(self.device) for _, t in chunks]
        if tree is not None:
            segments.append(self._tree_segment(places[-1], tree, slots))
            tokens.append(tree.tokens.to(self.device))
        claimed = [slot for slot, _ in chunks if not cache.admitted[slot]]
        cache.admitted[claimed] = True  # a chunk's entries are written (committed) by this forward
        try:
            hidden, outputs = self._forward(pack_stream(tokens, tree is not None), segments, wanted)
        except BaseException:
            cache.admitted[claimed] = False  # a failed forward claims nothing
            raise
        output = packing.unpack_output(
            hidden,
            outputs,
            places,
            len(chunks),
            tree is not None,
            unpack=unpack_stream,
            logits=self._logits,
        )
        for (slot, t), start in zip(chunks, starts):
            cache.set_length(slot, start + t.size)
        if tree is None:
            cache.staged_slots, cache.staged_size = None, 0
        else:
            cache.staged_slots, cache.staged_size = slots, tree.size
        return output

    @torch.inference_mode()
    def commit(self, tree: DraftTree, verdict: Verdict) -> None:
        """Append the keys and values of ``verdict.path[b, :num_accepted[b] + 1]`` (root first)
        to each row's slot and drop the rest of the tree: one gather and one indexed write."""
        cache = self.cache
        check_commit(None if cache.staged_slots is None else cache.staged_size, tree)
        batch = len(cache.staged_slots)
        path, num_accepted = verdict.path.to(self.device), verdict.num_accepted.to(self.device)
        if path.ndim != 2 or path.shape[0] != batch or tuple(num_accepted.shape) != (batch,):
            raise InvalidInputError(
                f"verdict.path must be (B, D+1) and num_accepted (B,) with B = {batch}, got "
                f"{tuple(path.shape)} and {tuple(num_accepted.shape)}"
            )
        cache.commit(path, num_accepted, num_accepted.cpu().numpy())


@attrs.frozen
class _Segment:
    """A segment of the packed tokens ``start .. end - 1`` (``shape`` (rows, width)) with what its
    attention needs: rotary cos, sin (rows, 1, width, Dh), where its keys go, mask (rows, 1,
    width, key_size) and, in exact mode, the mask's attention plan (``specdec_torch.exact``)."""

    start: int
    end: int
    shape: tuple[int, int]
    cos: torch.Tensor
    sin: torch.Tensor
    rows: "_Rows"
    mask: torch.Tensor
    key_size: int
    plan: KernelChoice | SplitOrder | None = None


@attrs.frozen
class _Rows:
    """Where a forward's new tokens go in the cache: ``slots`` (B,), ``positions`` (B, n); ``block``
    (first slot, end slot, start) when they are consecutive slots all writing
    start .. start + n - 1, ``span`` (first slot, end slot) when their cache is read as a view of
    the slots first .. end - 1: they are those slots, or (``within`` (B,), each row's index in the
    span) ascending slots among at most ``SPAN_SPARSITY`` times as many, read beside the others in
    place of a gathered copy."""

    slots: torch.Tensor
    positions: torch.Tensor
    block: tuple[int, int, int] | None
    span: tuple[int, int] | None
    within: torch.Tensor | None
