"""A key/value cache for tree verification: committed entries per row, plus one staged tree.

Row b holds its committed keys and values at positions ``0 .. lengths[b] - 1`` in one buffer of
shape (layers, 2, Hkv, capacity, Dh) (axis 1: 0 keys, 1 values) that doubles when full. A tree
forward stages the keys and values of all its nodes, (B, layers, 2, Hkv, N, Dh); ``commit``
copies the accepted path's entries, in path order, behind each row's committed ones and drops
the rest. Nothing committed changes until then, so a rejected tree costs no rollback.
"""

from __future__ import annotations

import numpy as np

from specdec.errors import InvalidInputError
from specdec.types import DraftTree, Verdict


def _same_tree(a: DraftTree, b: DraftTree) -> bool:
    if a is b:
        return True
    return all(
        np.array_equal(np.asarray(getattr(a, name)), np.asarray(getattr(b, name)))
        for name in ("tokens", "parents", "depth", "num_nodes")
    )


class TreeKVCache:
    """Committed keys and values of B rows (ragged lengths) and the staged entries of one tree."""

    def __init__(self, *, num_layers: int, num_kv_heads: int, head_dim: int, initial_capacity: int = 64):
        self.num_layers = num_layers
        self.num_kv_heads = num_kv_heads
        self.head_dim = head_dim
        self.initial_capacity = initial_capacity
        self._buffers: list[np.ndarray] = []  # per row (layers, 2, Hkv, capacity, Dh)
        self._lengths = np.zeros(0, dtype=np.int64)
        self._staged_tree: DraftTree | None = None
        self._staged: np.ndarray | None = None  # (B, layers, 2, Hkv, N, Dh)

    @property
    def batch_size(self) -> int:
        return len(self._buffers)

    @property
    def lengths(self) -> np.ndarray:
        """(B,) int64: committed entries per row (a copy)."""
        return self._lengths.copy()

    def reset(self, batch_size: int) -> None:
        """Empty the cache and make room for ``batch_size`` rows."""
        shape = (self.num_layers, 2, self.num_kv_heads, self.initial_capacity, self.head_dim)
        self._buffers = [np.zeros(shape) for _ in range(batch_size)]
        self._lengths = np.zeros(batch_size, dtype=np.int64)
        self.discard()

    def keys(self, layer: int, row: int) -> np.ndarray:
        """(Hkv, S, Dh) view of the committed keys of ``row`` at ``layer``, S = lengths[row]."""
        return self._buffers[row][layer, 0, :, : self._lengths[row]]

    def values(self, layer: int, row: int) -> np.ndarray:
        """(Hkv, S, Dh) view of the committed values of ``row`` at ``layer``."""
        return self._buffers[row][layer, 1, :, : self._lengths[row]]

    def append(self, row: int, entries: np.ndarray) -> None:
        """Commit ``entries`` (layers, 2, Hkv, n, Dh) behind the row's committed entries."""
        n = entries.shape[3]
        start = int(self._lengths[row])
        buffer = self._buffers[row]
        if start + n > buffer.shape[3]:
            capacity = max(2 * buffer.shape[3], start + n)
            grown = np.zeros(buffer.shape[:3] + (capacity, self.head_dim))
            grown[:, :, :, :start] = buffer[:, :, :, :start]
            self._buffers[row] = buffer = grown
        buffer[:, :, :, start : start + n] = entries
        self._lengths[row] = start + n

    def stage(self, tree: DraftTree, entries: np.ndarray) -> None:
        """Keep the keys and values of every node of ``tree``, (B, layers, 2, Hkv, N, Dh), for commit."""
        self._staged_tree = tree
        self._staged = entries

    def discard(self) -> None:
        """Drop the staged tree without committing anything."""
        self._staged_tree = None
        self._staged = None

    def commit(self, tree: DraftTree, verdict: Verdict) -> None:
        """Append, per row b, the staged entries of ``verdict.path[b, :num_accepted[b] + 1]``.

        The path must start at the root and follow parent links, so its entries land at the
        consecutive positions ``lengths[b] + depth``. The staged tree is dropped afterwards.
        """
        if self._staged_tree is None:
            raise InvalidInputError("commit(tree, verdict) needs a preceding forward_tree(tree); no tree is staged")
        if not _same_tree(tree, self._staged_tree):
            raise InvalidInputError("commit got a different tree than the last forward_tree; pass the tree that was run")
        path = np.asarray(verdict.path, dtype=np.int64)
        num_accepted = np.asarray(verdict.num_accepted, dtype=np.int64)
        batch = self.batch_size
        if path.ndim != 2 or path.shape[0] != batch or num_accepted.shape != (batch,):
            raise InvalidInputError(
                f"verdict.path must be (B, D+1) and num_accepted (B,) with B = {batch}, got "
                f"{path.shape} and {num_accepted.shape}"
            )
        parents = np.asarray(tree.parents)
        depth = np.asarray(tree.depth)
        num_nodes = np.asarray(tree.num_nodes)
        kept = []
        for b in range(batch):
            count = int(num_accepted[b]) + 1
            if not 1 <= count <= path.shape[1]:
                raise InvalidInputError(
                    f"verdict.num_accepted[{b}] = {num_accepted[b]} does not fit a path of length {path.shape[1]}"
                )
            nodes = path[b, :count]
            if nodes[0] != 0 or np.any(nodes >= num_nodes[b]) or np.any(nodes < 0):
                raise InvalidInputError(
                    f"verdict.path[{b}] = {nodes.tolist()} must start at the root 0 and stay below "
                    f"num_nodes = {int(num_nodes[b])}"
                )
            if np.any(parents[b, nodes[1:]] != nodes[:-1]) or np.any(depth[b, nodes] != np.arange(count)):
                raise InvalidInputError(f"verdict.path[{b}] = {nodes.tolist()} does not follow the tree's parent links")
            kept.append(nodes)
        staged = self._staged
        for b, nodes in enumerate(kept):
            self.append(b, np.take(staged[b], nodes, axis=3))
        self.discard()
