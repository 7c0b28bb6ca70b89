"""Packing prompt chunks and tree rows into one token stream and back: the torch twin of
``specdec.reference.packing`` (checked against it in tests/backends/test_torch_target.py)."""

from __future__ import annotations

from typing import Sequence

import torch

from specdec.reference.packing import Segment

__all__ = ["pack", "unpack"]


def pack(parts: Sequence[torch.Tensor], has_tree: bool) -> torch.Tensor:
    """(T, ...) stream: the chunks ((c_i, ...) each), then the tree rows ((B, N, ...), row-major)
    when ``has_tree`` (the last part)."""
    parts = list(parts)
    if has_tree:
        parts[-1] = parts[-1].reshape((-1,) + tuple(parts[-1].shape[2:]))
    return parts[0] if len(parts) == 1 else torch.cat(parts)


def unpack(
    stream: torch.Tensor, segments: Sequence[Segment], num_chunks: int, has_tree: bool
) -> tuple[list[torch.Tensor], torch.Tensor | None]:
    """``pack`` undone as views: ([(c_i, ...) per chunk], (B, N, ...) tree rows or None)."""
    chunks = [stream[s.offset : s.end] for s in segments[:num_chunks]]
    tree = None
    if has_tree:
        s = segments[-1]
        tree = stream[s.offset : s.end].view((s.rows, s.width) + tuple(stream.shape[1:]))
    return chunks, tree
