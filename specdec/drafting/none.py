"""Drafters that need no weights and work on every backend."""

from __future__ import annotations

from specdec.capabilities import DrafterCaps, request_end
from specdec.types import Draft, DraftContext


class NoDrafter:
    """Plain decoding: the tree is the root alone, so each step verifies one token."""

    caps = DrafterCaps(max_tree_size=1)

    def propose(self, context: DraftContext) -> Draft:
        return Draft(root_tokens=context.root_tokens, beams=context.root_tokens[:, None, None])


class PassLifecycle:
    """For drafters that wrap another (``self.inner``, ``self.caps``): the request lifecycle of a
    stateful inner drafter is passed on to it (``end``'s reason only to an ``end`` that takes
    one)."""

    _inner_end = None  # the inner drafter's end(slot, reason), made at the first end

    def begin(self, slot, prompt, output) -> None:
        if self.caps.stateful:
            self.inner.begin(slot, prompt, output)

    def observe(self, accepted) -> None:
        if self.caps.stateful:
            self.inner.observe(accepted)

    def end(self, slot, reason) -> None:
        if self.caps.stateful:
            if self._inner_end is None:
                self._inner_end = request_end(self.inner)
            self._inner_end(slot, reason)
