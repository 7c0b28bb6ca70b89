"""One request of the decode loop: what was asked (``Request``) and how far it got (``RequestState``).

Everything random about a request comes from its own NumPy generator, seeded by the request
alone, and every uniform it uses is drawn from that generator in a fixed order: so its tokens do
not depend on which other requests share its steps, or when they come and go.
"""

from __future__ import annotations

from typing import Sequence

import attrs
import numpy as np

from specdec.errors import InvalidInputError
from specdec.types import SamplingConfig


def _tokens(value) -> tuple[int, ...]:
    return tuple(int(t) for t in value)


def _seed(value) -> tuple[int, ...] | None:
    if value is None:
        return None
    if isinstance(value, (int, np.integer)) and not isinstance(value, bool):
        return (int(value), 0)
    return tuple(int(v) for v in value)


@attrs.frozen(kw_only=True)
class Request:
    """prompt: token ids. sampling: its own settings. seed: an int (the stream ``[seed, 0]``), a
    tuple of ints (the stream itself) or None (fresh entropy); only sampled decoding reads it.
    max_new_tokens: the most tokens to emit. stop_token_ids: tokens that end it (emitted)."""

    prompt: tuple[int, ...] = attrs.field(converter=_tokens)
    sampling: SamplingConfig = attrs.field(factory=SamplingConfig)
    seed: tuple[int, ...] | None = attrs.field(default=None, converter=_seed)
    max_new_tokens: int = attrs.field(default=128)
    stop_token_ids: tuple[int, ...] = attrs.field(default=(), converter=_tokens)

    @max_new_tokens.validator
    def _check_max_new_tokens(self, attribute, value):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
            raise InvalidInputError(f"max_new_tokens must be a positive integer, got {value!r}")

    def generator(self) -> np.random.Generator:
        entropy = self.seed if self.seed is not None else (int(np.random.SeedSequence().entropy % (2**63)), 0)
        return np.random.default_rng(list(entropy))


def batch_seeds(seed: int | Sequence[int] | None, batch_size: int) -> list:
    """Per-request seeds of a batch: an int seed gives request b the stream ``[seed, b]``; a list
    gives request b the stream ``[seed[b], 0]``, so a request decoded alone with ``seed=[s]``
    matches ``seed[b] = s``."""
    if seed is None:
        seed = int(np.random.SeedSequence().entropy % (2**63))
    if isinstance(seed, (int, np.integer)):
        return [(int(seed), b) for b in range(batch_size)]
    return [(int(s), 0) for s in seed]


class RequestState:
    """A request being decoded: its slot, random stream, emitted tokens and token history."""

    def __init__(self, request: Request, slot: int):
        self.request = request
        self.slot = slot
        self.generator = None if request.sampling.greedy else request.generator()
        self.emitted = 0
        self.done = False
        prompt = np.asarray(request.prompt, dtype=np.int64)
        self._history = np.zeros(len(prompt) + request.max_new_tokens, dtype=np.int64)
        self._history[: len(prompt)] = prompt
        self._length = len(prompt)
        self.root = -1  # the last emitted token: the root of its next tree

    def draw(self, shape: tuple[int, ...]) -> np.ndarray | None:
        return None if self.generator is None else self.generator.random(shape)

    @property
    def history(self) -> np.ndarray:
        """(T,) read-only view: the prompt and every token emitted so far."""
        view = self._history[: self._length]
        view.flags.writeable = False
        return view

    def emit(self, tokens: Sequence[int]) -> list[int]:
        """Keep ``tokens`` up to max_new_tokens and through the first stop token; returns those kept."""
        if self.done:
            return []
        kept = [int(t) for t in tokens[: self.request.max_new_tokens - self.emitted]]
        for i, token in enumerate(kept):
            if token in self.request.stop_token_ids:
                kept = kept[: i + 1]
                self.done = True
                break
        self._history[self._length : self._length + len(kept)] = kept
        self._length += len(kept)
        self.emitted += len(kept)
        self.done |= self.emitted >= self.request.max_new_tokens
        if kept:
            self.root = kept[-1]
        return kept
