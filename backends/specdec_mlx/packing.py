"""Packing prompt chunks and tree rows into one token stream and back: the MLX twin of
``specdec.reference.packing`` (checked against it in tests/backends/test_mlx_target.py)."""

from __future__ import annotations

from typing import Sequence

import mlx.core as mx

from specdec.reference.packing import Segment

__all__ = ["pack", "unpack"]


def pack(parts: Sequence[mx.array], has_tree: bool) -> mx.array:
    """(T, ...) stream: the chunks ((c_i, ...) each), then the tree rows ((B, N, ...), row-major)
    when ``has_tree`` (the last part)."""
    parts = list(parts)
    if has_tree:
        parts[-1] = parts[-1].reshape((-1,) + tuple(parts[-1].shape[2:]))
    return parts[0] if len(parts) == 1 else mx.concatenate(parts, axis=0)


def unpack(
    stream: mx.array, segments: Sequence[Segment], num_chunks: int, has_tree: bool
) -> tuple[list[mx.array], mx.array | None]:
    """``pack`` undone: ([(c_i, ...) per chunk], (B, N, ...) tree rows or None)."""
    chunks = [stream[s.offset : s.end] for s in segments[:num_chunks]]
    tree = None
    if has_tree:
        s = segments[-1]
        tree = stream[s.offset : s.end].reshape((s.rows, s.width) + tuple(stream.shape[1:]))
    return chunks, tree
