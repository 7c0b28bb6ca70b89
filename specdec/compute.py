"""One thread for the array work of a process, for backends whose kernels want it.

PyTorch's CPU kernels run on OpenMP (GNU libgomp in the CPU wheels), which keeps a team of worker
threads for each thread that calls into it. Once two threads have done so (a target loaded and
tuned in the main thread, then served by an engine's scheduler thread; or ``specdec.generate`` in
one thread and an engine in another), the process holds more OpenMP threads than the machine has
cores, and libgomp then cuts its workers' spin-wait short: every parallel region wakes them
through the kernel instead. On a 2-core machine a one-token forward of SmolLM2-135M then took a
third longer, in both threads (``benchmarks/engine_overhead.py``; decision 0014).

So a backend that sets ``compute_thread = True`` (torch) has all of specdec's work on its arrays
done on one long-lived thread of the process: ``specdec.load``, the preparation of ``generate``
and ``stream`` (drafter loading included), every decode step, and an engine's steps. The caller's
thread waits for each piece; results and errors come back to it. Code that already runs on that
thread runs inline, so nothing waits on itself. ``$SPECDEC_COMPUTE_THREAD=0`` runs everything on
the calling thread instead (as before, e.g. to profile a step in the main thread).

A program that calls a target's methods itself (``target.forward_tree``) does so on its own
thread, as before; ``run`` gives it the same thread as specdec's.
"""

from __future__ import annotations

import os
import queue
import threading
from typing import Any, Callable, Iterator, TypeVar

__all__ = ["VARIABLE", "iterate", "on_compute_thread", "run", "run_for", "wanted"]

VARIABLE = "SPECDEC_COMPUTE_THREAD"
T = TypeVar("T")
_DONE = object()


class _Worker:
    """A daemon thread that runs submitted calls one at a time (a daemon: a program that is
    interrupted while a step runs still exits)."""

    def __init__(self):
        self.jobs: queue.SimpleQueue = queue.SimpleQueue()
        self.thread = threading.Thread(target=self._loop, name="specdec-compute", daemon=True)
        self.thread.start()

    def _loop(self) -> None:
        while True:
            job = self.jobs.get()
            job()


_lock = threading.Lock()
_worker: _Worker | None = None


def _get_worker() -> _Worker:
    global _worker
    with _lock:
        if _worker is None or not _worker.thread.is_alive():
            _worker = _Worker()
        return _worker


def on_compute_thread() -> bool:
    """Whether the calling thread is the compute thread."""
    worker = _worker
    return worker is not None and threading.current_thread() is worker.thread


def wanted(backend: Any) -> bool:
    """Whether ``backend``'s work goes to the compute thread: it asks for it (``compute_thread``)
    and ``$SPECDEC_COMPUTE_THREAD`` is not 0."""
    return (
        bool(getattr(backend, "compute_thread", False))
        and os.environ.get(VARIABLE, "").strip() != "0"
    )


def run(fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> T:
    """``fn(*args, **kwargs)`` on the compute thread (inline when already there, or when
    ``$SPECDEC_COMPUTE_THREAD`` is 0); returns its result or raises its error."""
    if on_compute_thread() or os.environ.get(VARIABLE, "").strip() == "0":
        return fn(*args, **kwargs)
    done = threading.Event()
    box: list = []

    def job() -> None:
        try:
            box.append((True, fn(*args, **kwargs)))
        except BaseException as error:  # noqa: BLE001 - raised again in the caller's thread
            box.append((False, error))
        finally:
            done.set()

    _get_worker().jobs.put(job)
    done.wait()
    ok, value = box[0]
    if ok:
        return value
    raise value


def run_for(backend: Any, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> T:
    """``run`` where ``backend`` wants the compute thread, else ``fn`` inline."""
    return run(fn, *args, **kwargs) if wanted(backend) else fn(*args, **kwargs)


def iterate(backend: Any, items: Iterator[T]) -> Iterator[T]:
    """``items``, each one computed on the compute thread where ``backend`` wants it (a generator
    resumed there step by step); closing this closes ``items`` there too."""
    if not wanted(backend):
        yield from items
        return
    try:
        while True:
            item = run(next, items, _DONE)
            if item is _DONE:
                return
            yield item
    finally:
        run(items.close)
