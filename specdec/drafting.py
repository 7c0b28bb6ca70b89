"""Drafters that need no weights and work on every backend."""

from __future__ import annotations

from specdec.types import Draft, DraftContext


class NoDrafter:
    """Plain decoding: the tree is the root alone, so each step verifies one token."""

    def propose(self, context: DraftContext) -> Draft:
        return Draft(root_tokens=context.root_tokens, beams=context.root_tokens[:, None, None])
