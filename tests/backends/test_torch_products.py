"""The torch backend's vocabulary-sized products: both formulations agree, the measured choice
is kept per weight shape, dtype and row-count class, and generation is exact in float32 with
either one forced."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")  # required when SPECDEC_TEST_BACKENDS names torch (conftest)

from specdec_torch import products  # noqa: E402


@pytest.mark.parametrize("rows", [1, 2, 7])
def test_both_formulations_give_the_linear_product(rows):
    rng = np.random.default_rng(rows)
    weight = torch.as_tensor(rng.integers(-4, 4, size=(300, 16)), dtype=torch.float32)
    x = torch.as_tensor(
        rng.integers(-4, 4, size=(rows, 16)), dtype=torch.float32
    )  # integers: exact sums
    expected = torch.nn.functional.linear(x, weight)
    assert torch.equal(products.transposed_product(x, weight), expected)
    assert torch.equal(products.head_product(x[None], weight)[0], expected)


def test_the_choice_is_measured_once_per_weight_shape_dtype_and_row_class(monkeypatch):
    calls = []
    monkeypatch.setattr(products, "_TRANSPOSED", {})
    monkeypatch.setattr(
        products, "second_is_faster", lambda first, second: calls.append(second().shape) or True
    )
    weight = torch.zeros(64, 8)
    for rows in (
        1,
        1,
        3,
        5,
        1,
        products.MEASURED_ROWS + 1,
    ):  # more rows than that: F.linear, unmeasured
        products.head_product(torch.ones(rows, 8), weight)
    products.head_product(
        torch.ones(2, 8, dtype=torch.float64), torch.zeros(64, 8, dtype=torch.float64)
    )
    assert [shape[0] for shape in calls] == [1, 3, 2], (
        "one row, several rows, another dtype: one measurement each"
    )
    assert products.head_product_choices() == {
        "64 x 8 float32, one row": "transposed",
        "64 x 8 float32, several rows": "transposed",
        "64 x 8 float64, several rows": "transposed",
    }


@pytest.mark.parametrize("transposed", [False, True])
def test_float32_speculation_is_exact_with_either_formulation_forced(
    torch_float32_speculation, monkeypatch, transposed
):
    monkeypatch.setattr(products, "_TRANSPOSED", {})
    monkeypatch.setattr(products, "second_is_faster", lambda first, second: transposed)
    spec, plain = torch_float32_speculation()
    assert spec == plain
    assert set(products.head_product_choices().values()) == {
        "transposed" if transposed else "F.linear"
    }
