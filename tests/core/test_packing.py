"""Packing prompt chunks and tree rows into one token stream (specdec.reference.packing) and the
backends' twins (specdec_torch.packing, specdec_mlx.packing): the same stream, the same rows
back."""

from __future__ import annotations

import importlib

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from specdec.reference import packing

shapes = st.tuples(
    st.lists(st.integers(1, 6), max_size=3),
    st.one_of(st.none(), st.tuples(st.integers(0, 3), st.integers(1, 5))),
)


def _arrays(chunk_sizes, tree_shape, seed):
    rng = np.random.default_rng(seed)
    chunks = [rng.normal(size=(c, 2)) for c in chunk_sizes]
    tree = None if tree_shape is None else rng.normal(size=tree_shape + (2,))
    return chunks, tree


@settings(max_examples=60, deadline=None)
@given(shape=shapes, seed=st.integers(0, 2**16))
def test_unpack_returns_what_was_packed_in_segment_order(shape, seed):
    chunk_sizes, tree_shape = shape
    assume(
        chunk_sizes or (tree_shape is not None and tree_shape[0] > 0)
    )  # an empty forward packs nothing
    chunks, tree = _arrays(chunk_sizes, tree_shape, seed)
    stream = packing.pack(chunks, tree)
    segments = packing.layout(chunk_sizes, tree_shape)
    assert [s.offset for s in segments] == list(np.cumsum([0] + [s.size for s in segments])[:-1])
    assert stream.shape[0] == sum(s.size for s in segments)
    back_chunks, back_tree = packing.unpack(stream, chunk_sizes, tree_shape)
    assert len(back_chunks) == len(chunks), (
        f"unpack gave {len(back_chunks)} chunks for {len(chunks)} packed"
    )
    for got, want in zip(back_chunks, chunks, strict=True):
        np.testing.assert_array_equal(got, want)
    if tree is not None and tree.shape[0]:
        np.testing.assert_array_equal(back_tree, tree)
        np.testing.assert_array_equal(
            stream[segments[-1].offset :], tree.reshape(-1, 2)
        )  # context first
    else:
        assert back_tree is None


@pytest.mark.parametrize("name, framework", [("torch", "torch"), ("mlx", "mlx.core")])
@settings(max_examples=30, deadline=None)
@given(shape=shapes, seed=st.integers(0, 2**16))
def test_backend_twins_pack_and_unpack_as_the_reference(name, framework, shape, seed):
    lib = pytest.importorskip(framework)
    twin = importlib.import_module(f"specdec_{name}.packing")
    chunk_sizes, tree_shape = shape
    has_tree = tree_shape is not None and tree_shape[0] > 0
    assume(chunk_sizes or has_tree)  # an empty forward packs nothing
    chunks, tree = _arrays(chunk_sizes, tree_shape, seed)
    to_lib = (
        (lambda a: lib.from_numpy(a.astype(np.float32)))
        if name == "torch"
        else (lambda a: lib.array(a.astype(np.float32)))
    )
    to_host = (lambda a: a.numpy()) if name == "torch" else np.array
    parts = [to_lib(c) for c in chunks] + ([to_lib(tree)] if has_tree else [])
    stream = twin.pack(parts, has_tree)
    np.testing.assert_array_equal(
        to_host(stream), packing.pack(chunks, tree if has_tree else None).astype(np.float32)
    )
    segments = packing.layout(chunk_sizes, tree_shape)
    back_chunks, back_tree = twin.unpack(stream, segments, len(chunk_sizes), has_tree)
    want_chunks, want_tree = packing.unpack(
        packing.pack(chunks, tree if has_tree else None).astype(np.float32), chunk_sizes, tree_shape
    )
    assert len(back_chunks) == len(want_chunks) == len(chunks), (
        f"{name} unpack gave {len(back_chunks)} chunks, the reference {len(want_chunks)}, for "
        f"{len(chunks)} packed"
    )
    for got, want in zip(back_chunks, want_chunks, strict=True):
        np.testing.assert_array_equal(to_host(got), want)
    assert (back_tree is None) == (want_tree is None)
    if want_tree is not None:
        np.testing.assert_array_equal(to_host(back_tree), want_tree)
