"""What a caller of ``specdec.Engine`` holds: a ``Handle`` per request (its tokens and text as
steps accept them, ``Chunk`` by ``Chunk``, and its ``Completion``), and the engine's errors."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import AsyncIterator, Callable, Iterator, Sequence

import attrs

from specdec.errors import InvalidInputError, SpecdecError
from specdec.decode.requests import Request
from specdec.decode.step_results import accepted_kept
from specdec.serving.metrics import EngineMetrics
from specdec.serving.text import IncrementalText, StopStrings


class QueueFullError(SpecdecError, RuntimeError):
    """The engine's queue of waiting requests is full; retry later (HTTP 429)."""


class EngineClosedError(SpecdecError, RuntimeError):
    """The engine is closing or closed and takes no new requests (HTTP 503)."""


class RequestFailedError(SpecdecError, RuntimeError):
    """A request failed while it was decoded; ``__cause__`` is what raised."""


@attrs.frozen(kw_only=True)
class Chunk:
    """What one step gave a request: ``tokens`` accepted, ``text`` they release (cut before a stop
    string), and on its last chunk ``finish_reason`` ("stop", "length", "cancelled" or "error")."""

    tokens: tuple[int, ...] = ()
    text: str = ""
    finish_reason: str | None = None


@attrs.frozen(kw_only=True)
class Completion:
    """A finished request: every token, the text (no stop string or stop token in it), why it
    ended, its prompt's length and its times in seconds (queue: submit to admission; first
    token: submit to its first token; total: submit to its end).

    Its speculation: ``steps``, the target forwards it took part in after its prompt's (each
    gives it its accepted drafted tokens and one token of the target's own: the bonus);
    ``drafted_tokens``, the drafted tokens verified for it (after its tree budgets);
    ``accepted_tokens``, those accepted and kept in ``tokens`` (a step the request's end cut
    short counts the tokens kept past its first). So ``completion_tokens == 1 + steps +
    accepted_tokens`` once it has a token (the first comes from the prompt's forward), and
    plain decoding has ``accepted_tokens == 0``.
    """

    tokens: tuple[int, ...]
    text: str | None
    finish_reason: str
    prompt_tokens: int
    time_in_queue: float | None
    time_to_first_token: float | None
    time_total: float
    steps: int = 0
    drafted_tokens: int = 0
    accepted_tokens: int = 0
    drafting_steps: int = 0  # the steps in which it drafted (what speculation="auto" chose)
    # the steps in which it decoded plainly, by why (``specdec.decode.budget.PLAIN_REASONS``)
    plain_reasons: dict = attrs.field(factory=dict)

    @property
    def completion_tokens(self) -> int:
        return len(self.tokens)

    @property
    def tokens_per_step(self) -> float:
        """Tokens per decode step, bonus counted: ``(steps + accepted_tokens) / steps`` (plain
        decoding 1.0; the first token, from the prompt's forward, not counted; 0.0 before a
        step)."""
        return (self.steps + self.accepted_tokens) / self.steps if self.steps else 0.0


class Handle:
    """One submitted request. Iterate it (or ``tokens()``) for its tokens as they are accepted,
    ``chunks()`` for tokens with their text, ``async for`` / ``achunks()`` from asyncio;
    ``result()`` waits for the ``Completion``; ``cancel()`` from any thread. A request that
    failed raises ``RequestFailedError`` from iteration and ``result()``."""

    def __init__(
        self, post: Callable[[tuple], None], request: Request, *, stop: Sequence[str], tokenizer
    ):
        self._post = post  # hands a command to the engine's scheduler (``Engine.post``)
        self.request = request
        self.id: int | None = None  # the decoder's request id, once the scheduler has it
        self.submitted_at = time.perf_counter()
        self.admitted_at: float | None = None
        self.first_token_at: float | None = None
        self.finished_at: float | None = None
        self.finish_reason: str | None = None
        self.error: BaseException | None = None
        self._tokens: list[int] = []
        self.steps = self.drafted_tokens = self.accepted_tokens = self.drafting_steps = (
            0  # its speculation (``Completion``)
        )
        self.plain_reasons: dict[str, int] = {}  # its plain steps by why (``Completion``)
        self._chunks: list[Chunk] = []
        self._cond = threading.Condition()
        self._waiters: list[tuple[asyncio.AbstractEventLoop, asyncio.Future]] = []
        self._last_at: float | None = None
        self._detok = IncrementalText(tokenizer, request.prompt) if tokenizer is not None else None
        self._stops = StopStrings(stop)
        self._text: list[str] = []
        if stop and tokenizer is None:
            raise InvalidInputError(
                "stop strings need the model's tokenizer, and this model has none; "
                "use stop token ids"
            )

    # -- reading (any thread) --

    @property
    def done(self) -> bool:
        return self.finish_reason is not None

    @property
    def prompt_tokens(self) -> int:
        return len(self.request.prompt)

    def chunks(self, timeout: float | None = None) -> Iterator[Chunk]:
        """Chunks as they arrive; the last has ``finish_reason``. ``timeout``: the longest wait
        for the next chunk (TimeoutError)."""
        index = 0
        while True:
            with self._cond:
                if not self._cond.wait_for(lambda: len(self._chunks) > index or self.done, timeout):
                    raise TimeoutError(f"no token from request {self.id} in {timeout} s")
                available = self._chunks[index:]
                finished = self.done and len(self._chunks) == index + len(available)
            for chunk in available:
                yield chunk
            index += len(available)
            if finished:
                self._raise_if_failed()
                return

    def tokens(self, timeout: float | None = None) -> Iterator[int]:
        """Token ids as they are accepted (stop tokens included, nothing after a stop string's
        end)."""
        for chunk in self.chunks(timeout):
            yield from chunk.tokens

    def __iter__(self) -> Iterator[int]:
        return self.tokens()

    async def achunks(self) -> AsyncIterator[Chunk]:
        """``chunks()`` for asyncio: waits without blocking the event loop."""
        loop = asyncio.get_running_loop()
        index = 0
        while True:
            with self._cond:
                available = self._chunks[index:]
                finished = self.done
                future = None
                if not available and not finished:
                    future = loop.create_future()
                    self._waiters.append((loop, future))
            if future is not None:
                await future
                continue
            for chunk in available:
                yield chunk
            index += len(available)
            if finished and not available:
                self._raise_if_failed()
                return

    async def __aiter__(self) -> AsyncIterator[int]:
        async for chunk in self.achunks():
            for token in chunk.tokens:
                yield token

    def result(self, timeout: float | None = None) -> Completion:
        """Wait for the request to end; its Completion (a cancelled request: what it had)."""
        with self._cond:
            if not self._cond.wait_for(lambda: self.done, timeout):
                raise TimeoutError(f"request {self.id} did not finish in {timeout} s")
        self._raise_if_failed()
        return self._completion()

    async def aresult(self) -> Completion:
        async for _ in self.achunks():
            pass
        return self._completion()

    def cancel(self) -> None:
        """Stop the request; its slot is freed at the scheduler's next turn. No effect once done."""
        if not self.done:
            self._post(("cancel", self))

    def _raise_if_failed(self) -> None:
        if self.error is not None:
            raise RequestFailedError(
                f"request {self.id} failed: {type(self.error).__name__}: {self.error}"
            ) from self.error

    def _completion(self) -> Completion:
        return Completion(
            tokens=tuple(self._tokens),
            text="".join(self._text) if self._detok is not None else None,
            finish_reason=self.finish_reason,
            prompt_tokens=self.prompt_tokens,
            time_in_queue=None
            if self.admitted_at is None
            else self.admitted_at - self.submitted_at,
            time_to_first_token=None
            if self.first_token_at is None
            else self.first_token_at - self.submitted_at,
            time_total=(self.finished_at or time.perf_counter()) - self.submitted_at,
            steps=self.steps,
            drafted_tokens=self.drafted_tokens,
            accepted_tokens=self.accepted_tokens,
            drafting_steps=self.drafting_steps,
            plain_reasons=dict(self.plain_reasons),
        )

    # -- writing (the scheduler thread) --

    def take(self, tokens: list[int], now: float, metrics: EngineMetrics) -> Chunk:
        """The chunk of a step's tokens, to ``push``; it has a finish reason when they end the
        request (length, stop token or string). Tokens after the one that completes a stop
        string are dropped."""
        request = self.request
        finish, text, kept = None, [], []
        for token in tokens:
            kept.append(token)
            stop_token = token in request.stop_token_ids
            if stop_token:
                finish = "stop"
            elif len(self._tokens) + len(kept) >= request.max_new_tokens:
                finish = "length"
            if self._detok is not None:
                text.append(
                    self._stops.add(
                        self._detok.add(() if stop_token else (token,), final=finish is not None)
                    )
                )
                if self._stops.hit is not None:
                    finish = "stop"
                elif finish is not None:
                    text.append(self._stops.flush())
            if finish is not None:
                break
        if kept:
            if self.first_token_at is None:
                self.first_token_at = now
                metrics.observe("time_to_first_token_seconds", now - self.submitted_at)
            else:
                metrics.observe(
                    "inter_token_latency_seconds", (now - self._last_at) / len(kept), len(kept)
                )
            self._last_at = now
        metrics.add("generation_tokens", len(kept))
        self._tokens.extend(kept)
        self._text.append("".join(text))
        return Chunk(tokens=tuple(kept), text="".join(text), finish_reason=finish)

    def count_step(self, drafted: int, accepted: int, kept: int, plain: str | None = None) -> None:
        """Count a decode step of this request: ``drafted`` tokens verified, ``accepted`` of them
        by the verifier, ``kept`` tokens of the step in its output (``take``): the accepted ones
        kept are those past the step's first; ``plain``: why it decoded plainly, if it did."""
        self.steps += 1
        if plain is not None:
            self.plain_reasons[plain] = self.plain_reasons.get(plain, 0) + 1
        self.drafting_steps += drafted > 0
        self.drafted_tokens += drafted
        self.accepted_tokens += accepted_kept(accepted, kept)

    def finish(self, reason: str, error: BaseException | None, now: float) -> None:
        text = ""
        if reason == "cancelled" and self._detok is not None and self._stops.hit is None:
            text = self._stops.flush()  # the text of every token delivered
            self._text.append(text)
        self.push(Chunk(text=text, finish_reason=reason), reason, error, now)

    def push(
        self, chunk: Chunk, finish: str | None, error: BaseException | None, now: float
    ) -> None:
        with self._cond:
            if self.done:
                return
            self._chunks.append(chunk)
            if finish is not None:
                self.error, self.finished_at, self.finish_reason = error, now, finish
            waiters, self._waiters = self._waiters, []
            self._cond.notify_all()
        for loop, future in waiters:
            try:
                loop.call_soon_threadsafe(_wake, future)
            except RuntimeError:  # the waiter's event loop is closed: nobody is waiting any more
                pass


def _wake(future: asyncio.Future) -> None:
    if not future.done():
        future.set_result(None)
