"""The MLX target's KV cache: one key and one value buffer per layer, (slots, Hkv, capacity, Dh),
allocated when the target is loaded and never grown, and the committed length of every slot.

Slot s's committed entries sit at positions ``0 .. length[s] - 1``. A tree forward over some
slots writes its N nodes' entries at ``length[s] + i`` (scratch space past the committed ones,
masked out for everything but the tree); ``commit`` gathers the accepted path's entries to
``length[s] .. length[s] + num_accepted`` and advances the lengths. Nothing is recomputed and no
Python loop runs over rows. Lengths are kept on the host (the decode loop has the accepted
counts there already when it commits), so sizing a forward reads nothing from the device.
"""

from __future__ import annotations

import mlx.core as mx
import numpy as np


class MlxKVCache:
    """Keys and values of ``num_slots`` request slots with ragged lengths."""

    def __init__(
        self,
        *,
        num_layers: int,
        num_kv_heads: int,
        head_dim: int,
        dtype,
        num_slots: int,
        capacity: int,
    ):
        self.num_layers = num_layers
        self.num_kv_heads = num_kv_heads
        self.head_dim = head_dim
        shape = (num_slots, num_kv_heads, capacity, head_dim)
        self.keys = [mx.zeros(shape, dtype=dtype) for _ in range(num_layers)]
        self.values = [mx.zeros(shape, dtype=dtype) for _ in range(num_layers)]
        self.lengths = np.zeros(num_slots, dtype=np.int64)  # host
        self.admitted = np.zeros(num_slots, dtype=bool)
        self._heads = mx.arange(num_kv_heads)[None, :, None]  # (1, Hkv, 1)

    @property
    def num_slots(self) -> int:
        return len(self.lengths)

    @property
    def capacity(self) -> int:
        return int(self.keys[0].shape[2])

    def write(
        self,
        layer: int,
        slots: mx.array,
        positions: mx.array,
        keys: mx.array,
        values: mx.array,
        block: tuple[int, int, int] | None,
    ) -> None:
        """Write keys, values (B, Hkv, n, Dh) at positions (B, n) of ``slots`` (B,); ``block`` =
        (first slot, end slot, start) when the rows are consecutive slots all writing
        start .. start + n - 1."""
        if block is not None:
            first, end, start = block
            n = keys.shape[2]
            self.keys[layer][first:end, :, start : start + n, :] = keys
            self.values[layer][first:end, :, start : start + n, :] = values
            return
        index = slots[:, None, None], self._heads, positions[:, None, :]  # -> (B, Hkv, n)
        self.keys[layer][index] = keys
        self.values[layer][index] = values

    def view(
        self, layer: int, slots: mx.array, size: int, span: tuple[int, int] | None
    ) -> tuple[mx.array, mx.array]:
        """Keys and values (B, Hkv, size, Dh) at positions 0 .. size - 1 of ``slots``: slices when
        ``span`` = (first, end) says the rows are the consecutive slots first .. end - 1."""
        if span is not None:
            first, end = span
            return self.keys[layer][first:end, :, :size, :], self.values[layer][
                first:end, :, :size, :
            ]
        return self.keys[layer][:, :, :size, :][slots], self.values[layer][:, :, :size, :][slots]

    def commit_path(self, slots: np.ndarray, path: mx.array, num_accepted: np.ndarray) -> None:
        """Move the entries of ``path[b, :num_accepted[b] + 1]`` (tree nodes, staged at
        ``length[slot] + node``) to ``length[slot] + k`` and advance the lengths.

        path (B, P) int32 (-1 padded). Positions past the new length keep whatever they held."""
        if path.shape[1] > 1:  # a root-only tree: its entry is already in place
            steps = mx.arange(path.shape[1])[None, :]  # (1, P)
            accepted = steps <= mx.array(num_accepted.astype(np.int32))[:, None]
            base = mx.array(self.lengths[slots].astype(np.int32))[:, None]  # (B, 1)
            rows = mx.array(slots.astype(np.int32))[:, None, None]
            # (B, Hkv, P)
            source = (
                rows,
                self._heads,
                (base + mx.where(accepted, path, steps))[:, None, :],
            )
            target = rows, self._heads, (base + steps)[:, None, :]
            for layer in range(self.num_layers):
                for buffers in (self.keys, self.values):
                    moved = buffers[layer][source]
                    buffers[layer][target] = moved
        self.lengths[slots] += num_accepted + 1

    def arrays(self) -> list[mx.array]:
        """Every array of the cache, for evaluation."""
        return [*self.keys, *self.values]
