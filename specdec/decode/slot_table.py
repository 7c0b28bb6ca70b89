"""``SlotTable``: where each request of a ``specdec.decode.loop.Decoder`` is.

A request is waiting (queued, no slot), prefilling (it holds a slot and its prompt is going in
over one or more steps: the cursor is how many prompt tokens the cache holds) or decoding (its
prompt is in; a stateful drafter's ``begin`` ran). Free slots are taken lowest first. The table
only keeps the books: the decoder does the work (forwards, the drafter's ``begin`` and ``end``,
the target's ``release``) and tells the table what happened.
"""

from __future__ import annotations

import heapq
import itertools
from collections import deque

import attrs

from specdec.decode.requests import Request, RequestState

__all__ = ["SlotTable"]


@attrs.define
class SlotTable:
    """waiting: (request id, Request) in arrival order; active: slot -> (request id, state);
    cursor: slot -> prompt tokens in the cache, for the slots still prefilling; free: a heap of
    free slots."""

    waiting: deque = attrs.field(factory=deque)
    active: dict = attrs.field(factory=dict)
    cursor: dict = attrs.field(factory=dict)
    free: list = attrs.field(factory=list)
    _ids: itertools.count = attrs.field(factory=itertools.count)

    @classmethod
    def of(cls, num_slots: int) -> "SlotTable":
        return cls(free=list(range(int(num_slots))))

    @property
    def idle(self) -> bool:
        return not self.waiting and not self.active

    def counts(self) -> tuple[int, int]:
        """(waiting, holding a slot): single reads, safe from another thread."""
        return len(self.waiting), len(self.active)

    def queue(self, request: Request) -> int:
        """Queue ``request``; its id (0, 1, ... in arrival order)."""
        request_id = next(self._ids)
        self.waiting.append((request_id, request))
        return request_id

    def unqueue(self, request_id: int) -> bool:
        """Take a waiting request out of the queue; False when it is not waiting."""
        for item in self.waiting:
            if item[0] == request_id:
                self.waiting.remove(item)
                return True
        return False

    def seat(self, request_id: int, request: Request, *, prefilling: bool) -> RequestState:
        """Give the request (already out of the queue) the lowest free slot; ``prefilling``: its
        prompt goes in by chunks from the next step on (else it is in already)."""
        slot = heapq.heappop(self.free)
        state = RequestState(request, slot)
        self.active[slot] = (request_id, state)
        if prefilling:
            self.cursor[slot] = 0
        return state

    def unseat(self, slot: int) -> tuple[int, bool]:
        """Free ``slot``: (its request's id, whether that request had begun)."""
        began = self.began(slot)
        request_id, _ = self.active.pop(slot)
        self.cursor.pop(slot, None)
        heapq.heappush(self.free, slot)
        return request_id, began

    def slot_of(self, request_id: int) -> int | None:
        return next((s for s, (rid, _) in self.active.items() if rid == request_id), None)

    def began(self, slot: int) -> bool:
        """The request in ``slot`` has its prompt in, so a stateful drafter's ``begin`` ran."""
        return slot in self.active and slot not in self.cursor

    def decoding(self) -> list[int]:
        """The slots whose requests are decoding (their prompts in), ascending."""
        return [slot for slot in sorted(self.active) if slot not in self.cursor]

    def has_prompts(self) -> bool:
        """Prompts to put in this step: a waiting request and a free slot, or a prefill going."""
        return bool((self.waiting and self.free) or self.cursor)

    def queued_prompts(self) -> int:
        """Prompts that could go in this step: those prefilling and those a free slot takes."""
        return len(self.cursor) + min(len(self.waiting), len(self.free))
