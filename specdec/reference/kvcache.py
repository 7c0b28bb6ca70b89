"""A key/value cache for tree verification: committed entries per request slot, plus one staged
tree.

Slot s holds its committed keys and values at positions ``0 .. lengths[s] - 1`` in one buffer of
shape (layers, 2, Hkv, capacity, Dh) (axis 1: 0 keys, 1 values), allocated when the target is
loaded and never grown. A tree forward over some slots stages the keys and values of all its
nodes, (B, layers, 2, Hkv, N, Dh); ``commit`` copies the accepted path's entries, in path order,
behind each slot's committed ones and drops the rest. Nothing committed changes until then, so a
rejected tree costs no rollback.
"""

from __future__ import annotations

import numpy as np

from specdec.errors import InvalidInputError
from specdec.slots import check_room, check_slots
from specdec.types import DraftTree, Verdict


def _same_tree(a: DraftTree, b: DraftTree) -> bool:
    if a is b:
        return True
    return all(
        np.array_equal(np.asarray(getattr(a, name)), np.asarray(getattr(b, name)))
        for name in ("tokens", "parents", "depth", "num_nodes")
    )


class TreeKVCache:
    """Committed keys and values of ``num_slots`` request slots (ragged lengths) and the staged
    entries of one tree."""

    def __init__(
        self, *, num_layers: int, num_kv_heads: int, head_dim: int, num_slots: int, capacity: int
    ):
        self.num_layers = num_layers
        self.num_kv_heads = num_kv_heads
        self.head_dim = head_dim
        self.capacity = int(capacity)
        shape = (num_slots, num_layers, 2, num_kv_heads, self.capacity, head_dim)
        self._data = np.zeros(shape)  # pages are only touched as positions fill
        self._lengths = np.zeros(num_slots, dtype=np.int64)
        self._admitted = np.zeros(num_slots, dtype=bool)
        self._staged_tree: DraftTree | None = None
        self._staged_slots: np.ndarray | None = None
        self._staged: np.ndarray | None = None  # (B, layers, 2, Hkv, N, Dh)

    @property
    def num_slots(self) -> int:
        return len(self._lengths)

    @property
    def lengths(self) -> np.ndarray:
        """(num_slots,) int64: committed entries per slot (a copy; 0 for free slots)."""
        return self._lengths.copy()

    @property
    def admitted(self) -> np.ndarray:
        """(num_slots,) bool: slots holding a request (a copy)."""
        return self._admitted.copy()

    def check_slots(self, slots, *, admitted: bool, what: str) -> np.ndarray:
        """slots as (B,) int64 after checking they are distinct, in range and (not) admitted."""
        return check_slots(self._admitted, slots, admitted_state=admitted, what=what)

    def admit(self, slot: int) -> None:
        """Mark ``slot`` (free) as holding a new request with no entries."""
        slot = int(self.check_slots([slot], admitted=False, what="admit")[0])
        self._lengths[slot] = 0
        self._admitted[slot] = True

    def release(self, slot: int) -> None:
        """Free ``slot``; a staged tree that used it is dropped."""
        slot = int(self.check_slots([slot], admitted=True, what="release")[0])
        self._admitted[slot] = False
        self._lengths[slot] = 0
        if self._staged_slots is not None and slot in self._staged_slots:
            self.discard()

    def check_room(self, slots: np.ndarray, size: int, what: str) -> None:
        """Every slot has room for ``size`` more positions."""
        check_room(self._lengths, slots, size, self.capacity, what)

    def keys(self, layer: int, slot: int) -> np.ndarray:
        """(Hkv, S, Dh) view of the committed keys of ``slot`` at ``layer``, S = lengths[slot]."""
        return self._data[slot, layer, 0, :, : self._lengths[slot]]

    def values(self, layer: int, slot: int) -> np.ndarray:
        """(Hkv, S, Dh) view of the committed values of ``slot`` at ``layer``."""
        return self._data[slot, layer, 1, :, : self._lengths[slot]]

    def append(self, slot: int, entries: np.ndarray) -> None:
        """Commit ``entries`` (layers, 2, Hkv, n, Dh) behind the slot's committed entries."""
        n = entries.shape[3]
        start = int(self._lengths[slot])
        self.check_room(np.array([slot]), n, "append")
        self._data[slot, :, :, :, start : start + n] = entries
        self._lengths[slot] = start + n

    def stage(self, tree: DraftTree, slots: np.ndarray, entries: np.ndarray) -> None:
        """Keep the keys and values of every node of ``tree`` over ``slots``,
        (B, layers, 2, Hkv, N, Dh), for commit."""
        self._staged_tree = tree
        self._staged_slots = slots
        self._staged = entries

    def discard(self) -> None:
        """Drop the staged tree without committing anything."""
        self._staged_tree = None
        self._staged_slots = None
        self._staged = None

    def commit(self, tree: DraftTree, verdict: Verdict) -> None:
        """Append, per row b, the staged entries of ``verdict.path[b, :num_accepted[b] + 1]`` to its
        slot.

        The path must start at the root and follow parent links, so its entries land at the
        consecutive positions ``lengths[b] + depth``. The staged tree is dropped afterwards.
        """
        if self._staged_tree is None:
            raise InvalidInputError(
                "commit(tree, verdict) needs a preceding forward_tree(tree); no tree is staged"
            )
        if not _same_tree(tree, self._staged_tree):
            raise InvalidInputError(
                "commit got a different tree than the last forward_tree; pass the tree that was run"
            )
        path = np.asarray(verdict.path, dtype=np.int64)
        num_accepted = np.asarray(verdict.num_accepted, dtype=np.int64)
        batch = len(self._staged_slots)
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
                    f"verdict.num_accepted[{b}] = {num_accepted[b]} does not fit a path of length "
                    f"{path.shape[1]}"
                )
            nodes = path[b, :count]
            if nodes[0] != 0 or np.any(nodes >= num_nodes[b]) or np.any(nodes < 0):
                raise InvalidInputError(
                    f"verdict.path[{b}] = {nodes.tolist()} must start at the root 0 and stay below "
                    f"num_nodes = {int(num_nodes[b])}"
                )
            if np.any(parents[b, nodes[1:]] != nodes[:-1]) or np.any(
                depth[b, nodes] != np.arange(count)
            ):
                raise InvalidInputError(
                    f"verdict.path[{b}] = {nodes.tolist()} does not follow the tree's parent links"
                )
            kept.append(nodes)
        staged, slots = self._staged, self._staged_slots
        for b, nodes in enumerate(kept):
            self.append(int(slots[b]), np.take(staged[b], nodes, axis=3))
        self.discard()
