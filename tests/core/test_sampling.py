"""target_probs and sample_from against hand-computed values (specdec.reference.sampling)."""

from __future__ import annotations

import numpy as np
import pytest

from specdec.reference.sampling import greedy_tokens, sample_from, softmax, target_probs
from specdec.types import SamplingConfig

LOG = np.log


def check_probs(logits, sampling, expected):
    got = target_probs(np.asarray(logits, dtype=np.float64), sampling)
    np.testing.assert_allclose(
        got,
        expected,
        rtol=0,
        atol=1e-12,
        err_msg=f"target_probs(logits={logits}, {sampling}) != {expected}",
    )


def test_softmax_matches_hand_values_and_is_shift_invariant():
    logits = LOG([1.0, 2.0, 5.0])
    np.testing.assert_allclose(
        softmax(logits), [0.125, 0.25, 0.625], atol=1e-15, err_msg="softmax(log [1,2,5])"
    )
    np.testing.assert_allclose(
        softmax(logits + 1000.0),
        [0.125, 0.25, 0.625],
        atol=1e-15,
        err_msg="softmax(log [1,2,5] + 1000)",
    )


def test_greedy_is_one_hot_on_the_lowest_id_maximum():
    logits = np.array([[1.0, 3.0, 3.0, 0.0], [-np.inf, 2.0, 1.0, 2.0]])
    check_probs(logits, SamplingConfig(temperature=0.0), [[0, 1, 0, 0], [0, 1, 0, 0]])
    # top-k and top-p do not change the greedy choice
    check_probs(
        logits, SamplingConfig(temperature=0.0, top_k=3, top_p=0.5), [[0, 1, 0, 0], [0, 1, 0, 0]]
    )
    assert greedy_tokens(logits).tolist() == [1, 1], (
        f"greedy_tokens({logits.tolist()}) must break ties to the lowest id"
    )


def test_temperature_divides_the_logits():
    # logits / 2 = log [1, 2, 3]
    check_probs(
        2.0 * LOG([1.0, 2.0, 3.0]), SamplingConfig(temperature=2.0), np.array([1, 2, 3]) / 6
    )
    # logits / 0.5 = log [1, 4, 9]
    check_probs(LOG([1.0, 2.0, 3.0]), SamplingConfig(temperature=0.5), np.array([1, 4, 9]) / 14)


def test_top_k_keeps_k_tokens_and_breaks_ties_to_the_lower_id():
    check_probs(
        LOG([1.0, 2.0, 3.0, 4.0]), SamplingConfig(temperature=1.0, top_k=2), [0, 0, 3 / 7, 4 / 7]
    )
    check_probs(
        LOG([1.0, 3.0, 3.0, 2.0]), SamplingConfig(temperature=1.0, top_k=2), [0, 0.5, 0.5, 0]
    )
    check_probs(LOG([1.0, 3.0, 3.0, 2.0]), SamplingConfig(temperature=1.0, top_k=1), [0, 1, 0, 0])
    check_probs(
        LOG([3.0, 1.0, 3.0, 3.0]), SamplingConfig(temperature=1.0, top_k=2), [0.5, 0, 0.5, 0]
    )
    # top_k >= V keeps everything
    check_probs(LOG([1.0, 2.0, 1.0]), SamplingConfig(temperature=1.0, top_k=5), [0.25, 0.5, 0.25])


def test_top_p_keeps_the_smallest_prefix_reaching_the_mass():
    # sorted 0.4, 0.3, 0.2, 0.1: mass before 0.2 is 0.7 >= 0.6, so it is dropped
    check_probs(
        LOG([0.1, 0.4, 0.3, 0.2]), SamplingConfig(temperature=1.0, top_p=0.6), [0, 4 / 7, 3 / 7, 0]
    )
    # the top token is always kept
    check_probs(LOG([0.1, 0.4, 0.3, 0.2]), SamplingConfig(temperature=1.0, top_p=0.1), [0, 1, 0, 0])
    # equal probabilities: the lower id comes first in the sorted order
    check_probs(
        LOG([0.25, 0.25, 0.5]), SamplingConfig(temperature=1.0, top_p=0.6), [1 / 3, 0, 2 / 3]
    )
    check_probs(
        LOG([0.25, 0.25, 0.5]), SamplingConfig(temperature=1.0, top_p=1.0), [0.25, 0.25, 0.5]
    )


def test_temperature_then_top_k_then_top_p():
    # logits / 0.5 = log [1, 2, 3, 4]; top-3 -> [0, 2, 3, 4] / 9; top-p 0.5 keeps 4/9 and 3/9
    logits = 0.5 * LOG([1.0, 2.0, 3.0, 4.0])
    check_probs(logits, SamplingConfig(temperature=0.5, top_k=3), np.array([0, 2, 3, 4]) / 9)
    check_probs(logits, SamplingConfig(temperature=0.5, top_k=3, top_p=0.5), [0, 0, 3 / 7, 4 / 7])
    # top-k applies before top-p: with top-2 the mass is renormalised first, 4/7 > 0.5 keeps one
    # token
    check_probs(logits, SamplingConfig(temperature=0.5, top_k=2, top_p=0.5), [0, 0, 0, 1])


def test_target_probs_handles_minus_infinity_and_batch_shapes():
    check_probs([-np.inf, 0.0, 0.0], SamplingConfig(temperature=1.0), [0, 0.5, 0.5])
    check_probs([-np.inf, 0.0, 0.0], SamplingConfig(temperature=0.3, top_k=1), [0, 1, 0])
    logits = np.random.default_rng(0).normal(size=(2, 3, 5))
    probs = target_probs(logits, SamplingConfig(temperature=0.8, top_k=3, top_p=0.9))
    assert probs.shape == (2, 3, 5), f"target_probs kept shape (2, 3, 5)? got {probs.shape}"
    np.testing.assert_allclose(probs.sum(-1), 1.0, atol=1e-12, err_msg="target_probs rows sum to 1")
    for index in np.ndindex(2, 3):
        check_probs(
            logits[index], SamplingConfig(temperature=0.8, top_k=3, top_p=0.9), probs[index]
        )


@pytest.mark.parametrize(
    "probs, intervals",
    [
        # token: [cdf before, cdf) for tokens with mass; token 1 has none
        (
            [0.25, 0.0, 0.5, 0.125, 0.125],
            {0: (0.0, 0.25), 2: (0.25, 0.75), 3: (0.75, 0.875), 4: (0.875, 1.0)},
        ),
        ([0.0, 0.0, 1.0], {2: (0.0, 1.0)}),
        ([0.5, 0.5, 0.0, 0.0], {0: (0.0, 0.5), 1: (0.5, 1.0)}),
        # not normalised: the same intervals as [0.25, 0, 0.5, 0.25]
        ([1.0, 0.0, 2.0, 1.0], {0: (0.0, 0.25), 2: (0.25, 0.75), 3: (0.75, 1.0)}),
    ],
)
def test_sample_from_maps_each_cdf_interval_to_its_token(probs, intervals):
    grid = np.linspace(0.0, 1.0, 1025)[:-1]  # multiples of 1/1024: exact interval ends included
    grid = np.concatenate([grid, [np.nextafter(1.0, 0.0)]])
    for token, (low, high) in intervals.items():
        inside = grid[(grid >= low) & (grid < high)]
        got = sample_from(np.tile(probs, (len(inside), 1)), inside)
        assert np.all(got == token), (
            f"sample_from(probs={probs}, u in [{low}, {high})) must be {token}; "
            f"got {sorted(set(got.tolist()))} for u={inside[got != token][:3].tolist()}"
        )
    covered = sum(
        np.count_nonzero((grid >= low) & (grid < high)) for low, high in intervals.values()
    )
    assert covered == len(grid), f"intervals of {probs} cover [0, 1)"


def test_sample_from_never_returns_a_zero_probability_token():
    rng = np.random.default_rng(1)
    probs = rng.dirichlet(np.ones(6), size=200) * (rng.random((200, 6)) < 0.6)
    probs[probs.sum(-1) == 0, 0] = 1.0
    uniforms = np.concatenate([rng.random(200 - 3), [0.0, np.nextafter(1.0, 0.0), 0.5]])
    for u in (uniforms, np.zeros(200), np.full(200, np.nextafter(1.0, 0.0))):
        tokens = sample_from(probs, u)
        assert tokens.dtype == np.int64, f"sample_from returns int64, got {tokens.dtype}"
        chosen = probs[np.arange(200), tokens]
        assert np.all(chosen > 0), (
            "sample_from returned zero-probability tokens for rows "
            f"{np.flatnonzero(chosen == 0)[:5]}"
        )


def test_sample_from_keeps_batch_shape():
    probs = np.array([[[0.5, 0.5], [1.0, 0.0]], [[0.0, 1.0], [0.25, 0.75]]])
    tokens = sample_from(probs, np.array([[0.6, 0.9], [0.1, 0.2]]))
    assert tokens.tolist() == [[1, 0], [1, 0]], (
        f"sample_from on (2, 2, 2) probs gave {tokens.tolist()}"
    )
