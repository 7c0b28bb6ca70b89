"""Drafters built by name, kept with the loaded target for the next call that asks for the same.

``generate`` and ``stream`` resolve their drafter on every call. Built afresh each time, the
default ReDrafter on SmolLM2-135M cost 0.115 s a call (its weights placed and rounded to int8
where that is measured faster), about 5% of a 128-token answer's time on two cores, and a draft
model is a whole model loaded again. So a drafter built by name for a target is kept with it
(weakly: it goes with the target) under what made it: the backend, the registered factory
(compared by identity, so a registry with another plugin of that name builds its own), the
checkpoint and the time its files were last written (a head trained again into the same folder
is read again), and the options, the planned ones included. At most ``KEEP`` per target, the
least recently used dropped. A drafter object passed in is the caller's and is used as it is.

Reuse is what an ``Engine`` does with its drafter over all its requests: a stateful drafter is
told each request's end (``end``), after which its slot starts afresh (the conformance kit checks
it), so one object serves one generation after another.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

from specdec.decode.kept import KeptWithTarget

__all__ = ["KEEP", "built_drafter"]

KEEP = 4  # drafters kept per target

_kept = KeptWithTarget(KEEP)  # target -> {key: (factory, drafter)}


def _written(checkpoint: Path | None) -> float | None:
    """When the checkpoint's files were last written (None without one or where unreadable)."""
    if checkpoint is None:
        return None
    path = Path(checkpoint)
    try:
        files = [path] + (list(path.iterdir()) if path.is_dir() else [])
        return max(f.stat().st_mtime for f in files)
    except OSError:
        return None


def built_drafter(target, key: tuple, factory: Any, checkpoint, build: Callable[[], Any]):
    """The drafter ``build()`` makes, or the one it made before for ``target`` under ``key``
    (backend, name, options) with the same ``factory`` and ``checkpoint`` files (module
    docstring)."""
    full = (*key, None if checkpoint is None else str(checkpoint), _written(checkpoint))
    found = _kept.get(target, full)
    if found is not None and found[0] is factory:
        return found[1]
    drafter = build()
    _kept.put(target, full, (factory, drafter))
    return drafter
