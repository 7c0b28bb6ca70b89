"""Medusa on torch: the K heads as one ``torch.nn.Module`` and the static tree builder.

The torch twin of ``specdec_medusa.reference`` and ``specdec_medusa.tree``. The heads' residual
blocks are stacked over K, so all heads run as batched matrix products; each head proposes its
top-T tokens, equal logits in ascending id order (``specdec_torch.ops.top_k_lowest_index``). The
static tree's shape (parents, depth, ancestor mask) is built once from the choices by the reference
and kept on the device; a step only gathers the tokens. Shapes: B batch, K heads, T top-T, V vocab,
H hidden.
"""

from __future__ import annotations

from typing import Iterable, Sequence

import numpy as np

from specdec.capabilities import DrafterCaps
import torch
import torch.nn.functional as F

from specdec.types import Draft, DraftContext, DraftTree
from specdec_medusa.config import MedusaConfig, tree_size
from specdec_medusa.reference import check_weights
from specdec_medusa.tree import StaticTreeBuilder
from specdec_torch.ops import placed, top_k_lowest_index

__all__ = ["MedusaHeads", "TorchMedusaDrafter", "TorchStaticTreeBuilder"]


class MedusaHeads(torch.nn.Module):
    """K Medusa heads. weights: name -> array as in ``specdec_medusa.config``; lm_head (V, H):
    the target's LM head (borrowed, needed for ``head="tied"``); dtype and device of the target."""

    def __init__(
        self,
        config: MedusaConfig,
        weights: dict,
        *,
        lm_head: torch.Tensor | None,
        dtype: torch.dtype,
        device: torch.device,
    ):
        super().__init__()
        check_weights(config, weights)
        if config.head == "tied" and lm_head is None:
            raise ValueError(
                "a Medusa drafter with head='tied' needs the target's lm_head (V, H); pass lm_head="
            )
        if lm_head is not None and tuple(lm_head.shape) != (config.vocab_size, config.hidden_size):
            raise ValueError(
                f"lm_head has shape {tuple(lm_head.shape)}, expected (vocab_size, hidden_size) = "
                f"{(config.vocab_size, config.hidden_size)}"
            )
        self.config = config
        self.lm_head = lm_head

        like = torch.empty(0, dtype=dtype, device=device)  # where and as the target's arrays are

        def stacked(name: str) -> torch.Tensor:  # one array per head -> (K, ...)
            arrays = [np.asarray(weights[name.format(k=k)]) for k in range(config.num_heads)]
            return placed(np.stack(arrays), like)

        layers = range(config.num_layers)
        # (layers, K, H, H)
        self.register_buffer(
            "block_weights",
            torch.stack([stacked(f"medusa_head.{{k}}.{j}.linear.weight") for j in layers])
            if config.num_layers
            else torch.zeros(0, dtype=dtype, device=device),
        )
        # (layers, K, H)
        self.register_buffer(
            "block_biases",
            torch.stack([stacked(f"medusa_head.{{k}}.{j}.linear.bias") for j in layers])
            if config.num_layers
            else torch.zeros(0, dtype=dtype, device=device),
        )
        if config.head == "full":
            # (K, V, H)
            self.register_buffer(
                "projections", stacked(f"medusa_head.{{k}}.{config.num_layers}.weight")
            )

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        """Logits of every head. hidden (B, H) -> (B, K, V)."""
        x = hidden[None].expand(self.config.num_heads, -1, -1)  # (K, B, H)
        for weight, bias in zip(self.block_weights, self.block_biases):
            # x + SiLU(W x + b)
            x = x + F.silu(torch.bmm(x, weight.transpose(1, 2)) + bias[:, None, :])
        if self.config.head == "full":
            logits = torch.bmm(x, self.projections.transpose(1, 2))  # (K, B, V)
        else:
            logits = F.linear(x, self.lm_head)
        return logits.transpose(0, 1)


class TorchMedusaDrafter:
    """Satisfies ``specdec.protocols.Drafter``: each head's top-T tokens, ``head_tokens`` (B, K, T).

    Same arguments as the reference ``MedusaDrafter``; ``tree_builder`` names the static tree."""

    def __init__(
        self,
        config: MedusaConfig,
        weights: dict,
        *,
        lm_head: torch.Tensor | None = None,
        dtype: torch.dtype,
        device: torch.device,
        top_t: int | None = None,
    ):
        top_t = config.top_t if top_t is None else top_t
        if (
            isinstance(top_t, bool)
            or not isinstance(top_t, int)
            or not 1 <= top_t <= config.vocab_size
        ):
            raise ValueError(
                f"top_t must be an integer in [1, vocab_size={config.vocab_size}], got {top_t!r}"
            )
        self.config = config
        self.heads = MedusaHeads(
            config, weights, lm_head=lm_head, dtype=dtype, device=device
        ).eval()
        self.top_t = top_t
        self.dtype = dtype
        self.caps = DrafterCaps(
            tree_builder=("medusa_tree", {"choices": config.choices}),
            max_tree_size=tree_size(config),
        )

    @torch.inference_mode()
    def propose(self, context: DraftContext) -> Draft:
        logits = self.heads(context.hidden.to(self.dtype))  # (B, K, V)
        batch, heads, vocab = logits.shape
        _, tokens = top_k_lowest_index(logits.reshape(batch * heads, vocab), self.top_t)
        return Draft(
            root_tokens=context.root_tokens, head_tokens=tokens.reshape(batch, heads, self.top_t)
        )


class TorchStaticTreeBuilder:
    """Satisfies ``specdec.protocols.TreeBuilder`` for Medusa drafts on torch.

    choices: a preset name or explicit top-index paths. The tree's shape comes from the
    reference ``StaticTreeBuilder`` (same node order); its tensors are moved to a device once.
    """

    def __init__(self, choices: str | Iterable[Sequence[int]]):
        self.reference = StaticTreeBuilder(choices)
        self.head_index = np.asarray(
            [len(path) - 1 for path in self.reference.choices], dtype=np.int64
        )
        self.rank_index = np.asarray([path[-1] for path in self.reference.choices], dtype=np.int64)
        self._on_device: dict[torch.device, tuple[torch.Tensor, ...]] = {}

    def _tensors(self, device: torch.device) -> tuple[torch.Tensor, ...]:
        if device not in self._on_device:
            ref = self.reference
            arrays = (ref.parents, ref.depth, ref.ancestor_mask, self.head_index, self.rank_index)
            self._on_device[device] = tuple(torch.as_tensor(a, device=device) for a in arrays)
        return self._on_device[device]

    def build(self, draft: Draft) -> DraftTree:
        """head_tokens (B, K, T) -> a DraftTree with N = len(choices) + 1 nodes in every row."""
        if draft.head_tokens is None:
            raise ValueError(
                "the medusa_tree builder needs a Medusa draft (Draft.head_tokens, shape (B, K, "
                "T)); this draft has beams: use a beam tree builder"
            )
        head_tokens = draft.head_tokens
        batch, num_heads, top_t = head_tokens.shape
        self.reference._check_fits(num_heads, top_t)
        parents, depth, mask, head_index, rank_index = self._tensors(head_tokens.device)
        n = self.reference.num_nodes
        tokens = torch.cat(
            [draft.root_tokens[:, None].to(torch.int64), head_tokens[:, head_index, rank_index]],
            dim=1,
        )
        return DraftTree(
            tokens=tokens,
            parents=parents.expand(batch, n),
            depth=depth.expand(batch, n),
            ancestor_mask=mask.expand(batch, n, n),
            num_nodes=torch.full((batch,), n, dtype=torch.int64, device=head_tokens.device),
        )
