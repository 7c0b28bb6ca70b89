"""Turn the first SIGINT / SIGTERM into a request the training loop answers by saving first."""

from __future__ import annotations

import contextlib
import signal
import threading
from typing import Iterator


@contextlib.contextmanager
def deferred_signals(signals=(signal.SIGINT, signal.SIGTERM)) -> Iterator[list[str]]:
    """Within the block, the first SIGINT or SIGTERM is recorded (its name appended to the yielded
    list) instead of acting; the loop checks the list, saves and stops. A second signal acts as
    usual (Ctrl-C twice stops at once). Outside the main thread, signals are left alone."""
    caught: list[str] = []
    if threading.current_thread() is not threading.main_thread():
        yield caught
        return
    previous = {sig: signal.getsignal(sig) for sig in signals}

    def record(signum, frame):
        caught.append(signal.Signals(signum).name)
        for sig, handler in previous.items():
            signal.signal(sig, handler)

    for sig in signals:
        signal.signal(sig, record)
    try:
        yield caught
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
