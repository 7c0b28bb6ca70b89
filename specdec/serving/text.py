"""Text of a stream of tokens: incremental detokenization and stop strings.

``IncrementalText`` turns tokens into text as they arrive without re-decoding everything: it
decodes a short window of recent tokens twice (without and with the new ones) and keeps the
difference, so tokenizers that strip a leading space or merge bytes across tokens give the same
text as decoding the whole sequence at once. Text that ends in an incomplete UTF-8 character
(U+FFFD) is held back until the next token completes it.

``StopStrings`` cuts the text at the first stop string, which the returned text never includes,
and holds back a tail that could still become a stop string, so streamed text is never taken back.
"""

from __future__ import annotations

from typing import Sequence

PROMPT_CONTEXT = 5  # prompt tokens decoded with the first new tokens, for the spacing between them


class IncrementalText:
    """Text of the tokens added so far; ``add`` returns what they add to it."""

    def __init__(self, tokenizer, prompt: Sequence[int] = ()):
        self.tokenizer = tokenizer
        self._tokens = [int(t) for t in list(prompt)[-PROMPT_CONTEXT:]]
        self._prefix = 0  # window start: tokens before it are text already returned
        self._read = len(self._tokens)  # tokens before it have been turned into text

    def _decode(self, tokens: Sequence[int]) -> str:
        return self.tokenizer.decode(list(tokens), skip_special_tokens=True)

    def add(self, tokens: Sequence[int], *, final: bool = False) -> str:
        """The text ``tokens`` add; with ``final`` also any incomplete character held back."""
        self._tokens.extend(int(t) for t in tokens)
        if self._read == len(self._tokens) and not final:
            return ""
        before = self._decode(self._tokens[self._prefix : self._read])
        after = self._decode(self._tokens[self._prefix :])
        if len(after) > len(before) and (final or not after.endswith("\ufffd")):
            self._prefix, self._read = self._read, len(self._tokens)
            return after[len(before) :]
        return ""

    def flush(self) -> str:
        """Whatever is held back (an incomplete character at the end of the stream)."""
        return self.add((), final=True)


class StopStrings:
    """Releases text up to (never including) the first of ``stops``; ``hit`` once one is found."""

    def __init__(self, stops: Sequence[str] = ()):
        self.stops = tuple(s for s in stops if s)
        self._longest = max((len(s) for s in self.stops), default=0)
        self._text = ""  # everything received, cut at the stop string once hit
        self._released = 0
        self.hit: str | None = None

    def add(self, text: str) -> str:
        """Text that can be returned now: cut at a stop string, or short of a possible one."""
        if self.hit is not None:
            return ""
        start = max(0, len(self._text) - self._longest + 1)
        self._text += text
        found = [
            (index, stop) for stop in self.stops if (index := self._text.find(stop, start)) >= 0
        ]
        if found:
            index, self.hit = min(found)
            self._text = self._text[:index]
            return self._release(len(self._text))
        hold = 0
        for k in range(min(self._longest - 1, len(self._text)), 0, -1):
            tail = self._text[-k:]
            if any(stop.startswith(tail) for stop in self.stops):
                hold = k
                break
        return self._release(len(self._text) - hold)

    def flush(self) -> str:
        """The text held back as a possible stop string (the stream ended without it)."""
        return self._release(len(self._text))

    def _release(self, end: int) -> str:
        out = self._text[self._released : end]
        self._released = max(self._released, end)
        return out

    @property
    def text(self) -> str:
        return self._text
