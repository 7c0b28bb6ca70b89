"""Medusa on MLX: the K heads as one ``mlx.nn.Module`` (weights stacked per head, one batched
matmul for all heads), top-T per head and the static tree, all lazy MLX ops.

The MLX twin of ``specdec_medusa.reference`` and ``specdec_medusa.tree``; it loads the same
checkpoint files (through ``load_medusa_checkpoint``) and borrows the target's LM head for
``head="tied"``. Shapes: B batch, K heads, T top tokens per head, V vocab, H hidden, N nodes.
"""

from __future__ import annotations

from typing import Iterable, Sequence

import mlx.core as mx
import mlx.nn as nn
import numpy as np

from specdec.capabilities import DrafterCaps

from specdec.types import Draft, DraftContext
from specdec_medusa.config import MedusaConfig, tree_size
from specdec_medusa.reference import check_weights
from specdec_medusa.tree import StaticTreeBuilder
from specdec_mlx import ops

__all__ = ["MedusaHeads", "MlxMedusaDrafter", "MlxStaticTreeBuilder"]


class MedusaHeads(nn.Module):
    """K Medusa heads with their weights stacked: ``block_weights`` (layers, K, H, H),
    ``block_biases`` (layers, K, H), ``projections`` (K, V, H) when ``head == "full"``.

    weights: name -> array as in ``specdec_medusa.config`` (checked); lm_head (V, H): the
    target's LM head (borrowed, needed for ``head="tied"``); dtype: the target's.
    """

    def __init__(
        self, config: MedusaConfig, weights: dict, *, lm_head: mx.array | None, dtype=mx.float32
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
        # borrowed from the target: not a parameter of this module
        object.__setattr__(self, "lm_head", lm_head)

        like = mx.zeros((0,), dtype=dtype)  # where and as the target's arrays are

        def stacked(name: str) -> mx.array:  # one array per head -> (K, ...)
            arrays = [np.asarray(weights[name.format(k=k)]) for k in range(config.num_heads)]
            return ops.placed(np.stack(arrays), like)

        layers = range(config.num_layers)
        # (K, H, H) each
        self.block_weights = [stacked(f"medusa_head.{{k}}.{j}.linear.weight") for j in layers]
        # (K, H) each
        self.block_biases = [stacked(f"medusa_head.{{k}}.{j}.linear.bias") for j in layers]
        if config.head == "full":
            self.projections = stacked(f"medusa_head.{{k}}.{config.num_layers}.weight")  # (K, V, H)
        mx.eval(self.parameters())

    def __call__(self, hidden: mx.array) -> mx.array:
        """Logits of every head. hidden (B, H) -> (B, K, V)."""
        # (K, B, H)
        x = mx.broadcast_to(hidden[None], (self.config.num_heads,) + tuple(hidden.shape))
        for weight, bias in zip(self.block_weights, self.block_biases):
            x = x + nn.silu(x @ weight.transpose(0, 2, 1) + bias[:, None, :])  # x + SiLU(W x + b)
        if self.config.head == "full":
            logits = x @ self.projections.transpose(0, 2, 1)  # (K, B, V)
        else:
            logits = x @ self.lm_head.T
        return logits.transpose(1, 0, 2)


class MlxMedusaDrafter:
    """Satisfies ``specdec.protocols.Drafter``: each head's top-T tokens, ``head_tokens``
    (B, K, T) int32, best first, ties to the lower id. Same arguments as the reference
    ``MedusaDrafter``; ``tree_builder`` names the static tree."""

    def __init__(
        self,
        config: MedusaConfig,
        weights: dict,
        *,
        lm_head: mx.array | None = None,
        dtype=mx.float32,
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
        lm_head = None if lm_head is None else ops.as_array(lm_head, dtype=dtype)
        self.heads = MedusaHeads(config, weights, lm_head=lm_head, dtype=dtype)
        self.top_t = top_t
        self.dtype = dtype
        self.caps = DrafterCaps(
            tree_builder=("medusa_tree", {"choices": config.choices}),
            max_tree_size=tree_size(config),
        )

    def propose(self, context: DraftContext) -> Draft:
        logits = self.heads(ops.as_array(context.hidden, dtype=self.dtype))  # (B, K, V)
        head_tokens = ops.top_indices(logits.astype(mx.float32), self.top_t)  # (B, K, T) int32
        return Draft(root_tokens=ops.as_array(context.root_tokens), head_tokens=head_tokens)


class MlxStaticTreeBuilder:
    """Satisfies ``specdec.protocols.TreeBuilder`` for Medusa drafts on MLX.

    choices: a preset name or explicit top-index paths. The tree's shape comes from the
    reference ``StaticTreeBuilder`` (same node order); only the tokens are gathered per step,
    and the depth D is known on the host (no device read).
    """

    def __init__(self, choices: str | Iterable[Sequence[int]]):
        self.reference = StaticTreeBuilder(choices)
        ref = self.reference
        self.parents, self.depth = (
            mx.array(ref.parents.astype(np.int32)),
            mx.array(ref.depth.astype(np.int32)),
        )
        self.ancestor_mask = mx.array(ref.ancestor_mask)
        self.head_index = mx.array(np.asarray([len(p) - 1 for p in ref.choices], dtype=np.int32))
        self.rank_index = mx.array(np.asarray([p[-1] for p in ref.choices], dtype=np.int32))

    def build(self, draft: Draft) -> ops.MlxDraftTree:
        """head_tokens (B, K, T) -> a tree with N = len(choices) + 1 nodes in every row."""
        if draft.head_tokens is None:
            raise ValueError(
                "the medusa_tree builder needs a Medusa draft (Draft.head_tokens, shape (B, K, "
                "T)); this draft has beams: use a beam tree builder"
            )
        head_tokens = ops.as_array(draft.head_tokens, dtype=mx.int32)
        batch, num_heads, top_t = head_tokens.shape
        self.reference._check_fits(num_heads, top_t)
        n = self.reference.num_nodes
        roots = ops.as_array(draft.root_tokens, dtype=mx.int32)[:, None]
        # (B, N)
        tokens = mx.concatenate([roots, head_tokens[:, self.head_index, self.rank_index]], axis=1)
        return ops.MlxDraftTree(
            tokens=tokens,
            parents=mx.broadcast_to(self.parents, (batch, n)),
            depth=mx.broadcast_to(self.depth, (batch, n)),
            ancestor_mask=mx.broadcast_to(self.ancestor_mask, (batch, n, n)),
            num_nodes=mx.full((batch,), n, dtype=mx.int32),
            max_depth=self.reference.max_depth,
        )
