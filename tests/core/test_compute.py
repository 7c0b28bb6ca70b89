"""specdec.compute: one thread for a process's array work, for backends that ask for it."""

from __future__ import annotations

import threading

import pytest

import specdec
from specdec import compute


def test_run_returns_the_result_and_runs_on_the_compute_thread():
    assert compute.run(lambda a, b=0: (a + b, threading.current_thread().name), 2, b=3) == (
        5,
        "specdec-compute",
    )


def test_run_raises_the_error_in_the_callers_thread():
    def fail():
        raise KeyError("boom")

    with pytest.raises(KeyError, match="boom"):
        compute.run(fail)
    assert compute.run(lambda: 1) == 1  # the thread goes on after an error


def test_nested_run_is_inline():
    def outer():
        return compute.run(lambda: threading.current_thread().name), compute.on_compute_thread()

    assert compute.run(outer) == ("specdec-compute", True)
    assert not compute.on_compute_thread()


def test_the_variable_turns_it_off(monkeypatch):
    monkeypatch.setenv(compute.VARIABLE, "0")
    assert compute.run(lambda: threading.current_thread()) is threading.current_thread()


class _Wants:
    compute_thread = True


def test_iterate_resumes_the_generator_on_the_compute_thread_and_closes_it_there():
    seen, closed = [], []

    def items():
        try:
            for i in range(5):
                seen.append(threading.current_thread().name)
                yield i
        finally:
            closed.append(threading.current_thread().name)

    out = compute.iterate(_Wants(), items())
    assert [next(out), next(out)] == [0, 1]
    out.close()
    assert seen == ["specdec-compute"] * 2 and closed == ["specdec-compute"]
    assert list(compute.iterate(_Wants(), items())) == [0, 1, 2, 3, 4]


def test_a_backend_that_does_not_ask_stays_on_the_callers_thread(model_dir):
    names = []

    def record(items):
        for item in items:
            names.append(threading.current_thread().name)
            yield item

    assert not compute.wanted(object())
    assert list(compute.iterate(object(), record(iter(range(3))))) == [0, 1, 2]
    assert names == [threading.current_thread().name] * 3
    result = specdec.generate(
        model_dir, [1, 2, 3], drafter="none", backend="numpy", max_new_tokens=4
    )
    assert len(result.tokens) == 4


def test_torch_steps_run_on_the_compute_thread(model_dir, monkeypatch):
    pytest.importorskip("torch")  # required when SPECDEC_TEST_BACKENDS names torch (conftest)
    from specdec.serving.engine import Engine
    from specdec_torch.target import TorchTarget

    names = []
    forward = TorchTarget.forward_tree

    def recording(self, *args, **kwargs):
        names.append(threading.current_thread().name)
        return forward(self, *args, **kwargs)

    monkeypatch.setattr(TorchTarget, "forward_tree", recording)
    target = specdec.load(model_dir, backend="torch", dtype="float32", slots=2)
    plain = specdec.generate(
        target, [1, 2, 3], drafter="none", backend="torch", max_new_tokens=6
    ).tokens
    streamed = [
        t
        for step in specdec.stream(
            target, [1, 2, 3], drafter="none", backend="torch", max_new_tokens=6
        )
        for t in step.new_tokens[0]
    ]
    with Engine(target, drafter="none", backend="torch") as engine:
        served = engine.generate([1, 2, 3], max_new_tokens=6, ignore_eos=True).tokens
    assert list(streamed) == list(plain) == list(served)[: len(plain)]
    assert names and set(names) == {"specdec-compute"}
