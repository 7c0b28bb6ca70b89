"""A preallocated key/value cache with per-row lengths, written at explicit slots.

One tensor holds every layer: ``data`` (layers, 2, B, Hkv, capacity, Dh), axis 1: 0 keys,
1 values; ``data[layer, 0]`` is that layer's (B, Hkv, S_max, Dh) key cache. Row b's committed
entries sit at slots ``0 .. lengths[b] - 1`` (slot = position). A tree forward writes its N
nodes at slots ``lengths[b] + i`` (staged, not committed); ``commit`` moves the accepted path's
entries to ``lengths[b] .. lengths[b] + num_accepted[b]`` with one ``index_select`` and one
``index_copy_`` over the flattened (B, Hkv, capacity) axes, for all layers and rows, and advances the lengths. Nothing is ever rolled back: slots at or past
a row's length are ignored by the attention mask. The capacity doubles by reallocation.

``lengths`` lives on the device; ``host_lengths`` mirrors it on the host (read in ``commit``,
which is where a step meets the host anyway) so that shapes never need a device read.
"""

from __future__ import annotations

import numpy as np
import torch

__all__ = ["TorchKVCache"]


class TorchKVCache:
    """Committed keys and values of B rows with ragged lengths, plus one staged tree."""

    def __init__(self, *, num_layers: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype,
                 device: torch.device, initial_capacity: int = 256):
        self.num_layers = num_layers
        self.num_kv_heads = num_kv_heads
        self.head_dim = head_dim
        self.dtype = dtype
        self.device = device
        self.initial_capacity = initial_capacity
        self.data = torch.zeros((num_layers, 2, 0, num_kv_heads, 0, head_dim), dtype=dtype, device=device)
        self.lengths = torch.zeros(0, dtype=torch.int64, device=device)  # (B,)
        self.host_lengths = np.zeros(0, dtype=np.int64)  # (B,)
        self.staged_size = 0  # N of the last forward_tree, 0 when none is staged

    @property
    def batch_size(self) -> int:
        return int(self.data.shape[2])

    @property
    def capacity(self) -> int:
        return int(self.data.shape[4])

    def reset(self, lengths: np.ndarray, *, capacity: int) -> None:
        """Empty the cache for ``len(lengths)`` rows that will hold ``lengths`` (B,) entries."""
        capacity = max(self.initial_capacity, _round_up(capacity))
        shape = (self.num_layers, 2, len(lengths), self.num_kv_heads, capacity, self.head_dim)
        self.data = torch.zeros(shape, dtype=self.dtype, device=self.device)
        self.host_lengths = np.asarray(lengths, dtype=np.int64).copy()
        self.lengths = torch.from_numpy(self.host_lengths.copy()).to(self.device)
        self.staged_size = 0

    def ensure_capacity(self, needed: int) -> None:
        """Grow (by reallocation, at least doubling) so that slots ``0 .. needed - 1`` exist."""
        if needed <= self.capacity:
            return
        capacity = max(2 * self.capacity, _round_up(needed))
        grown = torch.zeros(self.data.shape[:4] + (capacity, self.head_dim), dtype=self.dtype, device=self.device)
        grown[:, :, :, :, : self.capacity] = self.data
        self.data = grown

    def write(self, layer: int, slots: torch.Tensor, keys: torch.Tensor, values: torch.Tensor,
              uniform_start: int | None = None) -> None:
        """Store keys, values (B, Hkv, n, Dh) of ``layer`` at slots (B, n) (a batched ``index_copy_``).

        ``uniform_start``: when every row writes the contiguous slots ``start .. start + n - 1``
        (equal lengths, or a prefill chunk), a plain slice copy does the same faster.
        """
        n = keys.shape[2]
        if uniform_start is not None:
            self.data[layer, 0, :, :, uniform_start : uniform_start + n] = keys
            self.data[layer, 1, :, :, uniform_start : uniform_start + n] = values
            return
        index = self._flat_index(slots)  # (B*Hkv*n,)
        layer_data = self.data[layer].view(2, -1, self.head_dim)  # (2, B*Hkv*capacity, Dh)
        layer_data[0].index_copy_(0, index, keys.reshape(-1, self.head_dim))
        layer_data[1].index_copy_(0, index, values.reshape(-1, self.head_dim))

    def _flat_index(self, slots: torch.Tensor) -> torch.Tensor:
        """Row-major index into the flattened (B, Hkv, capacity) axes of slots (B, n) for every head
        -> (B*Hkv*n,) int64, ordered like a (B, Hkv, n) tensor."""
        batch = slots.shape[0]
        rows = torch.arange(batch, device=slots.device)[:, None, None] * self.num_kv_heads  # (B, 1, 1)
        heads = torch.arange(self.num_kv_heads, device=slots.device)[None, :, None]  # (1, Hkv, 1)
        return ((rows + heads) * self.capacity + slots[:, None, :]).reshape(-1)

    def view(self, layer: int, size: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys and values (B, Hkv, size, Dh) of ``layer``, slots 0 .. size - 1 (views)."""
        return self.data[layer, 0, :, :, :size], self.data[layer, 1, :, :, :size]

    def commit(self, path: torch.Tensor, num_accepted: torch.Tensor) -> None:
        """Keep the staged entries of ``path[b, :num_accepted[b] + 1]`` (node indices, root first).

        path (B, A) int64, -1 past the accepted nodes; node i was written at slot lengths[b] + i.
        Node ``path[b, d]`` moves to slot ``lengths[b] + d``: every source is read before any
        destination is written, so overlapping moves are safe. Entries past the accepted path
        land past the new length, where nothing reads them.
        """
        batch, width = path.shape
        start = self.lengths[:, None]  # (B, 1)
        source = start + path.clamp(min=0)  # (B, A)
        target = start + torch.arange(width, device=self.device)  # (B, A)
        flat = self.data.view(self.num_layers, 2, -1, self.head_dim)  # (layers, 2, B*Hkv*capacity, Dh)
        moved = flat.index_select(2, self._flat_index(source))  # (layers, 2, B*Hkv*A, Dh)
        flat.index_copy_(2, self._flat_index(target), moved)
        self.lengths = self.lengths + num_accepted + 1
        self.host_lengths = self.host_lengths + num_accepted.cpu().numpy() + 1
        self.staged_size = 0


def _round_up(size: int, multiple: int = 256) -> int:
    return -(-int(size) // multiple) * multiple
