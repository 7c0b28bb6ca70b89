"""The tuning cache: measured choices kept as JSON files under ``<specdec cache>/tuning/``.

Everything kept here is a speed choice, never a correctness one: a missing, stale or damaged file
only costs a measurement (``read_entry`` returns None), and a read-only cache only costs one next
time (``write_entry`` gives up quietly). ``settled`` is the rule every cached measurement follows:
one taken while other work shared the cores (``specdec.tuning.machine.QUIET_SHARE``) is taken
again at a later start of the process that finds the machine quiet (``quiet_now``, a probe of a
fraction of a second), and the quieter of the two decides: a machine busy at its first start is
measured right once it is free, and one busy at every start pays the probe, not the measurement
(measuring again at busy starts cost up to a minute per start and gave another busy figure).
Within one process a file written is not measured again (``write_entry`` remembers it).
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path
from typing import Any

from specdec.models.cache import cache_dir, cache_entry
from specdec.models.checkpoints import write_json_atomic
from specdec.models.files import read_json
from specdec.tuning import machine
from specdec.tuning.machine import QUIET_SHARE, busy_cores, cores

__all__ = [
    "digest",
    "forget_this_process",
    "quiet_now",
    "say_measuring",
    "read_entry",
    "settled",
    "tuning_dir",
    "write_entry",
]

PROBE_SECONDS = 0.3  # how long ``quiet_now`` watches the machine
_WRITTEN_HERE: set[str] = set()  # the files this process wrote (measured)
_QUIET_NOW: list[bool] = []  # the probe's answer, once per process


def digest(value: Any) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True, default=str).encode()).hexdigest()[:20]


def tuning_dir() -> Path:
    return cache_dir() / "tuning"


def read_entry(file: Path) -> dict | None:
    try:
        return read_json(file, what="tuning cache file")
    except (OSError, ValueError):  # CorruptFileError included
        return None  # absent or damaged: measure again


def write_entry(file: Path, value: dict) -> None:
    try:
        if file.parent == tuning_dir():
            cache_entry("tuning")
        file.parent.mkdir(parents=True, exist_ok=True)
        write_json_atomic(file, value)
        _WRITTEN_HERE.add(str(file))
    except OSError:
        pass  # a read-only cache only costs a measurement next time


def settled(cached: dict, file: Path | None = None) -> bool:
    """Whether a cached measurement stands: its process had the cores (a share of at least
    ``QUIET_SHARE``; a file from before shares were recorded counts as quiet), this process
    measured it (``file``: not taken again within one process), or the machine is busy now
    (``quiet_now``: measuring again would give another busy figure)."""
    if float(cached.get("share", 1.0)) >= QUIET_SHARE:
        return True
    if file is not None and str(file) in _WRITTEN_HERE:
        return True
    return not quiet_now()


def quiet_now() -> bool:
    """Whether other work leaves the cores free now: what the machine computed over
    ``PROBE_SECONDS`` while this process waited, probed once per process (False where the system
    does not say)."""
    if not _QUIET_NOW:
        busy = busy_cores(PROBE_SECONDS)
        seen = machine.steady_reading()  # the threads' probe at this start: one word for both
        if busy is not None and seen is not None:  # ("1.0 of 2 cores busy elsewhere", then
            busy = max(busy, seen)  # "measuring again: the machine is quiet now")
        _QUIET_NOW.append(busy is not None and busy <= (1 - QUIET_SHARE) * cores())
    return _QUIET_NOW[0]


def forget_this_process() -> None:
    """Act as a new start: measurements this process took are again open to being taken anew,
    and the machine's load is probed again."""
    _WRITTEN_HERE.clear()
    _QUIET_NOW.clear()
    machine.forget_steady_reading()


_SAID_BUSY: set[str] = set()  # the cached measurements whose busy line this process printed


def say_if_busy(file, share: float, line: str, **fields) -> None:
    """``line`` on stderr, once per process and cached measurement (``file``), where it was taken
    while other work held more of the cores than ``QUIET_SHARE`` leaves (``{busy}`` in ``line``:
    the share other work held; ``fields``: its other names). The step costs say so (auto drafted
    in 2 of 15 steps on such a curve with no word), and the dtype choice (a busy first load chose
    bfloat16 on an AVX2-only CPU, where quiet timings choose float32)."""
    if share >= QUIET_SHARE or str(file) in _SAID_BUSY:
        return
    _SAID_BUSY.add(str(file))
    print(line.format(busy=f"{1 - share:.0%}", **fields), file=sys.stderr, flush=True)


def say_measuring(what: str, *, again: dict | None = None) -> None:
    """One line on stderr as a measurement of ``what`` starts (seconds to a minute, once per
    machine, model and shape measured; one taken on a busy machine is taken again at a later
    start that finds it quiet): whoever waits sees why the call is slow. Said on a terminal only
    before, so a notebook or a script's log showed calls of 17-36 s with no word. ``again``: the
    cached entry being measured anew because it was taken beside other work (``settled``), which
    the line says, so that it does not read as a cache that does not work."""
    why = ""
    if again:
        share = float(again.get("share", 1.0))
        why = (
            f" again: other work held {1 - share:.0%} of the cores when it was measured, "
            "and the machine is quiet now"
        )
    print(
        f"specdec: measuring {what} on this machine{why} (kept for later runs)",
        file=sys.stderr,
        flush=True,
    )
