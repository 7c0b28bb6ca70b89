"""What ``specdec.tuning.exactness.configure`` says when a target's self-test fails: the kernel in
words, what it means for the output and what to do."""

from __future__ import annotations

import warnings

import pytest

from specdec.errors import InvalidInputError, SpecdecError
from specdec.tuning.exactness import InvarianceCheck, configure


class _Target:
    """A target whose self-test fails at a small q/k/v projection."""

    exact = False

    def __init__(self, dtype: str):
        self.dtype = dtype

    def check_row_invariance(self) -> InvarianceCheck:
        return InvarianceCheck(holds=False, failed="q/k/v projection (64, 32)")


def test_exact_true_says_plainly_which_product_rounds_rows_differently_and_what_to_do():
    with pytest.raises(InvalidInputError) as raised:
        configure(_Target("float32"), True, backend="torch")
    message = str(raised.value)
    assert isinstance(raised.value, SpecdecError)
    assert (
        "exact=True, but the q/k/v projection (64 x 32) rounds a row differently when other rows "
        "share the call (on this machine, in float32)" in message
    ), message
    assert "could differ from plain decoding" in message and "exact=False" in message, message
    assert "other bits alone" not in message


def test_exact_mode_off_gives_the_same_words_in_its_reason_and_warning():
    target = _Target("bfloat16")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        outcome = configure(target, None, backend="torch")
    assert not outcome.on and target.exact is False
    assert outcome.reason == (
        "off: the q/k/v projection (64 x 32) rounds a row differently when other rows share the "
        "call (on this machine, in bfloat16)"
    )
    assert [str(w.message).split(", so ")[0] for w in caught] == [
        f"specdec: exact mode {outcome.reason}"
    ]
