"""One generation at a time per loaded target.

A target holds one KV cache, so two generations that interleave on it (two streams, two
threads) would mix each other's state and return wrong tokens without a word. The decode loop
therefore takes a non-blocking lease on the target for the whole generation: a second
generation on a busy target fails at once with ``TargetBusyError``, before it touches the
cache. The lease is released when the generation ends, raises, or its stream is closed or
garbage-collected. This lives in the core, so every backend gets it.
"""

from __future__ import annotations

import contextlib
import threading
from typing import Any, Iterator

from specdec.errors import TargetBusyError

_guard = threading.Lock()
# the ids of the leased targets (a target is alive while leased: its generation refers to it)
_holders: set[int] = set()


def acquire(target: Any) -> None:
    """Lease ``target`` for one generation, or raise TargetBusyError if it is in use. (Every
    generation runs on specdec's compute thread, so which thread asked says nothing to the caller:
    the message names the target and the ways a generation stays running.)"""
    with _guard:
        if id(target) in _holders:
            raise TargetBusyError(
                f"this target ({getattr(target, 'name', None) or type(target).__name__}) is busy: "
                "an earlier generation on it is still running (a stream not yet exhausted or "
                "closed, or a generate call from another thread); a target serves one generation "
                "at a time. Finish or close() the first stream, or load a second target with "
                "specdec.load(...) for concurrent use"
            )
        _holders.add(id(target))


def release(target: Any) -> None:
    with _guard:
        _holders.discard(id(target))


def is_busy(target: Any) -> bool:
    with _guard:
        return id(target) in _holders


@contextlib.contextmanager
def leased(target: Any) -> Iterator[None]:
    """Hold the lease on ``target`` for the ``with`` block."""
    acquire(target)
    try:
        yield
    finally:
        release(target)
