"""The MLX target's KV cache: one key and one value buffer per layer, (B, Hkv, C, Dh), and
per-row committed lengths (B,) on the device.

Row b's committed entries sit at slots ``0 .. length[b] - 1`` (slot = position). A tree forward
writes its N nodes' entries at slots ``length[b] + i`` (scratch space past the committed ones,
masked out for everything but the tree); ``commit`` gathers the accepted path's entries to slots
``length[b] .. length[b] + num_accepted[b]`` and advances the lengths. Nothing is recomputed, no
Python loop runs over rows, and no value is read on the host: the capacity is sized from the
host copy of the lengths, which the decode loop's evaluation point has already materialised.
"""

from __future__ import annotations

import mlx.core as mx
import numpy as np

GROWTH = 256  # capacity is a multiple of this many slots


class MlxKVCache:
    """Keys and values of B rows with ragged lengths; arrays are replaced, never copied row by row."""

    def __init__(self, *, num_layers: int, num_kv_heads: int, head_dim: int, dtype):
        self.num_layers = num_layers
        self.num_kv_heads = num_kv_heads
        self.head_dim = head_dim
        self.dtype = dtype
        self.keys: list[mx.array] = []
        self.values: list[mx.array] = []
        self.lengths = mx.zeros((0,), dtype=mx.int32)  # (B,)

    @property
    def batch_size(self) -> int:
        return int(self.lengths.shape[0])

    @property
    def capacity(self) -> int:
        return int(self.keys[0].shape[2]) if self.keys else 0

    def host_lengths(self) -> np.ndarray:
        """(B,) int64 NumPy copy of the lengths (free when the last step was evaluated)."""
        return np.array(self.lengths).astype(np.int64)

    def reset(self, batch_size: int, capacity: int) -> None:
        """Empty buffers for ``batch_size`` rows with room for ``capacity`` slots."""
        capacity = -(-capacity // GROWTH) * GROWTH
        shape = (batch_size, self.num_kv_heads, capacity, self.head_dim)
        self.keys = [mx.zeros(shape, dtype=self.dtype) for _ in range(self.num_layers)]
        self.values = [mx.zeros(shape, dtype=self.dtype) for _ in range(self.num_layers)]
        self.lengths = mx.zeros((batch_size,), dtype=mx.int32)

    def reserve(self, slots: int) -> None:
        """Grow every buffer (zeros appended) so that ``slots`` slots fit."""
        if slots <= self.capacity:
            return
        capacity = -(-max(slots, 2 * self.capacity) // GROWTH) * GROWTH
        batch = self.batch_size
        extra = mx.zeros((batch, self.num_kv_heads, capacity - self.capacity, self.head_dim), dtype=self.dtype)
        self.keys = [mx.concatenate([k, extra], axis=2) for k in self.keys]
        self.values = [mx.concatenate([v, extra], axis=2) for v in self.values]

    def write_block(self, layer: int, start: int, keys: mx.array, values: mx.array) -> None:
        """Write keys, values (B, Hkv, n, Dh) at slots ``start .. start + n - 1`` of every row."""
        n = keys.shape[2]
        self.keys[layer][:, :, start : start + n, :] = keys
        self.values[layer][:, :, start : start + n, :] = values

    def write_slots(self, layer: int, slots: mx.array, keys: mx.array, values: mx.array) -> None:
        """Write keys, values (B, Hkv, n, Dh) at per-row slots (B, n) int32."""
        index = slots[:, None, :, None]  # (B, 1, n, 1), broadcast over heads and head_dim
        self.keys[layer] = mx.put_along_axis(self.keys[layer], index, keys, axis=2)
        self.values[layer] = mx.put_along_axis(self.values[layer], index, values, axis=2)

    def view(self, layer: int, span: int) -> tuple[mx.array, mx.array]:
        """Keys and values of slots ``0 .. span - 1``, each (B, Hkv, span, Dh)."""
        return self.keys[layer][:, :, :span, :], self.values[layer][:, :, :span, :]

    def commit_path(self, path: mx.array, num_accepted: mx.array) -> None:
        """Move the entries of ``path[b, :num_accepted[b] + 1]`` (tree nodes, staged at slots
        ``length[b] + node``) to slots ``length[b] + k`` and advance the lengths.

        path (B, P) int32 (-1 padded), num_accepted (B,) int32. Slots past the new length keep
        whatever they held (they are scratch space)."""
        if path.shape[1] == 1:  # a root-only tree: its entry is already in place
            self.lengths = self.lengths + 1
            return
        steps = mx.arange(path.shape[1])[None, :]  # (1, P)
        accepted = steps <= num_accepted[:, None]
        base = self.lengths[:, None]
        source = (base + mx.where(accepted, path, steps))[:, None, :, None]  # (B, 1, P, 1)
        target = (base + steps)[:, None, :, None]
        for layer in range(self.num_layers):
            for buffers in (self.keys, self.values):
                moved = mx.take_along_axis(buffers[layer], source, axis=2)
                buffers[layer] = mx.put_along_axis(buffers[layer], target, moved, axis=2)
        self.lengths = self.lengths + num_accepted.astype(mx.int32) + 1

    def arrays(self) -> list[mx.array]:
        """Every array of the cache, for evaluation."""
        return [self.lengths, *self.keys, *self.values]
