"""``specdec_torch.ops``, the torch backend's public array operations, against NumPy.

``specdec.testing.ops.check_ops`` compares every operation with the reference on tie-heavy logits
(ties to the lowest index); the tests below pin what is the torch backend's own: int64 indices,
float64 kept, tensors passed through.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

torch = pytest.importorskip(
    "torch", reason="torch is not installed"
)  # required when SPECDEC_TEST_BACKENDS names torch

from specdec.testing.ops import OPS, check_ops  # noqa: E402
from specdec.types import SamplingConfig  # noqa: E402
from specdec_torch import ops  # noqa: E402


@given(seed=st.integers(0, 2**32 - 1), rows=st.integers(1, 4), vocab=st.integers(2, 12))
def test_public_ops_match_numpy(seed, rows, vocab):
    check_ops(ops, "torch", seed=seed, rows=rows, vocab=vocab)


def test_the_public_surface_is_the_kits():
    assert sorted(ops.__all__) == sorted(OPS)


def test_indices_are_int64_and_float64_stays_float64():
    logits = torch.tensor([[1.0, 3.0, 3.0, 2.0], [0.0, 0.0, 0.0, 0.0]], dtype=torch.float64)
    assert ops.first_argmax(logits).tolist() == [1, 0]
    assert ops.top_indices(logits, 2).dtype == torch.int64
    assert ops.top_k_lowest_index(logits, 2)[0].dtype == torch.float64
    assert ops.target_probs(logits, SamplingConfig(temperature=0.5)).dtype == torch.float64
    assert (
        ops.target_probs(logits.to(torch.bfloat16), SamplingConfig(temperature=0.5)).dtype
        == torch.float32
    )
    assert (
        ops.compute_dtype(torch.float64) == torch.float64
        and ops.compute_dtype(torch.float16) == torch.float32
    )
    assert ops.sample_from(ops.softmax(logits), torch.tensor([0.0, 0.99])).dtype == torch.int64


@given(seed=st.integers(0, 2**32 - 1), rows=st.integers(1, 8), vocab=st.integers(2, 300))
def test_half_precision_argmax_is_the_first_maximum(seed, rows, vocab):
    """bfloat16 / float16 logits are compared in float32 on the CPU: the same token, lowest id on
    ties."""
    values = (
        np.random.default_rng(seed).integers(-4, 4, size=(rows, vocab)).astype(np.float32) / 4
    )  # many ties
    for dtype in (torch.bfloat16, torch.float16):
        assert (
            ops.first_argmax(torch.from_numpy(values).to(dtype)).tolist()
            == np.argmax(values, axis=-1).tolist()
        )


def test_as_array_keeps_dtypes_and_passes_tensors_through():
    tensor = torch.arange(3)
    assert ops.as_array(tensor) is tensor
    assert ops.as_array(np.arange(3)).dtype == torch.int64
    assert ops.as_array(np.full((2, 3), 0.5)).dtype == torch.float64
    converted = ops.as_array([[1, 2]], dtype=torch.float32, device="cpu")
    assert converted.dtype == torch.float32 and tuple(converted.shape) == (1, 2)
