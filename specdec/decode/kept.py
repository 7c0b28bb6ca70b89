"""Values kept with a loaded target for later generations on it: what "auto" learnt
(``specdec.decode.memory``) and the drafters built by name (``specdec.generation.built``)."""

from __future__ import annotations

import threading
import weakref
from typing import Any, Hashable

__all__ = ["KeptWithTarget"]


class KeptWithTarget:
    """Values under keys, per target, held weakly with it (they go when it goes); at most
    ``limit`` per target, the least recently used dropped first; safe across threads. A target
    that cannot be referred to weakly, or a key that cannot be hashed, keeps nothing."""

    def __init__(self, limit: int):
        self.limit = int(limit)
        self._guard = threading.Lock()
        self._kept: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()

    def get(self, target: Any, key: Hashable) -> Any:
        """The value kept for ``target`` under ``key`` (now the most recently used), or None."""
        with self._guard:
            try:
                kept = self._kept.get(target)
                if kept is None or key not in kept:
                    return None
            except TypeError:
                return None
            kept[key] = kept.pop(key)
            return kept[key]

    def put(self, target: Any, key: Hashable, value: Any) -> None:
        """Keep ``value`` for ``target`` under ``key``, the most recently used."""
        with self._guard:
            try:
                kept = self._kept.setdefault(target, {})
                kept.pop(key, None)
                kept[key] = value
            except TypeError:
                return
            while len(kept) > self.limit:
                del kept[next(iter(kept))]
