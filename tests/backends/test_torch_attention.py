"""The torch backend's grouped-query attention: the folded and matrix-product forms equal the
grouped one, the measured choice is kept per dtype, head layout, query class and rows class, and
generation is exact in float32 with each form forced."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

torch = pytest.importorskip("torch")  # required when SPECDEC_TEST_BACKENDS names torch (conftest)

from specdec_torch import layers  # noqa: E402


def _naive(query, keys, values, mask):
    """float64 attention written out: query head h reads key/value head h // group."""
    heads, kv_heads = query.shape[1], keys.shape[1]
    keys, values = (t.repeat_interleave(heads // kv_heads, dim=1) for t in (keys, values))
    scores = query @ keys.transpose(-1, -2) / np.sqrt(query.shape[-1])
    return torch.softmax(scores.masked_fill(~mask, float("-inf")), dim=-1) @ values


@given(
    seed=st.integers(0, 2**32 - 1),
    kv_heads=st.integers(1, 3),
    group=st.integers(1, 4),
    n=st.integers(1, 6),
    past=st.integers(0, 9),
    batch=st.integers(1, 3),
)
def test_every_form_is_the_grouped_attention(seed, kv_heads, group, n, past, batch):
    rng = np.random.default_rng(seed)
    span, dim = past + n, 8
    query = torch.as_tensor(rng.normal(size=(batch, kv_heads * group, n, dim)))
    keys, values = (
        torch.as_tensor(rng.normal(size=(batch, kv_heads, span, dim))) for _ in range(2)
    )
    mask = torch.as_tensor(rng.random((batch, 1, n, span)) < 0.6)
    mask[..., 0] = True  # every query row attends somewhere
    expected = _naive(query, keys, values, mask)
    for form in (layers._grouped, layers._folded, layers._matmul):
        torch.testing.assert_close(
            form(query, keys, values, mask, 1 / np.sqrt(dim)), expected, rtol=1e-12, atol=1e-12
        )


def test_the_choice_is_measured_once_per_dtype_layout_query_class_and_rows_class(monkeypatch):
    calls = []
    monkeypatch.setattr(layers, "_CHOSEN", {})

    def fastest(candidates):
        calls.append((sorted(candidates), next(iter(candidates.values()))().shape))
        return "matmul"

    monkeypatch.setattr(layers, "fastest", fastest)

    def attend(n, heads=4, kv_heads=2, dtype=torch.float32, batch=1):
        query = torch.zeros(batch, heads, n, 8, dtype=dtype)
        keys = torch.zeros(batch, kv_heads, n + 3, 8, dtype=dtype)
        return layers.attend(query, keys, keys, torch.ones(batch, 1, n, n + 3, dtype=torch.bool))

    for n in (
        1,
        1,
        4,
        7,
        1,
        layers.MEASURED_QUERIES + 1,
    ):  # more new tokens (a prompt chunk): unmeasured
        assert attend(n).shape == (1, n, 32)
    assert attend(1, batch=3).shape == (3, 1, 32)
    attend(1, batch=2)  # the same rows class as 3
    attend(1, batch=4)
    attend(1, heads=2)  # one query head per key/value head: nothing to fold
    attend(2, dtype=torch.float64)
    assert [(names, shape[0], shape[2]) for names, shape in calls] == [
        (["folded", "grouped", "matmul"], 1, 1),
        (["folded", "grouped", "matmul"], 1, 4),
        (["folded", "grouped", "matmul"], 3, 1),
        (["folded", "grouped", "matmul"], 4, 1),
        (["grouped", "matmul"], 1, 1),
        (["folded", "grouped", "matmul"], 1, 2),
    ], "one query, several, rows 2-3, rows 4-7, no group, another dtype"
    assert layers.attention_choices() == {
        "float32 4/2 x 8, one query, 1 row": "matmul",
        "float32 4/2 x 8, several, 1 row": "matmul",
        "float32 4/2 x 8, one query, rows 2-3": "matmul",
        "float32 4/2 x 8, one query, rows 4-7": "matmul",
        "float32 2/2 x 8, one query, 1 row": "matmul",
        "float64 4/2 x 8, several, 1 row": "matmul",
    }


@pytest.mark.parametrize("form", ["grouped", "folded", "matmul"])
def test_float32_speculation_is_exact_with_each_form_forced(
    torch_float32_speculation, monkeypatch, form
):
    monkeypatch.setattr(layers, "_CHOSEN", {})
    monkeypatch.setattr(
        layers, "fastest", lambda candidates: form if form in candidates else "grouped"
    )
    spec, plain = torch_float32_speculation()
    assert spec == plain
    assert form in set(layers.attention_choices().values())
