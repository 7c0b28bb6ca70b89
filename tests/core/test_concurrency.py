"""One loaded target, two generations at once: the second fails at once, never mixes output."""

from __future__ import annotations

import threading

import pytest

import specdec
from specdec.decode import lease


def test_interleaved_streams_fail_at_once_and_never_mix(target):
    alone = specdec.generate(
        target, [5, 6, 7], drafter="none", backend="numpy", max_new_tokens=6
    ).tokens
    first = specdec.stream(target, [5, 6, 7], drafter="none", backend="numpy", max_new_tokens=6)
    second = specdec.stream(target, [9, 1, 2, 3], drafter="none", backend="numpy", max_new_tokens=6)
    tokens = list(next(first).new_tokens[0])
    with pytest.raises(
        specdec.TargetBusyError, match="busy.*close\\(\\) the first stream.*second target"
    ):
        next(second)
    tokens += [t for step in first for t in step.new_tokens[0]]
    assert tokens == alone  # the refused stream left the first one's cache untouched
    assert not lease.is_busy(target)


def test_closed_or_dropped_stream_releases_the_target(target):
    expected = specdec.generate(
        target, [4, 4], drafter="none", backend="numpy", max_new_tokens=3
    ).tokens
    steps = specdec.stream(target, [1, 2], drafter="none", backend="numpy", max_new_tokens=8)
    next(steps)
    assert lease.is_busy(target)
    steps.close()
    assert (
        specdec.generate(target, [4, 4], drafter="none", backend="numpy", max_new_tokens=3).tokens
        == expected
    )
    steps = specdec.stream(target, [1, 2], drafter="none", backend="numpy", max_new_tokens=8)
    next(steps)
    del steps  # garbage-collected mid-generation
    assert (
        specdec.generate(target, [4, 4], drafter="none", backend="numpy", max_new_tokens=3).tokens
        == expected
    )


def test_a_failing_generation_releases_the_target(target):
    with pytest.raises(specdec.InvalidInputError):
        specdec.generate(target, [1, 10_000], drafter="none", backend="numpy")
    assert not lease.is_busy(target)


def test_threads_on_one_target_get_a_clear_error_or_the_right_tokens(target):
    prompts = [[3, 4, 5], [7, 8], [1, 2, 3, 4], [6]]
    expected = [
        specdec.generate(target, p, drafter="none", backend="numpy", max_new_tokens=5).tokens
        for p in prompts
    ]
    holding, release = threading.Event(), threading.Event()
    outcomes: dict[int, object] = {}

    def hold():  # a stream paused mid-generation on another thread
        steps = specdec.stream(
            target, prompts[0], drafter="none", backend="numpy", max_new_tokens=5
        )
        tokens = list(next(steps).new_tokens[0])
        holding.set()
        release.wait(10)
        outcomes[0] = tokens + [t for step in steps for t in step.new_tokens[0]]

    def run(i):
        try:
            outcomes[i] = specdec.generate(
                target, prompts[i], drafter="none", backend="numpy", max_new_tokens=5
            ).tokens
        except specdec.TargetBusyError as exc:
            outcomes[i] = exc

    holder = threading.Thread(target=hold)
    holder.start()
    assert holding.wait(10)
    others = [threading.Thread(target=run, args=(i,)) for i in (1, 2, 3)]
    for thread in others:
        thread.start()
    for thread in others:
        thread.join(10)
    release.set()
    holder.join(10)
    assert outcomes[0] == expected[0]
    assert all(isinstance(outcomes[i], specdec.TargetBusyError) for i in (1, 2, 3)), outcomes
    threads = [
        threading.Thread(target=run, args=(i,)) for i in (1, 2, 3)
    ]  # one after another, all succeed
    for thread in threads:
        thread.start()
        thread.join(10)
    assert [outcomes[i] for i in (1, 2, 3)] == expected[1:]
