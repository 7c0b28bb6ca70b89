"""One request of the decode loop: what was asked (``Request``) and how far it got
(``RequestState``).

Everything random about a request comes from its own NumPy generators, seeded by the request
alone: so its tokens do not depend on which other requests share its steps, or when they come and
go. The uniform that draws the target's token at each position of the output is keyed by that
position (``RequestState.token_uniforms``: the n-th uniform of the request's token stream draws
its n-th token, whatever step verifies it), so neither the draft trees nor the budgets that cut
them (``specdec.decode.budget``) change a sampled request's tokens under the exact tree walk. The
drafter's uniforms and the verifier's per-beam tests come from a second stream, in step order.
"""

from __future__ import annotations

from typing import Sequence

import attrs
import numpy as np

from specdec.errors import InvalidInputError
from specdec.types import SamplingConfig

UNIFORM_BLOCK = 32  # token uniforms drawn at a time
# why a request ended: a stop token or string, max_new_tokens, cancelled, or its step failed
FINISH_REASONS = ("stop", "length", "cancelled", "error")


def _tokens(value) -> tuple[int, ...]:
    return tuple(int(t) for t in value)


def _token_ids(name: str):
    """A converter to a tuple of token ids (integers >= 0) that names the field when given
    anything else (a bare int, a string, floats, bools, negative ids)."""

    def convert(value) -> tuple[int, ...]:
        items = list(value) if isinstance(value, (Sequence, np.ndarray)) else None
        if (
            items is None
            or isinstance(value, (str, bytes))
            or not all(
                isinstance(t, (int, np.integer)) and not isinstance(t, bool) and t >= 0
                for t in items
            )
        ):
            raise InvalidInputError(
                f"{name} must be a list of token ids (integers >= 0), got {value!r}"
            )
        return tuple(int(t) for t in items)

    return convert


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
    stop_token_ids: tuple[int, ...] = attrs.field(
        default=(), converter=_token_ids("stop_token_ids")
    )

    @max_new_tokens.validator
    def _check_max_new_tokens(self, attribute, value):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
            raise InvalidInputError(f"max_new_tokens must be a positive integer, got {value!r}")

    def generator(self, stream: int = 0) -> np.random.Generator:
        """The request's generator: stream 0 draws its tokens, stream 1 the drafter's and the
        per-beam tests' uniforms (independent streams of the same seed)."""
        entropy = (
            self.seed
            if self.seed is not None
            else (int(np.random.SeedSequence().entropy % (2**63)), 0)
        )
        if stream == 0:
            return np.random.default_rng(list(entropy))
        return np.random.default_rng(np.random.SeedSequence(list(entropy), spawn_key=(stream,)))


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
        # drafter and beam tests
        self.generator = None if request.sampling.greedy else request.generator(1)
        # the tokens, by position
        self._stream = None if request.sampling.greedy else request.generator(0)
        self._uniforms = np.zeros(0)
        self.emitted = 0
        self.done = False
        self.finish_reason: str | None = None  # "stop" or "length" once ``emit`` ended it
        prompt = np.asarray(request.prompt, dtype=np.int64)
        self._history = np.zeros(len(prompt) + request.max_new_tokens, dtype=np.int64)
        self._history[: len(prompt)] = prompt
        self._length = len(prompt)
        self.root = -1  # the last emitted token: the root of its next tree

    def draw(self, shape: tuple[int, ...]) -> np.ndarray | None:
        return None if self.generator is None else self.generator.random(shape)

    def token_uniforms(self, count: int) -> np.ndarray | None:
        """(count,) the uniforms that draw the request's next ``count`` tokens (positions
        ``emitted`` ..): the same numbers whatever the steps that verify them (None: greedy)."""
        if self._stream is None:
            return None
        end = self.emitted + count
        # drawn in blocks: the stream's n-th number is the n-th token's
        while len(self._uniforms) < end:
            self._uniforms = np.concatenate([self._uniforms, self._stream.random(UNIFORM_BLOCK)])
        return self._uniforms[self.emitted : end].copy()

    @property
    def history(self) -> np.ndarray:
        """(T,) read-only view: the prompt and every token emitted so far."""
        view = self._history[: self._length]
        view.flags.writeable = False
        return view

    def emit(self, tokens: Sequence[int]) -> list[int]:
        """Keep ``tokens`` up to max_new_tokens and through the first stop token; returns those
        kept."""
        if self.done:
            return []
        kept = [int(t) for t in tokens[: self.request.max_new_tokens - self.emitted]]
        for i, token in enumerate(kept):
            if token in self.request.stop_token_ids:
                kept = kept[: i + 1]
                self.done, self.finish_reason = True, "stop"
                break
        self._history[self._length : self._length + len(kept)] = kept
        self._length += len(kept)
        self.emitted += len(kept)
        if not self.done and self.emitted >= self.request.max_new_tokens:
            self.done, self.finish_reason = True, "length"
        if kept:
            self.root = kept[-1]
        return kept


def check_fits_slots(request: Request, capacity: int) -> None:
    """The request's prompt and ``max_new_tokens`` fit the ``capacity`` positions of a slot."""
    longest = len(request.prompt) + request.max_new_tokens
    if longest > capacity:
        raise InvalidInputError(
            f"a prompt of {len(request.prompt)} tokens plus "
            f"max_new_tokens={request.max_new_tokens} needs {longest} positions; the target's "
            f"slots hold {capacity} (load it with a larger capacity, or ask for fewer tokens)"
        )
