"""The static Medusa tree: choices (top-index paths) -> ``DraftTree`` (float64 NumPy reference).

Node 0 is the root (the last emitted token). Node i >= 1 is choice i-1 in canonical order
(depth, then lexicographic; ``specdec_medusa.choices.sort_choices``). The node of path
``c = (r_1, ..., r_d)`` carries token ``head_tokens[b, d-1, r_d]``: the rank-``r_d``
proposal of head d-1, which predicts the token d positions after the root. Its parent is
the node of ``c[:-1]``. The shape of the tree is the same for every row and every step;
only the tokens change.
"""

from __future__ import annotations

from typing import Iterable, Sequence

import numpy as np

from specdec.reference.tree import ancestor_mask_from_parents
from specdec.types import Draft, DraftTree
from specdec_medusa.choices import Choices, resolve_choices


def choices_to_parents(choices: str | Iterable[Sequence[int]]) -> np.ndarray:
    """Parent node of every node of the static tree. -> (N,) int64, ``parents[0] == -1``.

    ``choices`` is a preset name or a list of paths; N = number of choices + 1.
    """
    ordered = resolve_choices(choices)
    index = {(): 0}
    index.update({path: i + 1 for i, path in enumerate(ordered)})
    parents = [-1] + [index[path[:-1]] for path in ordered]
    return np.asarray(parents, dtype=np.int64)


class StaticTreeBuilder:
    """Satisfies ``specdec.protocols.TreeBuilder`` for Medusa drafts (``Draft.head_tokens``).

    choices: a preset name or an explicit list of top-index paths (validated here).
    Attributes, all for one row: ``choices`` (canonical order), ``parents`` (N,), ``depth``
    (N,), ``ancestor_mask`` (N, N), ``num_nodes`` N, ``max_depth`` D, ``max_rank`` (-1 for a
    root-only tree).
    """

    def __init__(self, choices: str | Iterable[Sequence[int]]):
        self.choices: Choices = resolve_choices(choices)
        self.parents = choices_to_parents(self.choices)  # (N,)
        self.depth = np.asarray([0] + [len(path) for path in self.choices], dtype=np.int64)  # (N,)
        self.ancestor_mask = ancestor_mask_from_parents(self.parents[None])[0]  # (N, N)
        self.num_nodes = len(self.parents)
        self.max_depth = int(self.depth.max())
        self.max_rank = max((max(path) for path in self.choices), default=-1)
        # Where each drafted node's token comes from: head_tokens[:, head_index, rank_index].
        self._head_index = np.asarray([len(path) - 1 for path in self.choices], dtype=np.int64)
        self._rank_index = np.asarray([path[-1] for path in self.choices], dtype=np.int64)

    def _check_fits(self, num_heads: int, top_t: int) -> None:
        for path in self.choices:
            if len(path) > num_heads or path[-1] >= top_t:
                raise ValueError(
                    f"Medusa choice {path!r} needs head {len(path) - 1} and rank {path[-1]}, but "
                    f"the draft has head_tokens for K={num_heads} heads and T={top_t} ranks; use "
                    "choices that fit, or a drafter with more heads or a larger top_t"
                )

    def build(self, draft: Draft) -> DraftTree:
        """head_tokens (B, K, T) -> a DraftTree with N = len(choices) + 1 nodes in every row."""
        if draft.head_tokens is None:
            raise ValueError(
                "StaticTreeBuilder needs a Medusa draft (Draft.head_tokens, shape (B, K, T)); "
                "this draft has beams: use a beam tree builder"
            )
        head_tokens = np.asarray(draft.head_tokens, dtype=np.int64)  # (B, K, T)
        root_tokens = np.asarray(draft.root_tokens, dtype=np.int64)  # (B,)
        batch, num_heads, top_t = head_tokens.shape
        if root_tokens.shape != (batch,):
            raise ValueError(
                f"root_tokens has shape {root_tokens.shape}, expected ({batch},) to match "
                "head_tokens"
            )
        self._check_fits(num_heads, top_t)
        n = self.num_nodes
        tokens = np.empty((batch, n), dtype=np.int64)
        tokens[:, 0] = root_tokens
        tokens[:, 1:] = head_tokens[:, self._head_index, self._rank_index]  # (B, N-1)
        return DraftTree(
            tokens=tokens,
            parents=np.broadcast_to(self.parents, (batch, n)).copy(),
            depth=np.broadcast_to(self.depth, (batch, n)).copy(),
            ancestor_mask=np.broadcast_to(self.ancestor_mask, (batch, n, n)).copy(),
            num_nodes=np.full((batch,), n, dtype=np.int64),
            beam_to_node=None,
        )
