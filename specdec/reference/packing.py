"""How one forward packs prompt chunks and tree rows into one token stream, and back
(NumPy reference).

A step of in-flight batching runs the requests in their context phase (prompt chunks of
different lengths) and those in their generation phase (draft trees, padded to the widest row)
through one target forward: every matrix product of a decoder layer reads its weights once for
all of them. The tokens are packed one *segment* after another, context first:

    [chunk 0 (c0 tokens)] [chunk 1 (c1 tokens)] ... [tree rows (B x N tokens, row-major)]

A segment is the unit of attention (rows that attend with one mask): a chunk alone, causally over
its slot's cache; the tree rows together, through the tree mask. Everything else in a layer
(norms, projections, MLP) runs on the packed (T, ...) stream; ``unpack`` splits it back into a
(c, ...) array per chunk and a (B, N, ...) array of tree rows.

``layout`` is the index arithmetic the fast paths share, and ``unpack_output`` turns their packed
hidden states into the forward's ``TargetOutput``; ``pack`` and ``unpack`` are the twins that the
fast backends' own packing functions are checked against.
"""

from __future__ import annotations

from typing import Callable, Sequence

import attrs
import numpy as np

from specdec.types import PromptOutput, TargetOutput

__all__ = ["Segment", "layout", "pack", "unpack", "unpack_output"]


@attrs.frozen
class Segment:
    """``rows`` x ``width`` packed tokens from ``offset``: a prompt chunk (rows 1, width its
    length) or the tree rows (rows B, width N)."""

    offset: int
    rows: int
    width: int

    @property
    def size(self) -> int:
        return self.rows * self.width

    @property
    def end(self) -> int:
        return self.offset + self.size


def layout(chunk_sizes: Sequence[int], tree_shape: tuple[int, int] | None) -> list[Segment]:
    """The segments of a forward: one per chunk (in order), then one for the tree rows (when
    ``tree_shape`` = (B, N) is given and B > 0)."""
    segments, offset = [], 0
    shapes = [(1, int(c)) for c in chunk_sizes]
    if tree_shape is not None and tree_shape[0] > 0:
        shapes.append((int(tree_shape[0]), int(tree_shape[1])))
    for rows, width in shapes:
        if width < 1:
            raise ValueError(f"a segment needs at least one token per row, got {rows} x {width}")
        segments.append(Segment(offset, rows, width))
        offset += rows * width
    return segments


def pack(chunks: Sequence[np.ndarray], tree: np.ndarray | None) -> np.ndarray:
    """(T, ...) stream of the chunks ((c_i, ...) each) followed by the tree rows ((B, N, ...),
    row-major)."""
    parts = [np.asarray(c) for c in chunks]
    if tree is not None and tree.shape[0] > 0:
        parts.append(np.asarray(tree).reshape((-1,) + tree.shape[2:]))
    return np.concatenate(parts)


def unpack(
    stream: np.ndarray, chunk_sizes: Sequence[int], tree_shape: tuple[int, int] | None
) -> tuple[list[np.ndarray], np.ndarray | None]:
    """``pack`` undone: ([(c_i, ...) per chunk], (B, N, ...) tree rows or None)."""
    segments = layout(chunk_sizes, tree_shape)
    chunks = [stream[s.offset : s.end] for s in segments[: len(chunk_sizes)]]
    tree = None
    if len(segments) > len(chunk_sizes):
        s = segments[-1]
        tree = stream[s.offset : s.end].reshape((s.rows, s.width) + stream.shape[1:])
    return chunks, tree


def unpack_output(
    hidden,
    layers: dict,
    segments: Sequence[Segment],
    num_chunks: int,
    has_tree: bool,
    *,
    unpack: Callable,
    logits: Callable,
) -> TargetOutput:
    """The ``TargetOutput`` of a packed forward, in any framework: ``hidden`` (T, H) after the
    final norm and ``layers`` {layer: (T, H)} split with the framework's ``unpack(stream,
    segments, num_chunks, has_tree)``; ``context`` holds a ``PromptOutput`` per chunk (logits at
    its last token), and the tree rows give logits, hidden and layers (None without a tree).
    ``logits(hidden)`` is the target's LM head."""
    chunk_hidden, tree_hidden = unpack(hidden, segments, num_chunks, has_tree)
    split = {i: unpack(v, segments, num_chunks, has_tree) for i, v in layers.items()}
    prompts = tuple(
        PromptOutput(logits=logits(h[-1]), hidden=h, layers={i: v[0][c] for i, v in split.items()})
        for c, h in enumerate(chunk_hidden)
    )
    if not has_tree:
        return TargetOutput(logits=None, hidden=None, context=prompts)
    return TargetOutput(
        logits=logits(tree_hidden),
        hidden=tree_hidden,
        layers={i: v[1] for i, v in split.items()},
        context=prompts,
    )
