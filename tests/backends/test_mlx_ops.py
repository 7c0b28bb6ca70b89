"""``specdec_mlx.ops``, the mlx backend's public array operations, against NumPy.

``specdec.testing.ops.check_ops`` compares every operation with the reference on tie-heavy logits
(ties to the lowest index); the tests below pin what is the mlx backend's own: int32 indices,
float32 probabilities, NumPy's 64-bit dtypes narrowed, and the tree class drafters build.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

pytest.importorskip(
    "mlx_lm", reason="mlx is not installed"
)  # required when SPECDEC_TEST_BACKENDS names mlx (conftest)

import mlx.core as mx  # noqa: E402

from specdec.testing.ops import OPS, check_ops  # noqa: E402
from specdec.types import DraftTree, SamplingConfig  # noqa: E402
from specdec_mlx import ops  # noqa: E402


@given(seed=st.integers(0, 2**32 - 1), rows=st.integers(1, 4), vocab=st.integers(2, 12))
def test_public_ops_match_numpy(seed, rows, vocab):
    check_ops(ops, "mlx", seed=seed, rows=rows, vocab=vocab)


def test_the_public_surface_is_the_kits_and_the_tree_class():
    assert sorted(ops.__all__) == sorted((*OPS, "MlxDraftTree"))
    assert issubclass(ops.MlxDraftTree, DraftTree)


def test_indices_are_int32_and_probabilities_float32():
    logits = mx.array([[1.0, 3.0, 3.0, 2.0], [0.0, 0.0, 0.0, 0.0]])
    assert ops.first_argmax(logits).tolist() == [1, 0]
    assert ops.top_indices(logits, 2).dtype == mx.int32
    assert ops.top_k_lowest_index(logits, 2)[1].dtype == mx.int32
    assert (
        ops.target_probs(logits.astype(mx.float16), SamplingConfig(temperature=0.5)).dtype
        == mx.float32
    )
    assert ops.compute_dtype(mx.bfloat16) == mx.float32
    assert ops.sample_from(ops.softmax(logits), mx.array([0.0, 0.99])).dtype == mx.int32


def test_as_array_narrows_numpy_dtypes_and_passes_mlx_arrays_through():
    array = mx.arange(3)
    assert ops.as_array(array) is array
    assert ops.as_array(np.arange(3)).dtype == mx.int32
    assert ops.as_array(np.full((2, 3), 0.5)).dtype == mx.float32
    assert ops.as_array(np.arange(3), dtype=mx.float16).dtype == mx.float16


def test_draft_weight_keeps_the_dtype_and_refuses_int8():
    from specdec.errors import InvalidInputError

    weight, bias = mx.array([[1.0, 2.0], [3.0, -1.0]]), mx.array([0.5, 0.0])
    for int8 in (None, False):
        assert ops.draft_weight(weight, bias, int8=int8)(mx.array([[1.0, 1.0]])).tolist() == [
            [3.5, 2.0]
        ]
    with pytest.raises(InvalidInputError, match="int8=None or False"):
        ops.draft_weight(weight, int8=True)
    with pytest.raises(InvalidInputError, match="True, False or None"):
        ops.draft_weight(weight, int8=1.5)
