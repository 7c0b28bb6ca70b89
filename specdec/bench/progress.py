"""Progress of a long measurement: a bar on a terminal, else a line at least every minute.

A log file or a pipe does not take a bar's carriage returns (each redraw would be a line of its
own, or junk), nor should a run sent there be silent for minutes; so where stderr is not a
terminal each ``update`` says, at most every ``LINE_SECONDS``, how far it is: "bench: 12 of 48
runs done, 2.3 min"."""

from __future__ import annotations

import sys
import time
from typing import Iterable

from tqdm.auto import tqdm

__all__ = ["LINE_SECONDS", "progress"]

LINE_SECONDS = 60.0


class _Lines:
    """``tqdm``'s ``update`` / ``close`` / iteration, as lines on stderr."""

    def __init__(self, iterable, total: int | None, desc: str, unit: str, announce: bool):
        self.iterable, self.desc, self.unit = iterable, desc, unit
        self.total = len(iterable) if total is None and hasattr(iterable, "__len__") else total
        self.done, self.began = 0, time.monotonic()
        self.said = self.began
        if announce:  # a stage whose first line would otherwise come a minute or more later
            count = f"{self.total} {unit}{'' if self.total == 1 else 's'}" if self.total else "?"
            print(f"{desc}: {count} to do", file=sys.stderr, flush=True)

    def update(self, n: int = 1) -> None:
        self.done += n
        now = time.monotonic()
        if now - self.said >= LINE_SECONDS:
            self.said = now
            of = f" of {self.total}" if self.total else ""
            minutes = (now - self.began) / 60
            print(
                f"{self.desc}: {self.done}{of} {self.unit}s done, {minutes:.1f} min",
                file=sys.stderr,
                flush=True,
            )

    def close(self) -> None:
        pass

    def __iter__(self):
        for item in self.iterable:
            yield item
            self.update(1)


def progress(
    iterable: Iterable | None = None,
    *,
    total: int | None = None,
    desc: str,
    unit: str = "run",
    enabled: bool = True,
    announce: bool = False,
):
    """A progress bar (``tqdm``) where stderr is a terminal, lines otherwise; nothing when not
    ``enabled``. ``announce``: the lines begin with one saying how many units there are to do."""
    if enabled and not sys.stderr.isatty():
        return _Lines(iterable if iterable is not None else (), total, desc, unit, announce)
    return tqdm(iterable, total=total, desc=desc, unit=unit, disable=not enabled)
