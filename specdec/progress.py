"""Progress of a long measurement: a bar on a terminal, else a line at least every minute.

A log file or a pipe does not take a bar's carriage returns (each redraw would be a line of its
own, or junk), nor should a run sent there be silent for minutes; so where stderr is not a
terminal a line says, every ``LINE_SECONDS``, how far it is and how long the rest should take at
the pace so far: "bench: 12 of 48 runs done, 2.3 min, about 6.9 min left". A heartbeat thread
says it when no unit finishes within the minute (a tree plan's setting decoded on a busy machine
took four), so the lines come every minute whatever a unit costs. A caller that loads and warms
up before its first unit calls ``reset`` when the units begin, so the time left is paced by the
units alone (the minutes said so far still count from the start)."""

from __future__ import annotations

import sys
import threading
from time import monotonic
from typing import Iterable

from tqdm.auto import tqdm

__all__ = ["BEAT_SECONDS", "LINE_SECONDS", "progress"]

LINE_SECONDS = 60.0  # a line at most this often as units finish
BEAT_SECONDS = 60.0  # and one after this long without a line, whatever finished


class _Lines:
    """``tqdm``'s ``update`` / ``close`` / iteration, as lines on stderr."""

    def __init__(self, iterable, total: int | None, desc: str, unit: str, announce: bool):
        self.iterable, self.desc, self.unit = iterable, desc, unit
        self.total = len(iterable) if total is None and hasattr(iterable, "__len__") else total
        self.done, self.began = 0, monotonic()
        self.paced_from, self.done_then = self.began, 0  # where the time left is paced from
        self.said = self.began
        self._lock, self._closed = threading.Lock(), threading.Event()
        if announce:  # a stage whose first line would otherwise come a minute or more later
            count = f"{self.total} {unit}{'' if self.total == 1 else 's'}" if self.total else "?"
            print(f"{desc}: {count} to do", file=sys.stderr, flush=True)
        threading.Thread(target=self._beat, daemon=True, name="specdec-progress").start()

    def _beat(self) -> None:
        while not self._closed.wait(BEAT_SECONDS / 4):
            self._say_if_due(BEAT_SECONDS)

    def _say_if_due(self, after: float) -> None:
        with self._lock:
            now = monotonic()
            if now - self.said < after or self._closed.is_set():
                return
            self.said = now
            of = f" of {self.total}" if self.total else ""
            minutes, paced = (now - self.began) / 60, self.done - self.done_then
            pace = (now - self.paced_from) / 60 / max(paced, 1)
            left = (
                f", about {pace * (self.total - self.done):.1f} min left"
                if self.total and paced > 0 and self.done < self.total
                else ""
            )
            print(
                f"{self.desc}: {self.done}{of} {self.unit}s done, {minutes:.1f} min{left}",
                file=sys.stderr,
                flush=True,
            )

    def reset(self) -> None:
        """Pace the time left from now (loading and warm-up before the first unit made the first
        estimate 14 times too long); the time spent so far still counts from the start."""
        with self._lock:
            self.paced_from, self.done_then = monotonic(), self.done

    def update(self, n: int = 1) -> None:
        with self._lock:
            self.done += n
        self._say_if_due(LINE_SECONDS)

    def close(self) -> None:
        self._closed.set()

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __iter__(self):
        try:
            for item in self.iterable:
                yield item
                self.update(1)
        finally:
            self.close()


def progress(
    iterable: Iterable | None = None,
    *,
    total: int | None = None,
    desc: str,
    unit: str = "run",
    enabled: bool = True,
    announce: bool = False,
    bar: bool = True,
):
    """A progress bar (``tqdm``) where stderr is a terminal, lines otherwise; nothing when not
    ``enabled``. ``announce``: the lines begin with one saying how many units there are to do.
    ``bar=False``: lines on a terminal too (a measurement inside a library call, silent unless
    it outlasts a minute)."""
    if enabled and (not bar or not sys.stderr.isatty()):
        return _Lines(iterable if iterable is not None else (), total, desc, unit, announce)
    return tqdm(iterable, total=total, desc=desc, unit=unit, disable=not enabled)
