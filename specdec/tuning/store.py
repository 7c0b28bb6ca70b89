"""The tuning cache: measured choices kept as JSON files under ``<specdec cache>/tuning/``.

Everything kept here is a speed choice, never a correctness one: a missing, stale or damaged file
only costs a measurement (``read_entry`` returns None), and a read-only cache only costs one next
time (``write_entry`` gives up quietly). ``settled`` is the rule every cached measurement follows:
one taken while other work shared the cores (``specdec.tuning.machine.QUIET_SHARE``) is taken
again at later starts, ``MEASURES`` times in all at most, and the quietest decides.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from specdec.models.cache import cache_dir, cache_entry
from specdec.models.checkpoints import write_json_atomic
from specdec.models.files import read_json
from specdec.tuning.machine import QUIET_SHARE

__all__ = ["MEASURES", "digest", "read_entry", "settled", "tuning_dir", "write_entry"]

MEASURES = 3  # a measurement taken beside other work is taken this many times in all at most


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
    except OSError:
        pass  # a read-only cache only costs a measurement next time


def settled(cached: dict) -> bool:
    """Whether a cached measurement stands: its process had the cores (a share of at least
    ``QUIET_SHARE``; a file from before shares were recorded counts as quiet), or it has been
    taken ``MEASURES`` times already."""
    return (
        float(cached.get("share", 1.0)) >= QUIET_SHARE or int(cached.get("measures", 1)) >= MEASURES
    )
