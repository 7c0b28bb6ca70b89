"""The learning-rate schedule of ``specdec train``, and a resumed run whose budget grew: the rest
of the budget decays from the rate the run stopped at, instead of climbing back up the longer
schedule (which undid a finished run's last minutes)."""

from __future__ import annotations

import math

import pytest

pytest.importorskip("torch")

from specdec.training.loop import TrainSettings, learning_rate, resumed_segment  # noqa: E402


def test_the_schedule_warms_up_then_decays_to_its_floor():
    settings = TrainSettings(steps=100, lr=1e-3, warmup=0.1, final_lr=0.1)
    assert learning_rate(settings, 0.05) == pytest.approx(5e-4)
    assert learning_rate(settings, 0.1) == pytest.approx(1e-3)
    assert learning_rate(settings, 1.0) == pytest.approx(1e-4)


def test_a_resumed_run_whose_budget_grew_keeps_decaying():
    first = TrainSettings(minutes=30, lr=1e-3, warmup=0.05, final_lr=0.1)
    stopped = learning_rate(first, 1.0)  # the run ended its 30 minutes at the floor
    longer = TrainSettings(minutes=120, lr=1e-3, warmup=0.05, final_lr=0.1)
    state = {"step": 1000, "train_seconds": 30 * 60.0}
    assert learning_rate(longer, 0.25) > 5 * stopped  # the longer schedule alone climbs back
    segment = resumed_segment(longer, state, stopped)
    assert segment == (pytest.approx(0.25), pytest.approx(stopped))
    rates = [learning_rate(longer, p, segment) for p in (0.25, 0.5, 0.75, 1.0)]
    assert rates[0] == pytest.approx(stopped) and rates[-1] == pytest.approx(1e-4)
    assert all(a >= b for a, b in zip(rates, rates[1:]))  # never up again
    # a run resumed mid-schedule with the same budget follows its schedule as it was
    mid = {"step": 10, "train_seconds": 15 * 60.0}
    assert resumed_segment(first, mid, learning_rate(first, 0.5)) is None
    assert not math.isnan(learning_rate(longer, 1.0, segment))
