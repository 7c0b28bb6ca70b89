"""The OpenAI-compatible HTTP application over a ``specdec.Engine`` (Starlette).

Routes: ``POST /v1/completions``, ``POST /v1/chat/completions`` (streamed as server-sent events
``data: {json}`` ... ``data: [DONE]``, or one JSON body), ``GET /v1/models``, ``GET /health``,
``GET /metrics`` (Prometheus text), behind ``specdec.serving.guard`` (Host, API key, content
type, body size and time). Errors are OpenAI-shaped bodies
``{"error": {"message", "type", "param", "code"}}``: 400 for a malformed body or a bad
argument (``specdec.serving.body``, ``specdec.serving.fields``), 404 for an unknown model, 429
(with ``Retry-After``) when the engine's queue is full, 503 while shutting down, 500 when
decoding a request failed (an unexpected error is logged, never shown). A request is parsed,
checked and tokenized on a worker thread (``specdec.serving.prepare``), which ``/health`` watches
as it watches the engine's step. A client that disconnects has its request cancelled, which frees
its slot.
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import json
import logging
import threading
import time
import uuid
from typing import Any, AsyncIterator, Callable

import anyio
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from specdec.serving.engine import Engine, EngineClosedError, QueueFullError, RequestFailedError
from specdec.errors import InvalidInputError
from specdec.serving import metrics as prometheus
from specdec.serving.errors import APIError, bad
from specdec.serving.guard import Guard, HostCheck
from specdec.serving.limits import Limits
from specdec.serving.prepare import Settings, max_prompt_chars, prepare, too_long

RETRY_AFTER_SECONDS = 1
# bodies this long are prepared one at a time, so they take one core at most
LARGE_BODY_BYTES = 256 * 1024
STALL_TIMEOUT = 60.0  # seconds a step or a preparation may run before /health says "stalled"
logger = logging.getLogger("specdec.serving")


def _internal_error(where: str) -> APIError:
    """A 500 that tells the client nothing of the exception; the log has it, under an id."""
    ident = uuid.uuid4().hex[:12]
    logger.exception("internal error %s in %s", ident, where)
    return APIError(
        500,
        f"internal server error (logged as {ident})",
        type="server_error",
        code="internal_error",
    )


def _usage(completion) -> dict:
    """OpenAI's ``usage`` of a ``Completion``, with its speculation as the extension
    ``speculation``."""
    prompt_tokens, completion_tokens = completion.prompt_tokens, completion.completion_tokens
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "speculation": {
            "steps": completion.steps,
            "drafting_steps": completion.drafting_steps,
            "drafted_tokens": completion.drafted_tokens,
            "accepted_tokens": completion.accepted_tokens,
            "plain_reasons": dict(completion.plain_reasons),
        },
    }


async def _watch_disconnect(receive, on_disconnect: Callable[[], None]) -> None:
    """Call ``on_disconnect`` when the client goes away (after the request body was read)."""
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            on_disconnect()
            return


class EventStream:
    """A server-sent-events response that cancels its request when the client disconnects."""

    def __init__(self, events: AsyncIterator[str], on_disconnect: Callable[[], None]):
        self.events, self.on_disconnect = events, on_disconnect

    async def __call__(self, scope, receive, send) -> None:
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [
                    (b"content-type", b"text/event-stream; charset=utf-8"),
                    (b"cache-control", b"no-cache"),
                    (b"x-accel-buffering", b"no"),
                ],
            }
        )
        gone = False

        def disconnected():
            nonlocal gone
            gone = True
            self.on_disconnect()

        watcher = asyncio.create_task(_watch_disconnect(receive, disconnected))
        try:
            async for event in self.events:
                if gone:
                    break
                try:
                    await send(
                        {"type": "http.response.body", "body": event.encode(), "more_body": True}
                    )
                except OSError:
                    disconnected()
                    break
            if not gone:
                await send({"type": "http.response.body", "body": b"", "more_body": False})
        finally:
            watcher.cancel()
            # no effect on a finished request; cancels one left behind by an error
            self.on_disconnect()
            await self.events.aclose()


class Preparations:
    """The requests being prepared on worker threads, each with when it began; a preparation
    counts until its thread ends, even when its request was cancelled meanwhile."""

    def __init__(self):
        self._started: dict[int, float] = {}
        self._ids = itertools.count()
        self._lock = threading.Lock()

    def run(self, function: Callable[[], Any]) -> Any:
        """``function()``, on the calling (worker) thread, counted while it runs."""
        ident = next(self._ids)
        with self._lock:
            self._started[ident] = time.monotonic()
        try:
            return function()
        finally:
            with self._lock:
                del self._started[ident]

    def stats(self) -> tuple[int, float]:
        """(preparations running, seconds the oldest has run: 0.0 when none)."""
        with self._lock:
            oldest = min(self._started.values(), default=None)
            return len(self._started), 0.0 if oldest is None else time.monotonic() - oldest


def _sse(payload: Any) -> str:
    return (
        "data: "
        f"{json.dumps(payload, ensure_ascii=False) if not isinstance(payload, str) else payload}"
        "\n\n"
    )


def create_app(
    engine: Engine,
    *,
    model_name: str,
    aliases: tuple[str, ...] = (),
    api_key: str | None = None,
    host_check: HostCheck | None = None,
    limits: Limits | None = None,
    stall_timeout: float = STALL_TIMEOUT,
) -> Starlette:
    """The application serving ``engine`` as the model ``model_name``
    (``aliases`` are accepted too), behind ``specdec.serving.guard.Guard``: ``api_key``
    (None: no key), ``host_check`` (default: loopback names only) and ``limits``
    (body size and time). ``/health`` answers 503 "stalled" while the engine's step in progress, or
    the preparation of a request (``app.state.preparations``), has run more than
    ``stall_timeout`` seconds."""
    names = (model_name, *aliases)
    created = int(time.time())
    large: list[anyio.CapacityLimiter] = []  # made in the event loop, at the first large body
    preparations = Preparations()
    max_chars = max_prompt_chars(engine)

    def submit(prompt_tokens: list[int], settings: Settings, prompt_param: str):
        context = engine.context_length
        if len(prompt_tokens) >= context:
            raise too_long(len(prompt_tokens), context, prompt_param)
        room = context - len(prompt_tokens)
        max_tokens = settings.max_tokens if settings.max_tokens is not None else room
        if max_tokens > room:
            raise bad(
                f"This model's maximum context length is {context} tokens; you asked for "
                f"{max_tokens} tokens after a prompt of {len(prompt_tokens)} tokens. Ask for at "
                f"most {room}.",
                settings.max_tokens_param,
                "context_length_exceeded",
            )
        try:
            return engine.submit(
                prompt_tokens,
                max_new_tokens=max_tokens,
                temperature=settings.temperature,
                top_k=settings.top_k,
                top_p=settings.top_p,
                seed=settings.seed,
                stop=settings.stop,
                stop_token_ids=settings.stop_token_ids,
                ignore_eos=settings.ignore_eos,
            )
        except QueueFullError as error:
            raise APIError(
                429,
                str(error),
                type="rate_limit_error",
                code="queue_full",
                headers={"Retry-After": str(RETRY_AFTER_SECONDS)},
            ) from None
        except EngineClosedError as error:
            raise APIError(503, str(error), type="server_error", code="shutting_down") from None
        except InvalidInputError as error:
            raise bad(str(error)) from None

    def finish_error(completion) -> APIError | None:
        if completion.finish_reason == "cancelled":
            return APIError(
                503,
                "the request was cancelled: the server is shutting down",
                type="server_error",
                code="cancelled",
            )
        return None

    async def complete(request: Request, *, chat: bool) -> Response:
        raw = await request.body()  # read by the guard, within its bounds
        # parsing, checks and tokenization on a worker thread: the event loop goes on serving the
        # others; large bodies one at a time, so that a burst of them leaves the other cores to the
        # engine
        if len(raw) > LARGE_BODY_BYTES and not large:
            large.append(anyio.CapacityLimiter(1))
        # a cancelled request (a shutdown) does not wait for its thread: the thread is left to
        # end on its own, counted in ``preparations`` until it does
        work = functools.partial(
            prepare, raw, chat=chat, engine=engine, names=names, max_chars=max_chars
        )
        prepared = await anyio.to_thread.run_sync(
            preparations.run,
            work,
            limiter=large[0] if len(raw) > LARGE_BODY_BYTES else None,
            abandon_on_cancel=True,
        )
        body, settings = prepared.body, prepared.settings
        handle = submit(prepared.tokens, settings, prepared.prompt_param)
        ident = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}"
        base = {
            "id": ident,
            "object": "chat.completion.chunk" if chat else "text_completion",
            "created": int(time.time()),
            "model": body.get("model") or model_name,
        }
        if settings.stream:
            return EventStream(_stream(handle, base, chat, settings.include_usage), handle.cancel)
        watcher = asyncio.create_task(_watch_disconnect(request.receive, handle.cancel))
        try:
            completion = await handle.aresult()
        except RequestFailedError as error:
            raise APIError(500, str(error), type="server_error", code="request_failed") from None
        finally:
            watcher.cancel()
        error = finish_error(completion)
        if error is not None:
            raise error
        choice = {"index": 0, "finish_reason": completion.finish_reason, "logprobs": None}
        if chat:
            choice["message"] = {"role": "assistant", "content": completion.text}
        else:
            choice["text"] = completion.text
        return JSONResponse(
            {
                **base,
                "object": "chat.completion" if chat else "text_completion",
                "choices": [choice],
                "usage": _usage(completion),
            }
        )

    async def _stream(handle, base: dict, chat: bool, include_usage: bool) -> AsyncIterator[str]:
        usage_field = {"usage": None} if include_usage else {}

        def chunk(text: str | None, finish: str | None, first: bool = False) -> dict:
            if chat:
                delta = (
                    {"role": "assistant", "content": ""}
                    if first
                    else ({} if text is None else {"content": text})
                )
                choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
            else:
                choice = {"index": 0, "text": text or "", "logprobs": None, "finish_reason": finish}
            return {**base, "choices": [choice], **usage_field}

        if chat:
            yield _sse(chunk(None, None, first=True))
        try:
            async for part in handle.achunks():
                if part.finish_reason == "cancelled":
                    raise APIError(
                        503,
                        "the request was cancelled: the server is shutting down",
                        type="server_error",
                        code="cancelled",
                    )
                if part.text:
                    yield _sse(chunk(part.text, None))
                if part.finish_reason is not None:
                    yield _sse(chunk(None, part.finish_reason))
        except RequestFailedError as error:
            yield _sse(APIError(500, str(error), type="server_error", code="request_failed").body())
        except APIError as error:
            yield _sse(error.body())
        except Exception:
            yield _sse(_internal_error("a stream").body())
        else:
            if include_usage:  # the request has ended: its Completion is there at once
                yield _sse({**base, "choices": [], "usage": _usage(handle.result(timeout=0))})
        yield _sse("[DONE]")

    async def completions(request: Request) -> Response:
        return await complete(request, chat=False)

    async def chat_completions(request: Request) -> Response:
        return await complete(request, chat=True)

    async def models(request: Request) -> Response:
        return JSONResponse(
            {
                "object": "list",
                "data": [
                    {
                        "id": name,
                        "object": "model",
                        "created": created,
                        "owned_by": "specdec",
                        "root": model_name,
                        "max_model_len": engine.context_length,
                    }
                    for name in names
                ],
            }
        )

    async def health(request: Request) -> Response:
        stats = engine.stats()
        preparing, prepare_seconds = preparations.stats()
        stalled = max(stats["step_seconds"], prepare_seconds) > stall_timeout
        ok = stats["alive"] and not stats["closing"] and not stalled
        dtype = getattr(engine.target, "dtype", None)
        return JSONResponse(
            {
                "status": "ok" if ok else "stalled" if stalled else "unavailable",
                **stats,
                "preparing": preparing,
                "prepare_seconds": prepare_seconds,
                "dtype": None if dtype is None else str(dtype).rpartition(".")[2],
                "exact": bool(getattr(engine.target, "exact", False)),
            },
            status_code=200 if ok else 503,
        )

    async def metrics(request: Request) -> Response:
        return Response(
            prometheus.render(engine, model_name=model_name), media_type=prometheus.CONTENT_TYPE
        )

    def wrap(endpoint):
        async def handler(request: Request) -> Response:
            try:
                return await endpoint(request)
            except APIError as error:
                return error.response()
            except Exception:
                return _internal_error(f"{request.method} {request.url.path}").response()

        return handler

    async def not_found(request: Request, exc) -> Response:
        return APIError(
            404, f"no route {request.method} {request.url.path}", code="not_found"
        ).response()

    async def method_not_allowed(request: Request, exc) -> Response:
        return APIError(
            405, f"{request.method} is not allowed on {request.url.path}", code="method_not_allowed"
        ).response()

    async def server_error(request: Request, exc) -> Response:
        return _internal_error(f"{request.method} {request.url.path}").response()

    routes = [
        Route("/v1/completions", wrap(completions), methods=["POST"]),
        Route("/v1/chat/completions", wrap(chat_completions), methods=["POST"]),
        Route("/v1/models", wrap(models), methods=["GET"]),
        Route("/health", wrap(health), methods=["GET"]),
        Route("/metrics", wrap(metrics), methods=["GET"]),
    ]
    guard = Middleware(
        Guard,
        host_check=host_check or HostCheck("127.0.0.1"),
        api_key=api_key,
        limits=limits or Limits(),
    )
    app = Starlette(
        routes=routes,
        middleware=[guard],
        exception_handlers={404: not_found, 405: method_not_allowed, Exception: server_error},
    )
    app.state.engine = engine
    app.state.model_name = model_name
    app.state.large_body_limiter = large  # [the limiter] once a large body came
    app.state.preparations = preparations
    return app
