"""Torch's threads fitted to the free cores: lowered (with a line saying so) where other
processes keep cores busy, left where the user chose a count or the cores are free."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")  # required when SPECDEC_TEST_BACKENDS names torch (conftest)

from specdec_torch import threads  # noqa: E402


@pytest.fixture
def fresh(monkeypatch):
    """fit_threads as in a new process on a 2-core machine whose torch uses 2 threads; the
    process's thread count is put back afterwards."""
    before = torch.get_num_threads()
    monkeypatch.setattr(threads, "_fitted", False)
    monkeypatch.setattr(threads, "cores", lambda: 2)
    monkeypatch.delenv(threads.VARIABLE, raising=False)
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(before)


def test_a_busy_core_leaves_torch_one_thread_and_says_so(fresh, capsys):
    assert threads.fit_threads(measure=lambda: 0.97) == 1
    assert torch.get_num_threads() == 1
    line = capsys.readouterr().err
    assert "1.0 of 2 cores busy" in line and "1 thread, not 2" in line
    assert len(line) < 100  # one short line: it comes with most commands on a shared machine
    assert "OMP_NUM_THREADS" in line
    assert threads.fit_threads(measure=lambda: 0.0) is None  # once per process


@pytest.mark.parametrize("busy", [0.0, 0.4, None])
def test_free_cores_or_no_reading_leave_the_count(fresh, capsys, busy):
    assert threads.fit_threads(measure=lambda: busy) is None
    assert torch.get_num_threads() == 2
    assert capsys.readouterr().err == ""


def test_a_count_the_user_chose_is_left_with_a_line_where_cores_are_busy(
    fresh, monkeypatch, capsys
):
    """OMP_NUM_THREADS=2 beside a busy core made every call 4x slower with no word."""
    monkeypatch.setenv(threads.VARIABLE, "2")
    assert threads.fit_threads(measure=lambda: 1.0) is None
    line = capsys.readouterr().err
    assert torch.get_num_threads() == 2
    assert "1.0 of 2 cores busy elsewhere, and OMP_NUM_THREADS=2 asks for 2 threads" in line
    assert "OMP_NUM_THREADS=1 or unset fits them" in line


@pytest.mark.parametrize("busy", [0.0, None])
def test_a_count_the_user_chose_on_free_cores_is_left_quietly(fresh, monkeypatch, capsys, busy):
    monkeypatch.setenv(threads.VARIABLE, "2")
    assert threads.fit_threads(measure=lambda: busy) is None
    assert torch.get_num_threads() == 2 and capsys.readouterr().err == ""
