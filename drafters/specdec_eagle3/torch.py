"""EAGLE-3 on torch: the draft layer as a ``torch.nn.Module`` and per-slot draft caches; the
dynamic tree is EAGLE's batched search (``specdec_eagle.torch.TreeSearch``) over this net.

The torch twin of ``specdec_eagle3.reference`` (read that first). ``Eagle3Net`` holds the weights
under the checkpoint's names (training, ``specdec_eagle3.train``, uses the same module) and borrows
the target's embedding, unless the head carries its own (``own_embedding``). For the tree search
its ``fuse(tokens, g)`` gives the (B, m, 2H) pair [input_layernorm(embed(tokens)) ; g] and
``layer`` runs the decoder layer on it, returning the pre-norm output that children read as their
feature; the drafter's ``log_probs`` and ``to_vocab`` give draft-vocabulary log-probs and map draft
ids to target ids.
"""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F

from specdec.capabilities import DrafterCaps
from specdec.errors import InvalidInputError
from specdec.types import Accepted, Draft, DraftContext, PromptOutput
from specdec_eagle.torch import TreeSearch, draft_products, rotate
from specdec_eagle.torch import DraftAttention, DraftMLP, DraftNorm
from specdec_eagle3.config import Eagle3Config, check_weights, draft_to_target
from specdec_eagle3.reference import (
    check_embedding,
    check_layers_resolved,
    check_propose_context,
    missing_slot,
    tree_options,
)
from specdec_torch.ops import compute_dtype

__all__ = ["Eagle3Net", "TorchEagle3Drafter"]


class _MidLayer(torch.nn.Module):
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


class _Table(torch.nn.Module):
    def __init__(self, rows: int, size: int):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.zeros(rows, size))


OWN_EMBEDDING = "embed_tokens.weight"  # the checkpoint's name of ``head_embedding.weight``


class Eagle3Net(torch.nn.Module):
    """The EAGLE-3 draft model; ``weights()`` gives the checkpoint's float weights (``fc``,
    ``midlayer.*``, ``norm``, ``lm_head``, and ``input_norm`` / ``embed_tokens`` where the config
    has them; the drafter keeps ``d2t`` apart as target ids). embed_tokens (V, H): the target's,
    a plain attribute (not a parameter, not saved); a head with its own embedding holds it as
    ``head_embedding`` (saved as ``embed_tokens.weight``) and embeds tokens with it."""

    def __init__(self, config: Eagle3Config, *, embed_tokens: torch.Tensor):
        super().__init__()
        self.config = config
        self.embed_tokens = embed_tokens.detach()
        if config.own_embedding:
            self.head_embedding = _Table(config.vocab_size, config.hidden_size)
        if config.norm_before_fc:
            self.input_norm = DraftNorm(3 * config.hidden_size, config.rms_norm_eps)
        self.fc = torch.nn.Linear(3 * config.hidden_size, config.hidden_size, bias=False)
        self.midlayer = _MidLayer(config)
        self.norm = DraftNorm(config.hidden_size, config.rms_norm_eps)
        self.lm_head = torch.nn.Linear(config.hidden_size, config.draft_vocab_size, bias=False)
        dim = config.head_dim
        self.register_buffer(
            "inv_freq",
            1.0 / config.rope_theta ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim),
            persistent=False,
        )

    def load_weights(self, weights: dict) -> None:
        """Set the float weights from name -> array (``d2t`` is checked and ignored here)."""
        check_weights(self.config, weights)
        dtype = self.fc.weight.dtype
        self.load_state_dict(
            {
                ("head_embedding.weight" if name == OWN_EMBEDDING else name): torch.as_tensor(
                    np.asarray(array), dtype=dtype
                )
                for name, array in weights.items()
                if name != "d2t"
            }
        )

    def weights(self) -> dict[str, np.ndarray]:
        """Name -> float64 array of the float weights (no ``d2t``)."""
        return {
            (OWN_EMBEDDING if name == "head_embedding.weight" else name): tensor.detach()
            .double()
            .cpu()
            .numpy()
            for name, tensor in self.state_dict().items()
        }

    def features(self, layers: list[torch.Tensor]) -> torch.Tensor:
        """g = fc([low ; mid ; high]) (through ``input_norm`` first where the head has it): three
        (..., H) -> (..., H)."""
        fused = torch.cat([t.to(self.fc.weight.dtype) for t in layers], dim=-1)
        if self.config.norm_before_fc:
            fused = self.input_norm(fused)
        return self.fc(fused)

    def embedding_table(self) -> torch.Tensor:
        """The (V, H) table tokens are embedded with: the head's own, else the target's."""
        return self.head_embedding.weight if self.config.own_embedding else self.embed_tokens

    def fuse(self, tokens: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
        """[input_layernorm(embed(tokens)) ; g]: tokens (...), g (..., H) -> (..., 2H)."""
        embedding = F.embedding(tokens, self.embedding_table()).to(self.fc.weight.dtype)
        return torch.cat(
            [self.midlayer.input_layernorm(embedding), g.to(self.fc.weight.dtype)], dim=-1
        )

    def layer(
        self,
        x: torch.Tensor,
        positions: torch.Tensor,
        past_keys: torch.Tensor | None,
        past_values: torch.Tensor | None,
        mask: torch.Tensor,
    ):
        """The draft layer on m new entries per row. x (B, m, 2H) from ``fuse``; positions (B, m);
        past keys and values (B, Hkv, S, Dh) or None; mask (B, m, S + m) bool.
        -> out (B, m, H) before ``norm``, keys and values (B, Hkv, m, Dh) (rotary applied)."""
        cfg, layer = self.config, self.midlayer
        batch, m, _ = x.shape
        embedded, g = x[..., : cfg.hidden_size], x[..., cfg.hidden_size :]
        normed_g = layer.hidden_norm(g)
        y = torch.cat([embedded, normed_g], dim=-1)  # (B, m, 2H)
        attn = layer.self_attn
        q = attn.q_proj(y).view(batch, m, cfg.num_heads, cfg.head_dim).transpose(1, 2)
        k = attn.k_proj(y).view(batch, m, cfg.num_kv_heads, cfg.head_dim).transpose(1, 2)
        v = attn.v_proj(y).view(batch, m, cfg.num_kv_heads, cfg.head_dim).transpose(1, 2)
        inv_freq = self.inv_freq.to(compute_dtype(x.dtype))
        q, k = rotate(q, positions, inv_freq), rotate(k, positions, inv_freq)
        keys = k if past_keys is None else torch.cat([past_keys, k], dim=2)
        values = v if past_values is None else torch.cat([past_values, v], dim=2)
        group = cfg.num_heads // cfg.num_kv_heads
        keys, values = keys.repeat_interleave(group, dim=1), values.repeat_interleave(group, dim=1)
        scores = (q @ keys.transpose(-1, -2)) / math.sqrt(cfg.head_dim)  # (B, Hq, m, S + m)
        scores = scores.masked_fill(~mask[:, None], float("-inf"))
        weights = torch.softmax(scores.to(compute_dtype(x.dtype)), dim=-1).to(x.dtype)
        context = (weights @ values).transpose(1, 2).reshape(batch, m, cfg.num_heads * cfg.head_dim)
        h = (normed_g if cfg.norm_before_residual else g) + attn.o_proj(context)
        out = h + layer.mlp(layer.post_attention_layernorm(h))
        return out, k, v

    def logits(self, out: torch.Tensor) -> torch.Tensor:
        """Draft-vocabulary logits lm_head(norm(out)): (..., H) -> (..., N)."""
        return self.lm_head(self.norm(out))


class TorchEagle3Drafter:
    """EAGLE-3 as a stateful ``specdec.protocols.Drafter`` on torch (same options as the
    reference's ``Eagle3Drafter``). Draft caches live per slot in the target's dtype and device.
    int8: as ``TorchEagleDrafter``'s (the fc, the layer's products and the head)."""

    PREFILL_CHUNK = 256

    def __init__(
        self,
        config: Eagle3Config,
        weights: dict,
        *,
        embed_tokens: torch.Tensor,
        top_k: int | None = None,
        depth: int | None = None,
        total_tokens: int | None = None,
        int8: bool | None = None,
    ):
        check_weights(config, weights)
        check_embedding(config, embed_tokens)
        check_layers_resolved(config)
        self.config = config
        self.dtype, self.device = embed_tokens.dtype, embed_tokens.device
        self.net = Eagle3Net(config, embed_tokens=embed_tokens).to(
            dtype=self.dtype, device=self.device
        )
        self.net.load_weights(weights)
        self.net.eval().requires_grad_(False)
        draft_products(self.net, int8=int8)
        # (N,) target ids
        self.ids = torch.as_tensor(draft_to_target(weights["d2t"]), device=self.device)
        self.top_k, self.depth, self.total_tokens = tree_options(config, top_k, depth, total_tokens)
        self.caps = DrafterCaps(
            stateful=True,
            tree_builder=("prefix_tree", {}),
            hidden_layers=config.hidden_layers,
            max_tree_size=self.total_tokens + 1,
        )
        # slot -> {"keys", "values": (Hkv, T, Dh), "length", "pending" (H,)}
        self.slots: dict[int, dict] = {}

    def _features(self, layers) -> torch.Tensor:
        missing = [i for i in self.config.hidden_layers if i not in layers]
        if missing:
            raise InvalidInputError(
                f"EAGLE-3 needs the outputs of target layers {list(self.config.hidden_layers)}, "
                f"missing {missing}: the target must return the layers in DrafterCaps.hidden_layers"
            )
        return self.net.features(
            [
                torch.as_tensor(layers[i], device=self.device).to(self.dtype)
                for i in self.config.hidden_layers
            ]
        )

    def _append(self, slot: int, tokens: torch.Tensor, g: torch.Tensor) -> None:
        """Run entries (n,) tokens with (n, H) features after the slot's cache, causally; store
        them."""
        state = self.slots[slot]
        length, n = state["length"], int(tokens.shape[0])
        positions = torch.arange(length, length + n, device=self.device)[None]
        mask = torch.ones(n, length + n, dtype=torch.bool, device=self.device).tril(
            diagonal=length
        )[None]
        x = self.net.fuse(tokens[None], g[None])
        _, k, v = self.net.layer(x, positions, state["keys"][None], state["values"][None], mask)
        state["keys"], state["values"] = (
            torch.cat([state["keys"], k[0]], dim=1),
            torch.cat([state["values"], v[0]], dim=1),
        )
        state["length"] = length + n

    @torch.inference_mode()
    def begin(self, slot: int, prompt, output: PromptOutput) -> None:
        """Run the layer over the prompt's entries; keep its last fused feature pending."""
        prompt = torch.as_tensor(np.asarray(prompt), dtype=torch.int64, device=self.device)
        g = self._features(output.layers)  # (P, H)
        cfg = self.config
        empty = torch.zeros(cfg.num_kv_heads, 0, cfg.head_dim, dtype=self.dtype, device=self.device)
        self.slots[int(slot)] = {
            "keys": empty,
            "values": empty.clone(),
            "length": 0,
            "pending": g[-1].clone(),
        }
        for start in range(0, len(prompt) - 1, self.PREFILL_CHUNK):
            stop = min(start + self.PREFILL_CHUNK, len(prompt) - 1)
            self._append(int(slot), prompt[start + 1 : stop + 1], g[start:stop])

    @torch.inference_mode()
    def observe(self, accepted: Accepted) -> None:
        """Append each row's root entry and accepted entries; the last accepted feature is
        pending."""
        g = self._features(accepted.layers)  # (B, A, H)
        tokens = torch.as_tensor(np.asarray(accepted.tokens), dtype=torch.int64, device=self.device)
        for b, slot in enumerate(np.asarray(accepted.slots).tolist()):
            count = int(accepted.num_accepted[b]) + 1
            state = self._slot(slot)
            self._append(
                slot, tokens[b, :count], torch.cat([state["pending"][None], g[b, : count - 1]])
            )
            state["pending"] = g[b, count - 1].clone()

    def end(self, slot: int, reason: str) -> None:
        """The request in ``slot`` ended (any ``reason``): drop its state."""
        self.slots.pop(int(slot), None)

    def _slot(self, slot: int) -> dict:
        if slot not in self.slots:
            raise missing_slot(slot)
        return self.slots[slot]

    def log_probs(self, out: torch.Tensor) -> torch.Tensor:
        """Draft log-probs over the draft vocabulary: out (..., H) -> (..., N)."""
        return torch.log_softmax(self.net.logits(out).to(compute_dtype(out.dtype)), dim=-1)

    def to_vocab(self, local: torch.Tensor) -> torch.Tensor:
        return self.ids[local]

    @torch.inference_mode()
    def propose(self, context: DraftContext) -> Draft:
        """Beams (B, W = total_tokens, L = depth + 1), one dynamic tree per row."""
        roots = torch.as_tensor(context.root_tokens, device=self.device).to(torch.int64)
        check_propose_context(context, len(roots))
        states = [self._slot(int(s)) for s in np.asarray(context.slots).tolist()]
        lengths = torch.tensor([s["length"] for s in states], device=self.device)
        span = int(lengths.max())
        ctx_keys = torch.stack([F.pad(s["keys"], (0, 0, 0, span - s["length"])) for s in states])
        ctx_values = torch.stack(
            [F.pad(s["values"], (0, 0, 0, span - s["length"])) for s in states]
        )
        ctx_mask = torch.arange(span, device=self.device)[None] < lengths[:, None]  # (B, span)
        pending = torch.stack([s["pending"] for s in states])  # (B, H)
        beams = TreeSearch(self, ctx_keys, ctx_values, ctx_mask, lengths).run(roots, pending)
        return Draft(root_tokens=roots, beams=beams, sampled=False)
