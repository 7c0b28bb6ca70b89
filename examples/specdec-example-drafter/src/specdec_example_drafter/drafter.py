"""The n-gram drafter: if the row's last ``ngram`` tokens occurred earlier in its text (prompt and
output), propose the tokens that followed them, one beam per earlier occurrence, most recent first.

It is written once for every backend: it reads the row texts (``DraftContext.history``, NumPy on
the host), builds its beams in NumPy and hands them to the backend with ``backend.from_numpy``.
"""

from __future__ import annotations

import numpy as np
import specdec


class NgramDrafter:
    """specdec.protocols.Drafter: beams (B, beam_width, beam_length), root included."""

    caps = specdec.DrafterCaps()  # beams for the prefix tree, nothing drawn, no per-request state

    def __init__(
        self, backend, target, *, ngram: int = 2, beam_width: int = 2, beam_length: int = 5
    ):
        for name, value, least in (
            ("ngram", ngram, 1),
            ("beam_width", beam_width, 1),
            ("beam_length", beam_length, 2),
        ):
            if not isinstance(value, int) or isinstance(value, bool) or value < least:
                raise specdec.InvalidInputError(
                    f"drafter 'ngram': {name} must be an integer >= {least}, got {value!r}"
                )
        self.backend, self.target = backend, target
        self.ngram, self.beam_width, self.beam_length = ngram, beam_width, beam_length

    def continuations(self, text: np.ndarray) -> list[np.ndarray]:
        """Up to beam_width different continuations of ``text`` (T,), most recent occurrence
        first."""
        n, found = self.ngram, []
        if len(text) <= n:
            return found
        windows = np.lib.stride_tricks.sliding_window_view(
            text[:-1], n
        )  # earlier n-grams, each followed by a token
        for start in np.flatnonzero((windows == text[-n:]).all(axis=1))[::-1]:
            follow = text[start + n : start + n + self.beam_length - 1]
            if not any(np.array_equal(follow, seen) for seen in found):
                found.append(follow)
            if len(found) == self.beam_width:
                break
        return found

    def step_kind(self, history: np.ndarray) -> int:
        """Optional (``specdec.protocols.StepKinds``): 1 where the row's text has a continuation
        to propose, else 0. ``speculation="auto"`` learns the two kinds' acceptance apart, so it
        stops paying for trees in steps where this drafter proposes nothing."""
        return int(bool(self.continuations(np.asarray(history))))

    def propose(self, context: specdec.DraftContext) -> specdec.Draft:
        roots = self.backend.to_numpy(context.root_tokens).astype(np.int64)  # (B,)
        beams = np.repeat(roots[:, None, None], self.beam_width * self.beam_length, axis=2)
        beams = beams.reshape(len(roots), self.beam_width, self.beam_length)
        # Each beam ends where its continuation does (a continuation near the end of the text is
        # short; a beam without one is the root alone): Draft.beam_lengths, on the host. What lies
        # past a beam's length (the root repeated here) is padding that no tree builder reads.
        lengths = np.ones((len(roots), self.beam_width), dtype=np.int64)
        for b, text in enumerate(context.history or ()):
            for i, follow in enumerate(self.continuations(np.asarray(text))):
                beams[b, i, 1 : 1 + len(follow)] = follow
                lengths[b, i] = 1 + len(follow)
        return specdec.Draft(
            root_tokens=context.root_tokens,
            beams=self.backend.from_numpy(beams, self.target),
            beam_lengths=lengths,
        )
