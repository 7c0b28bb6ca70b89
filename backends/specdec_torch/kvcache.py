"""A preallocated key/value cache of request slots, written at explicit positions.

One tensor holds every layer and slot: ``data`` (layers, 2, slots, Hkv, capacity, Dh), axis 1:
0 keys, 1 values, allocated when the target is loaded and never grown. Slot s's committed
entries sit at positions ``0 .. lengths[s] - 1``. A tree forward over some slots writes its N
nodes at ``lengths[s] + i`` (staged, not committed); ``commit`` moves the accepted path's
entries to ``lengths[s] .. lengths[s] + num_accepted`` with one ``index_select`` and one
``index_copy_`` over the flattened (slots, Hkv, capacity) axes, for all layers and rows, and
advances the lengths. Nothing is ever rolled back: entries at or past a slot's length are
ignored by the attention mask (they hold finite values: the buffer starts zeroed).

Lengths live on the host (``lengths``, read to size each forward) and on the device
(``device_lengths``), so shapes never need a device read.
"""

from __future__ import annotations

import numpy as np
import torch

__all__ = ["TorchKVCache"]


class TorchKVCache:
    """Committed keys and values of ``num_slots`` request slots, plus one staged tree."""

    def __init__(
        self,
        *,
        num_layers: int,
        num_kv_heads: int,
        head_dim: int,
        dtype: torch.dtype,
        device: torch.device,
        num_slots: int,
        capacity: int,
    ):
        self.num_layers = num_layers
        self.num_kv_heads = num_kv_heads
        self.head_dim = head_dim
        self.device = device
        shape = (num_layers, 2, num_slots, num_kv_heads, capacity, head_dim)
        self.data = torch.zeros(shape, dtype=dtype, device=device)
        self.lengths = np.zeros(num_slots, dtype=np.int64)  # host
        self.device_lengths = torch.zeros(num_slots, dtype=torch.int64, device=device)
        self.admitted = np.zeros(num_slots, dtype=bool)
        self.staged_slots: np.ndarray | None = (
            None  # slots of the last forward_tree, None when none is staged
        )
        self.staged_size = 0

    @property
    def num_slots(self) -> int:
        return int(self.data.shape[2])

    @property
    def capacity(self) -> int:
        return int(self.data.shape[4])

    def set_length(self, slot: int, length: int) -> None:
        self.lengths[slot] = length
        self.device_lengths[slot] = length

    def flat_index(self, slots: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """Row-major index into the flattened (slots, Hkv, capacity) axes of positions (B, n) of
        ``slots`` (B,) for every head -> (B*Hkv*n,) int64, ordered like a (B, Hkv, n) tensor."""
        # (1, Hkv, 1)
        heads = torch.arange(self.num_kv_heads, device=positions.device)[None, :, None]
        rows = slots[:, None, None] * self.num_kv_heads  # (B, 1, 1)
        return ((rows + heads) * self.capacity + positions[:, None, :]).reshape(-1)

    def write(
        self,
        layer: int,
        slots: torch.Tensor,
        positions: torch.Tensor,
        keys: torch.Tensor,
        values: torch.Tensor,
        block: tuple[int, int, int] | None = None,
    ) -> None:
        """Store keys, values (B, Hkv, n, Dh) of ``layer`` at positions (B, n) of ``slots`` (B,).

        ``block`` = (first slot, last slot + 1, start): when the rows are consecutive slots that
        all write positions ``start .. start + n - 1``, a plain slice copy does the same faster.
        """
        if block is not None:
            first, end, start = block
            n = keys.shape[2]
            self.data[layer, 0, first:end, :, start : start + n] = keys
            self.data[layer, 1, first:end, :, start : start + n] = values
            return
        index = self.flat_index(slots, positions)
        layer_data = self.data[layer].view(2, -1, self.head_dim)  # (2, slots*Hkv*capacity, Dh)
        layer_data[0].index_copy_(0, index, keys.reshape(-1, self.head_dim))
        layer_data[1].index_copy_(0, index, values.reshape(-1, self.head_dim))

    def view(
        self, layer: int, slots: torch.Tensor, size: int, span: tuple[int, int] | None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys and values (B, Hkv, size, Dh) of ``layer`` at positions 0 .. size - 1 of ``slots``:
        views when ``span`` = (first, end) says the rows are the consecutive slots first .. end - 1,
        else gathered copies."""
        if span is not None:
            first, end = span
            return self.data[layer, 0, first:end, :, :size], self.data[
                layer, 1, first:end, :, :size
            ]
        return self.data[layer, 0, :, :, :size][slots], self.data[layer, 1, :, :, :size][slots]

    def commit(
        self, path: torch.Tensor, num_accepted: torch.Tensor, host_accepted: np.ndarray
    ) -> None:
        """Keep the staged entries of ``path[b, :num_accepted[b] + 1]`` (node indices, root first)
        in the staged slots. path (B, A) int64, -1 past the accepted nodes; node i of row b was
        written at ``lengths[slot] + i`` and moves to ``lengths[slot] + d`` for its depth d: every
        source is read before any destination is written, so overlapping moves are safe."""
        slots = torch.from_numpy(self.staged_slots).to(self.device)
        width = path.shape[1]
        start = self.device_lengths[slots][:, None]  # (B, 1)
        source = start + path.clamp(min=0)  # (B, A)
        target = start + torch.arange(width, device=self.device)  # (B, A)
        # (layers, 2, slots*Hkv*capacity, Dh)
        flat = self.data.view(self.num_layers, 2, -1, self.head_dim)
        moved = flat.index_select(2, self.flat_index(slots, source))  # (layers, 2, B*Hkv*A, Dh)
        flat.index_copy_(2, self.flat_index(slots, target), moved)
        self.device_lengths[slots] += num_accepted + 1
        self.lengths[self.staged_slots] += host_accepted + 1
        self.staged_slots, self.staged_size = None, 0
