"""EAGLE on torch: the draft layer as a ``torch.nn.Module``, per-slot draft KV caches, and the
dynamic tree with every level's frontier in one batched forward.

The torch twin of ``specdec_eagle.reference`` (read that first: the draft model, the request
lifecycle and the tree are explained there). ``EagleNet`` holds the drafter's weights under
the checkpoint's names (training, ``specdec_eagle.train``, uses the same module), borrows the
target's embedding and LM head, and runs the layer on (B, m) new entries over given past keys
with a boolean mask. Tree search keeps the tree's entries (the root entry, then each level's
frontier, then extension nodes) in one (B, Hkv, t, Dh) block with an ancestor mask (B, t, t):
a new node attends to its request's cache, to its parent's ancestors and to itself. Rankings
use ``top_k_lowest_index`` (ties to the lower index, as the reference's stable sorts); the
beams are assembled on the host from the tree's (B, C)-sized arrays, as the reference does.
Shapes: B rows, S drafted vocabulary (V without a shortlist), k = top_k, C candidates.
"""

from __future__ import annotations

import math

import attrs
import numpy as np
import torch
import torch.nn.functional as F

from specdec.capabilities import DrafterCaps
from specdec.types import Accepted, Draft, DraftContext, PromptOutput
from specdec_eagle.config import EagleConfig, check_weights
from specdec_eagle.reference import (
    check_propose_context,
    check_target_arrays,
    inverse_frequencies,
    missing_slot,
)
from specdec_eagle.torch_search import TreeContext, TreeSearch
from specdec_eagle.tree import tree_options
from specdec_torch.ops import compute_dtype, draft_weight, placed

__all__ = [
    "DraftAttention",
    "DraftMLP",
    "DraftNorm",
    "DraftSlot",
    "EagleNet",
    "SlotDrafter",
    "TorchEagleDrafter",
    "TreeContext",
    "TreeSearch",
    "draft_products",
    "rotate",
]


class DraftNorm(torch.nn.Module):
    def __init__(self, size: int, eps: float):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        z = x.to(compute_dtype(x.dtype))
        return (z * torch.rsqrt(z.pow(2).mean(-1, keepdim=True) + self.eps)).to(
            x.dtype
        ) * self.weight


class DraftAttention(torch.nn.Module):
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
        self.q_proj = torch.nn.Linear(inputs, q_out, bias=False)
        self.k_proj = torch.nn.Linear(inputs, kv_out, bias=False)
        self.v_proj = torch.nn.Linear(inputs, kv_out, bias=False)
        self.o_proj = torch.nn.Linear(q_out, hidden, bias=False)
        self.heads, self.kv_heads, self.head_dim = (
            config.num_heads,
            config.num_kv_heads,
            config.head_dim,
        )
        self.register_buffer(
            "inv_freq", torch.from_numpy(inverse_frequencies(config)), persistent=False
        )

    def attend(self, y, positions, past_keys, past_values, mask):
        """Attention over m new entries per row: y (B, m, inputs), positions (B, m), past keys
        and values (B, Hkv, S, Dh) or None, mask (B, m, S + m) bool (what each entry attends to)
        -> o_proj(attention) (B, m, H) and the new keys and values (B, Hkv, m, Dh), rotary
        applied."""
        batch, m, _ = y.shape
        heads, dim = self.heads, self.head_dim
        q = self.q_proj(y).view(batch, m, heads, dim).transpose(1, 2)
        k = self.k_proj(y).view(batch, m, self.kv_heads, dim).transpose(1, 2)
        v = self.v_proj(y).view(batch, m, self.kv_heads, dim).transpose(1, 2)
        inv_freq = self.inv_freq.to(compute_dtype(y.dtype))
        q, k = rotate(q, positions, inv_freq), rotate(k, positions, inv_freq)
        keys = k if past_keys is None else torch.cat([past_keys, k], dim=2)
        values = v if past_values is None else torch.cat([past_values, v], dim=2)
        group = heads // self.kv_heads
        keys, values = keys.repeat_interleave(group, dim=1), values.repeat_interleave(group, dim=1)
        scores = (q @ keys.transpose(-1, -2)) / math.sqrt(dim)  # (B, Hq, m, S + m)
        scores = scores.masked_fill(~mask[:, None], float("-inf"))
        weights = torch.softmax(scores.to(compute_dtype(y.dtype)), dim=-1).to(y.dtype)
        context = (weights @ values).transpose(1, 2).reshape(batch, m, heads * dim)
        return self.o_proj(context), k, v


class DraftMLP(torch.nn.Module):
    def __init__(self, config):
        super().__init__()
        self.gate_proj = torch.nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.up_proj = torch.nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.down_proj = torch.nn.Linear(config.intermediate_size, config.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class _Layer(torch.nn.Module):
    def __init__(self, config: EagleConfig):
        super().__init__()
        self.self_attn = DraftAttention(config)
        self.post_attention_layernorm = DraftNorm(config.hidden_size, config.rms_norm_eps)
        self.mlp = DraftMLP(config)


class _Product(torch.nn.Module):
    """A ``torch.nn.Linear`` of a drafter at inference, computed by ``ops.draft_weight`` (its
    weight in int8 where that was asked for or measured faster); ``weight`` stays the Linear's."""

    def __init__(self, linear: torch.nn.Linear, int8: bool | None):
        super().__init__()
        self.weight, self.bias = linear.weight, linear.bias
        bias = None if linear.bias is None else linear.bias.detach()
        self.product = draft_weight(linear.weight.detach(), bias, int8=int8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.product(x)


def draft_products(module: torch.nn.Module, *, int8: bool | None) -> None:
    """Put every ``torch.nn.Linear`` inside ``module`` (an inference copy, its weights loaded)
    behind ``ops.draft_weight``: ``int8`` True rounds the weights to int8 per row, None measures
    (half-precision weights on a CPU), False keeps them (``specdec_torch.int8``)."""
    for name, child in list(module.named_children()):
        if isinstance(child, torch.nn.Linear):
            setattr(module, name, _Product(child, int8))
        else:
            draft_products(child, int8=int8)


def rotate(x: torch.Tensor, positions: torch.Tensor, inv_freq: torch.Tensor) -> torch.Tensor:
    """Rotary embedding ("rotate_half"): x (B, heads, m, Dh), positions (B, m) ->
    (B, heads, m, Dh)."""
    angles = positions[:, None, :, None].to(inv_freq.dtype) * inv_freq  # (B, 1, m, Dh/2)
    angles = torch.cat([angles, angles], dim=-1)
    cos, sin = torch.cos(angles).to(x.dtype), torch.sin(angles).to(x.dtype)
    half = x.shape[-1] // 2
    return x * cos + torch.cat([-x[..., half:], x[..., :half]], dim=-1) * sin


class EagleNet(torch.nn.Module):
    """The EAGLE draft model; ``state_dict()`` holds exactly the checkpoint's layer weights
    (``fc.*``, ``layers.0.*``; the shortlist is kept apart). embed_tokens, lm_head (V, H): the
    target's, kept as plain attributes (not parameters, not saved)."""

    def __init__(self, config: EagleConfig, *, embed_tokens: torch.Tensor, lm_head: torch.Tensor):
        super().__init__()
        self.config = config
        self.embed_tokens, self.lm_head = embed_tokens.detach(), lm_head.detach()
        self.fc = torch.nn.Linear(2 * config.hidden_size, config.hidden_size, bias=config.fc_bias)
        self.layers = torch.nn.ModuleList([_Layer(config)])

    def load_weights(self, weights: dict) -> None:
        """Set the layer weights from name -> array (the shortlist, if any, is ignored here)."""
        layer_weights = {
            name: array for name, array in weights.items() if name != "vocab_shortlist"
        }
        check_weights(attrs.evolve(self.config, shortlist_size=None), layer_weights)
        self.load_state_dict(
            {name: placed(array, self.fc.weight) for name, array in layer_weights.items()}
        )

    def weights(self) -> dict[str, np.ndarray]:
        """Name -> float64 array of the layer weights."""
        return {
            name: tensor.detach().double().cpu().numpy()
            for name, tensor in self.state_dict().items()
        }

    def fuse(self, tokens: torch.Tensor, features: torch.Tensor) -> torch.Tensor:
        """fc([embed(tokens) ; features]): tokens (...), features (..., H) -> (..., H)."""
        embedding = F.embedding(tokens, self.embed_tokens).to(self.fc.weight.dtype)
        return self.fc(torch.cat([embedding, features.to(self.fc.weight.dtype)], dim=-1))

    def layer(
        self,
        x: torch.Tensor,
        positions: torch.Tensor,
        past_keys: torch.Tensor | None,
        past_values: torch.Tensor | None,
        mask: torch.Tensor,
    ):
        """The draft layer on m new entries per row. x (B, m, H); positions (B, m); past keys and
        values (B, Hkv, S, Dh) or None; mask (B, m, S + m) bool (what each entry attends to).
        -> out (B, m, H), keys and values (B, Hkv, m, Dh) of the new entries (rotary applied)."""
        layer = self.layers[0]
        attended, k, v = layer.self_attn.attend(x, positions, past_keys, past_values, mask)
        h = x + attended
        out = h + layer.mlp(layer.post_attention_layernorm(h))
        return out, k, v


@attrs.define
class DraftSlot:
    """One request's draft KV cache on torch: keys, values (Hkv, capacity, Dh) whose first
    ``length`` positions hold its entries (grown by doubling), the entries observed but not yet
    run through the layer (``waiting``: (tokens (n,), features (n, H)) pairs), the pending
    feature (H,) the next root joins, and the tokens the cache stands for with its waiting
    entries (as ``reference.SlotCache.tokens``)."""

    keys: torch.Tensor
    values: torch.Tensor
    pending: torch.Tensor
    tokens: list
    length: int = 0
    waiting: list = attrs.field(factory=list)


class SlotDrafter:
    """EAGLE's and EAGLE-3's request lifecycle on torch (``reference.SlotDrafter``'s twin): one
    ``DraftSlot`` per slot. A subclass sets ``NAME``, ``config``, ``dtype``, ``device``, ``net``
    (with ``fuse(tokens, features)`` and ``layer``) and ``slots`` (an empty dict), and gives
    ``step_features(result)``: the per-position features of a ``PromptOutput`` (P, H) or an
    ``Accepted`` (B, A, H) in the drafter's dtype."""

    NAME = "EAGLE"
    PREFILL_CHUNK = 256  # prompt entries per layer forward in ``begin``
    # Entries observed are run through the layer when the slot next drafts, or once this many
    # wait: a step that does not draft (auto's plain steps) runs no layer forward for its row
    CATCH_UP = 32

    @torch.inference_mode()
    def begin(self, slot: int, prompt, output: PromptOutput) -> None:
        """Run the layer over the prompt's entries; keep its last feature pending."""
        host = np.asarray(prompt, dtype=np.int64)
        prompt = torch.as_tensor(host, device=self.device)
        features = self.step_features(output)  # (P, H)
        cfg = self.config
        shape = (cfg.num_kv_heads, max(64, len(prompt) + 64), cfg.head_dim)
        empty = torch.zeros(shape, dtype=self.dtype, device=self.device)
        state = DraftSlot(
            keys=empty, values=empty.clone(), pending=features[-1].clone(), tokens=[int(host[0])]
        )
        for start in range(0, len(prompt) - 1, self.PREFILL_CHUNK):
            stop = min(start + self.PREFILL_CHUNK, len(prompt) - 1)
            self._append(state, prompt[start + 1 : stop + 1], features[start:stop])
        state.tokens += host[1:].tolist()
        self.slots[int(slot)] = state

    @torch.inference_mode()
    def observe(self, accepted: Accepted) -> None:
        """Queue each row's root entry and accepted entries (the layer runs over them in one
        forward when the slot next drafts, ``context``, or when ``CATCH_UP`` wait); the last
        accepted feature is pending. The cache then holds what running each step's entries at
        once would give: the layer is causal, so entries run together or apart are the same
        entries (a one-token forward here cost what a step's drafting does, 3 ms on a 2-core
        CPU: 5% of a SmolLM2-135M step that did not draft)."""
        features = self.step_features(accepted)  # (B, A, H)
        host = np.asarray(accepted.tokens, dtype=np.int64)
        tokens = torch.as_tensor(host, device=self.device)
        for b, slot in enumerate(np.asarray(accepted.slots).tolist()):
            count = int(accepted.num_accepted[b]) + 1  # the root and the accepted drafted tokens
            state = self._slot(slot)
            entry_features = torch.cat([state.pending[None], features[b, : count - 1]])
            state.waiting.append((tokens[b, :count], entry_features))
            state.tokens += host[b, :count].tolist()
            state.pending = features[b, count - 1].clone()
            if sum(len(t) for t, _ in state.waiting) >= self.CATCH_UP:
                self._catch_up(state)

    def _catch_up(self, state: DraftSlot) -> None:
        """Run the slot's waiting entries through the layer, in one forward."""
        if state.waiting:
            tokens, features = zip(*state.waiting)
            self._append(state, torch.cat(tokens), torch.cat(features))
            state.waiting.clear()

    def end(self, slot: int, reason: str) -> None:
        """The request in ``slot`` ended (any ``reason``): drop its state."""
        self.slots.pop(int(slot), None)

    def slot_tokens(self, slot: int) -> tuple:
        """The tokens the draft cache of ``slot`` stands for (``specdec.protocols.SlotView``)."""
        return tuple(self._slot(slot).tokens)

    def _slot(self, slot: int) -> DraftSlot:
        if slot not in self.slots:
            raise missing_slot(slot, self.NAME)
        return self.slots[slot]

    def _append(self, state: DraftSlot, tokens: torch.Tensor, features: torch.Tensor) -> None:
        """Run entries (n,) tokens with (n, H) features after the cache, causally; store them."""
        length, n = state.length, int(tokens.shape[0])
        if length + n > state.keys.shape[1]:
            grown = max(length + n, 2 * state.keys.shape[1])
            for name in ("keys", "values"):
                old = getattr(state, name)
                setattr(state, name, old.new_zeros((old.shape[0], grown, old.shape[2])))
                getattr(state, name)[:, :length] = old[:, :length]
        positions = torch.arange(length, length + n, device=self.device)[None]
        mask = torch.ones(n, length + n, dtype=torch.bool, device=self.device)
        mask = mask.tril(diagonal=length)[None]
        x = self.net.fuse(tokens[None], features[None])
        past = state.keys[None, :, :length], state.values[None, :, :length]
        _, k, v = self.net.layer(x, positions, *past, mask)
        state.keys[:, length : length + n] = k[0]
        state.values[:, length : length + n] = v[0]
        state.length = length + n

    @torch.inference_mode()
    def context(self, slots) -> tuple[list[DraftSlot], TreeContext]:
        """The states of ``slots`` (a step's rows) and their caches side by side, padded to the
        longest: keys, values (B, Hkv, span, Dh), a mask (B, span) of the real positions, and
        the lengths (B,)."""
        states = [self._slot(int(s)) for s in np.asarray(slots).tolist()]
        for state in states:
            self._catch_up(state)
        lengths = torch.tensor([s.length for s in states], device=self.device)
        span = int(lengths.max())

        def side_by_side(name: str) -> torch.Tensor:
            arrays = [getattr(s, name) for s in states]
            if len(arrays) == 1:
                return arrays[0][None, :, :span]
            return torch.stack(
                [
                    a[:, :span] if a.shape[1] >= span else F.pad(a, (0, 0, 0, span - a.shape[1]))
                    for a in arrays
                ]
            )

        mask = torch.arange(span, device=self.device)[None] < lengths[:, None]  # (B, span)
        return states, TreeContext(side_by_side("keys"), side_by_side("values"), mask, lengths)


class TorchEagleDrafter(SlotDrafter):
    """EAGLE as a stateful ``specdec.protocols.Drafter`` on torch (same options as the reference's
    ``EagleDrafter``). Draft caches live per slot in the target's dtype and device, grown by
    doubling; rows of a step run together. int8: the layer's products and the head rows with
    their weights in int8 per row (True), as they are (False), or int8 where measured faster
    (None: bfloat16 and float16 weights on a CPU; ``draft_products``)."""

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
        embed_tokens: torch.Tensor,
        lm_head: torch.Tensor,
        top_k: int | None = None,
        depth: int | None = None,
        total_tokens: int | None = None,
        int8: bool | None = None,
    ):
        check_weights(config, weights)
        check_target_arrays(config, embed_tokens, lm_head)
        self.config = config
        self.dtype, self.device = embed_tokens.dtype, embed_tokens.device
        self.net = EagleNet(config, embed_tokens=embed_tokens, lm_head=lm_head).to(
            dtype=self.dtype, device=self.device
        )
        self.net.load_weights(weights)
        self.net.eval().requires_grad_(False)
        draft_products(self.net, int8=int8)
        self.shortlist = None
        if config.shortlist_size is not None:
            self.shortlist = placed(weights["vocab_shortlist"], embed_tokens, index=True)
        # (S, H) -> x @ rows.T
        self.head = draft_weight(
            lm_head if self.shortlist is None else lm_head[self.shortlist], int8=int8
        )
        self.top_k, self.depth, self.total_tokens = tree_options(config, top_k, depth, total_tokens)
        self.slots: dict[int, DraftSlot] = {}

    def step_features(self, result) -> torch.Tensor:
        """The target's last hidden states: (P, H) of a prompt, (B, A, H) of a step."""
        return torch.as_tensor(result.hidden, device=self.device).to(self.dtype)

    # ----------------------------------------------------------------------------- drafting

    def log_probs(self, out: torch.Tensor) -> torch.Tensor:
        """Draft log-probs over the drafted vocabulary: out (..., H) -> (..., S)."""
        return torch.log_softmax(self.head(out).to(compute_dtype(out.dtype)), dim=-1)

    def to_vocab(self, local: torch.Tensor) -> torch.Tensor:
        return local if self.shortlist is None else self.shortlist[local]

    @torch.inference_mode()
    def propose(self, context: DraftContext) -> Draft:
        """Beams (B, W = total_tokens, L = depth + 1), one dynamic tree per row."""
        roots = torch.as_tensor(context.root_tokens, device=self.device).to(torch.int64)
        hidden = torch.as_tensor(context.hidden, device=self.device).to(self.dtype)
        check_propose_context(self.config, context, roots, hidden.shape)
        _, tree_context = self.context(context.slots)
        beams = TreeSearch(self, tree_context).run(roots, hidden)
        return Draft(root_tokens=roots, beams=beams, sampled=False)
