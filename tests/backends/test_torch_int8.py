"""Drafter weights in int8 (``specdec_torch.ops.draft_weight``) against the float64 reference
rounding (``specdec.reference.quantize``): the kernel's product, where it may run, when it is
refused, how the measured choice is made and kept, and ReDrafter's beams with int8 weights equal
the reference's with the same rounding."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

torch = pytest.importorskip("torch")  # required when SPECDEC_TEST_BACKENDS names torch (conftest)

from specdec.errors import InvalidInputError  # noqa: E402
from specdec.reference.quantize import LEVELS, dequantize_rows, quantize_rows  # noqa: E402
from specdec_torch import int8 as int8_module  # noqa: E402
from specdec_torch.ops import draft_weight  # noqa: E402

needs_kernel = pytest.mark.skipif(
    not hasattr(torch.ops.aten, "_weight_int8pack_mm"),
    reason="this torch has no int8 weight-only kernel",
)


@settings(max_examples=30)
@given(
    seed=st.integers(0, 2**16),
    rows=st.integers(1, 5),
    outputs=st.integers(1, 40),
    blocks=st.integers(1, 3),
    dtype=st.sampled_from(["bfloat16", "float32"]),
)
@needs_kernel
def test_int8_product_is_the_product_with_the_reference_rounding(
    seed, rows, outputs, blocks, dtype
):
    rng = np.random.default_rng(seed)
    size = 64 * blocks
    weight = rng.normal(0, 1, size=(outputs, size)).astype(np.float32)
    bias = rng.normal(0, 1, size=outputs).astype(np.float32)
    x = rng.normal(0, 1, size=(2, rows, size)).astype(np.float32)
    as_tensor = lambda a: torch.as_tensor(a).to(getattr(torch, dtype))  # noqa: E731
    got = draft_weight(as_tensor(weight), as_tensor(bias), int8=True)(as_tensor(x)).double().numpy()
    inputs = as_tensor(x).double().numpy()  # the kernel sees x in its dtype
    expected = (
        inputs @ dequantize_rows(*quantize_rows(as_tensor(weight).double().numpy())).T
        + as_tensor(bias).double().numpy()
    )
    exact = inputs @ as_tensor(weight).double().numpy().T + as_tensor(bias).double().numpy()
    scale = np.abs(expected).max() + 1.0
    # bfloat16 rounds the output (8 bits of mantissa); float32 accumulates exactly enough for 1e-5
    assert np.abs(got - expected).max() <= (2e-2 if dtype == "bfloat16" else 1e-5) * scale
    assert not np.allclose(expected, exact, rtol=0, atol=1e-9), (
        "the int8 rounding changed nothing: the test is blind"
    )


def test_reference_rounding_bounds():
    rng = np.random.default_rng(0)
    weight = rng.normal(0, 3, size=(6, 50))
    weight[2] = 0.0
    q, scale = quantize_rows(weight)
    assert q.dtype == np.int8 and np.abs(q).max() <= LEVELS
    assert np.array_equal(np.abs(q[[0, 1, 3, 4, 5]]).max(axis=1), [LEVELS] * 5), (
        "each row's peak maps to 127"
    )
    assert not q[2].any() and scale[2] == 1.0, "a row of zeros stays zero"
    assert np.all(np.abs(dequantize_rows(q, scale) - weight) <= scale[:, None] / 2 + 1e-12)


@pytest.mark.parametrize(
    "dtype, shape", [("bfloat16", (16, 8)), ("bfloat16", (16, 100)), ("float64", (16, 64))]
)
def test_int8_is_refused_where_the_kernel_may_not_run(dtype, shape):
    weight = torch.zeros(shape, dtype=getattr(torch, dtype))
    with pytest.raises(InvalidInputError, match="int8=None .* or False"):
        draft_weight(weight, int8=True)
    x = torch.ones(1, shape[1], dtype=weight.dtype)
    assert torch.equal(
        draft_weight(weight, int8=None)(x), torch.zeros(1, shape[0], dtype=weight.dtype)
    )
    with pytest.raises(InvalidInputError, match="True, False or None"):
        draft_weight(weight, int8="yes")


def test_float32_weights_are_kept_unless_int8_is_asked_for():
    rng = np.random.default_rng(1)
    weight = torch.as_tensor(rng.integers(-4, 4, size=(32, 64)), dtype=torch.float32)
    x = torch.as_tensor(
        rng.integers(-4, 4, size=(3, 64)), dtype=torch.float32
    )  # integers: exact sums
    assert torch.equal(draft_weight(weight, int8=None)(x), x @ weight.T)


@needs_kernel
def test_the_choice_is_measured_once_per_shape_dtype_and_row_class(monkeypatch):
    calls = []
    monkeypatch.setattr(int8_module, "_INT8", {})
    monkeypatch.setattr(
        int8_module, "second_is_faster", lambda first, second: calls.append(second().shape) or True
    )
    product = draft_weight(torch.randn(48, 128, dtype=torch.bfloat16), int8=None)
    for rows in (
        1,
        1,
        3,
        5,
        int8_module.MEASURED_ROWS + 1,
    ):  # more rows than that: the weight's dtype, unmeasured
        product(torch.randn(rows, 128, dtype=torch.bfloat16))
    assert [shape[0] for shape in calls] == [1, 3]
    assert int8_module.int8_choices() == {
        "48 x 128 bfloat16, one row": "int8",
        "48 x 128 bfloat16, several rows": "int8",
    }


@needs_kernel
def test_a_kernel_that_computes_wrong_values_is_never_chosen(monkeypatch):
    monkeypatch.setattr(int8_module, "_INT8", {})
    monkeypatch.setattr(int8_module, "second_is_faster", lambda first, second: True)  # "faster"
    monkeypatch.setattr(
        int8_module._Int8,
        "_product",
        lambda self, rows: torch.zeros(rows.shape[0], self.q.shape[0], dtype=rows.dtype) + 7,
    )
    weight = torch.randn(48, 128, dtype=torch.bfloat16)
    x = torch.randn(2, 128, dtype=torch.bfloat16)
    assert torch.equal(draft_weight(weight, int8=None)(x), draft_weight(weight, int8=False)(x))
    assert int8_module.int8_choices() == {"48 x 128 bfloat16, several rows": "own dtype"}
