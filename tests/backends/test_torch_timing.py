"""``specdec_torch.timing.fastest``: the default unless another formulation beats it by the
margin, then the fastest of those; timed on a fake clock, so the test does not depend on the
machine's speed."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

pytest.importorskip("torch")  # required when SPECDEC_TEST_BACKENDS names torch (conftest)

from specdec_torch import timing  # noqa: E402


class FakeClock:
    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def taking(self, seconds: float):
        def run():
            self.now += seconds

        return run


@pytest.mark.parametrize(
    "costs, chosen",
    [
        ({"default": 1.0, "a": 0.95, "b": 0.99}, "default"),  # within the margin: the default stays
        ({"default": 1.0, "a": 0.5, "b": 0.8}, "a"),
        (
            {"default": 1.0, "a": 0.8, "b": 0.5},
            "b",
        ),  # the fastest, not the first one under the margin
        ({"default": 1.0, "a": 2.0}, "default"),
        ({"default": 1.0}, "default"),
    ],
)
def test_fastest_keeps_the_default_unless_another_beats_it_by_the_margin(
    monkeypatch, costs, chosen
):
    clock = FakeClock()
    monkeypatch.setattr(
        timing, "time", SimpleNamespace(perf_counter=clock)
    )  # this module's clock only
    assert timing.fastest({name: clock.taking(cost) for name, cost in costs.items()}) == chosen


def test_second_is_faster_is_fastest_of_two(monkeypatch):
    clock = FakeClock()
    monkeypatch.setattr(
        timing, "time", SimpleNamespace(perf_counter=clock)
    )  # this module's clock only
    assert timing.second_is_faster(clock.taking(1.0), clock.taking(0.5))
    assert not timing.second_is_faster(clock.taking(1.0), clock.taking(0.95))


class Scripted:
    """A clock whose candidates take, call by call, the listed seconds (the warm-up first)."""

    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def taking(self, *seconds: float):
        left = list(seconds)

        def run():
            self.now += left.pop(0)

        return run


def test_fastest_judges_each_formulation_by_its_fastest_round(monkeypatch):
    """Other work only slows a round: a formulation whose rounds ran beside it three times in
    five is still chosen by what it costs when it runs alone (a median would keep the default)."""
    clock = Scripted()
    monkeypatch.setattr(timing, "time", SimpleNamespace(perf_counter=clock))
    default = clock.taking(1.0, 1.0, 1.0, 1.0, 1.0, 1.0)  # warm-up, then five rounds
    other = clock.taking(0.5, 0.5, 3.0, 3.0, 0.5, 3.0)  # three rounds slowed by other work
    assert timing.fastest({"default": default, "other": other}) == "other"
