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


import numpy as np
import torch
import torch.nn.functional as F

from specdec.capabilities import DrafterCaps
from specdec.types import Draft, DraftContext
from specdec_eagle.torch import DraftAttention, DraftMLP, DraftNorm, DraftSlot, SlotDrafter
from specdec_eagle.torch import TreeSearch, draft_products
from specdec_eagle3.config import Eagle3Config, check_weights, draft_to_target
from specdec_eagle3.reference import (
    check_embedding,
    check_layers_given,
    check_layers_resolved,
    check_propose_context,
    tree_options,
)
from specdec_torch.ops import compute_dtype, placed

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

    def load_weights(self, weights: dict) -> None:
        """Set the float weights from name -> array (``d2t`` is checked and ignored here)."""
        check_weights(self.config, weights)
        self.load_state_dict(
            {
                ("head_embedding.weight" if name == OWN_EMBEDDING else name): placed(
                    array, self.fc.weight
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
        embedded, g = x[..., : cfg.hidden_size], x[..., cfg.hidden_size :]
        normed_g = layer.hidden_norm(g)
        y = torch.cat([embedded, normed_g], dim=-1)  # (B, m, 2H)
        attended, k, v = layer.self_attn.attend(y, positions, past_keys, past_values, mask)
        h = (normed_g if cfg.norm_before_residual else g) + attended
        out = h + layer.mlp(layer.post_attention_layernorm(h))
        return out, k, v

    def logits(self, out: torch.Tensor) -> torch.Tensor:
        """Draft-vocabulary logits lm_head(norm(out)): (..., H) -> (..., N)."""
        return self.lm_head(self.norm(out))


class TorchEagle3Drafter(SlotDrafter):
    """EAGLE-3 as a stateful ``specdec.protocols.Drafter`` on torch (same options as the
    reference's ``Eagle3Drafter``). Draft caches live per slot in the target's dtype and device.
    int8: as ``TorchEagleDrafter``'s (the fc, the layer's products and the head)."""

    NAME = "EAGLE-3"

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
        self.ids = placed(draft_to_target(weights["d2t"]), embed_tokens, index=True)
        self.top_k, self.depth, self.total_tokens = tree_options(config, top_k, depth, total_tokens)
        self.caps = DrafterCaps(
            stateful=True,
            tree_builder=("prefix_tree", {}),
            hidden_layers=config.hidden_layers,
            max_tree_size=self.total_tokens + 1,
        )
        self.slots: dict[int, DraftSlot] = {}

    def step_features(self, result) -> torch.Tensor:
        """The fused features g of the config's three target layers: (P, H) of a prompt,
        (B, A, H) of a step."""
        check_layers_given(self.config, result.layers)
        layers = result.layers
        return self.net.features(
            [
                torch.as_tensor(layers[i], device=self.device).to(self.dtype)
                for i in self.config.hidden_layers
            ]
        )

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
        states, tree_context = self.context(context.slots)
        pending = torch.stack([s.pending for s in states])  # (B, H)
        beams = TreeSearch(self, tree_context).run(roots, pending)
        return Draft(root_tokens=roots, beams=beams, sampled=False)
