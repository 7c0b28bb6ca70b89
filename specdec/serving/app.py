"""The OpenAI-compatible HTTP application over a ``specdec.Engine`` (Starlette).

Routes: ``POST /v1/completions``, ``POST /v1/chat/completions`` (streamed as server-sent events
``data: {json}`` ... ``data: [DONE]``, or one JSON body), ``GET /v1/models``, ``GET /health``,
``GET /metrics`` (Prometheus text). Errors are OpenAI-shaped bodies
``{"error": {"message", "type", "param", "code"}}``: 400 for a malformed body or a bad
argument, 404 for an unknown model, 429 (with ``Retry-After``) when the engine's queue is full,
503 while shutting down, 500 when decoding a request failed. A client that disconnects has its
request cancelled, which frees its slot.
"""

from __future__ import annotations

import asyncio
import json
import math
import time
import uuid
from typing import Any, AsyncIterator, Callable

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from specdec.engine import Engine, EngineClosedError, QueueFullError, RequestFailedError
from specdec.errors import InvalidInputError
from specdec.serving import metrics as prometheus

RETRY_AFTER_SECONDS = 1
DEFAULT_TEMPERATURE = 1.0  # OpenAI's default: a request without temperature is sampled
MAX_STOP_STRINGS = 16
# fields a request may carry whose non-default values are not supported: field -> the values accepted
UNSUPPORTED = {
    "logprobs": (None, False, 0), "top_logprobs": (None, 0), "echo": (None, False), "best_of": (None, 1),
    "suffix": (None, ""), "presence_penalty": (None, 0, 0.0), "frequency_penalty": (None, 0, 0.0),
    "logit_bias": (None, {}), "tools": (None, []), "functions": (None, []),
}


class APIError(Exception):
    """An error answered with an OpenAI-shaped body."""

    def __init__(self, status: int, message: str, *, type: str = "invalid_request_error", param: str | None = None,
                 code: str | None = None, headers: dict | None = None):
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type, param, code
        self.headers = headers or {}

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}

    def response(self) -> JSONResponse:
        return JSONResponse(self.body(), status_code=self.status, headers=self.headers)


def _bad(message: str, param: str | None = None, code: str | None = None) -> APIError:
    return APIError(400, message, param=param, code=code)


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


class Settings:
    """The decoding settings of one request body, checked."""

    def __init__(self, body: dict, *, chat: bool):
        for field, accepted in UNSUPPORTED.items():
            if body.get(field) not in accepted:
                raise _bad(f"{field} is not supported by this server", field, "unsupported_parameter")
        n = body.get("n", 1)
        if n is not None and (not _is_int(n) or n != 1):
            raise _bad(f"n must be 1 (one choice per request), got {n!r}", "n")
        temperature = body.get("temperature")
        if temperature is None:
            temperature = DEFAULT_TEMPERATURE
        if not _is_number(temperature) or not 0 <= temperature <= 2:
            raise _bad(f"temperature must be a number in [0, 2], got {temperature!r}", "temperature")
        top_p = body.get("top_p")
        if top_p is not None and (not _is_number(top_p) or not 0 < top_p <= 1):
            raise _bad(f"top_p must be a number in (0, 1], got {top_p!r}", "top_p")
        top_k = body.get("top_k")
        if top_k is not None and (not _is_int(top_k) or top_k < -1):
            raise _bad(f"top_k must be a positive integer (-1 or 0: no limit), got {top_k!r}", "top_k")
        seed = body.get("seed")
        if seed is not None and (not _is_int(seed) or seed < 0):
            raise _bad(f"seed must be an integer >= 0, got {seed!r}", "seed")
        stop = body.get("stop")
        if isinstance(stop, str):
            stop = [stop]
        if stop is not None and (not isinstance(stop, list) or not all(isinstance(s, str) for s in stop)
                                 or len(stop) > MAX_STOP_STRINGS):
            raise _bad(f"stop must be a string or a list of at most {MAX_STOP_STRINGS} strings", "stop")
        stop_token_ids = body.get("stop_token_ids") or []
        if not isinstance(stop_token_ids, list) or not all(_is_int(t) and t >= 0 for t in stop_token_ids):
            raise _bad("stop_token_ids must be a list of token ids", "stop_token_ids")
        ignore_eos = body.get("ignore_eos", False)
        if not isinstance(ignore_eos, bool):
            raise _bad("ignore_eos must be true or false", "ignore_eos")
        stream = body.get("stream", False)
        if stream is None:
            stream = False
        if not isinstance(stream, bool):
            raise _bad("stream must be true or false", "stream")
        options = body.get("stream_options") or {}
        if not isinstance(options, dict):
            raise _bad("stream_options must be an object", "stream_options")
        self.max_tokens_param = "max_tokens"
        max_tokens = body.get("max_tokens")
        if chat and body.get("max_completion_tokens") is not None:
            max_tokens, self.max_tokens_param = body["max_completion_tokens"], "max_completion_tokens"
        if max_tokens is not None and (not _is_int(max_tokens) or max_tokens < 1):
            raise _bad(f"{self.max_tokens_param} must be an integer >= 1, got {max_tokens!r}", self.max_tokens_param)
        self.max_tokens = max_tokens if max_tokens is not None else (None if chat else 16)
        self.temperature = float(temperature)
        self.top_p = None if top_p is None else float(top_p)
        self.top_k = None if top_k in (None, 0, -1) else top_k
        self.seed, self.stop, self.stop_token_ids, self.ignore_eos = seed, stop or [], stop_token_ids, ignore_eos
        self.stream, self.include_usage = stream, bool(options.get("include_usage", False))


def _prompt_of(body: dict):
    """The one prompt of a completions body: text or token ids."""
    if "prompt" not in body:
        raise _bad("prompt is required", "prompt")
    prompt = body["prompt"]
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]  # a batch of one
    if isinstance(prompt, str):
        if not prompt:
            raise _bad("prompt is empty", "prompt")
        return prompt
    if isinstance(prompt, list) and prompt and all(_is_int(t) for t in prompt):
        return prompt
    if isinstance(prompt, list) and len(prompt) > 1 and all(isinstance(p, (str, list)) for p in prompt):
        raise _bad("prompt holds several prompts; this server takes one prompt per request", "prompt")
    raise _bad("prompt must be a non-empty string or a non-empty list of token ids", "prompt")


def _messages_of(body: dict) -> list[dict]:
    """The chat of a chat-completions body, with each message's content as a string."""
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise _bad("messages must be a non-empty list of {role, content} objects", "messages")
    out = []
    for i, message in enumerate(messages):
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise _bad(f"messages[{i}] must be an object with a role and content", "messages")
        content = message.get("content")
        if isinstance(content, list):
            parts = []
            for part in content:
                if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                    raise _bad(f"messages[{i}].content: only text parts are supported", "messages")
                parts.append(part["text"])
            content = "".join(parts)
        if content is None:
            content = ""
        if not isinstance(content, str):
            raise _bad(f"messages[{i}].content must be a string or a list of text parts", "messages")
        out.append({"role": message["role"], "content": content})
    return out


def _usage(prompt_tokens: int, completion_tokens: int) -> dict:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


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
        await send({"type": "http.response.start", "status": 200, "headers": [
            (b"content-type", b"text/event-stream; charset=utf-8"), (b"cache-control", b"no-cache"),
            (b"x-accel-buffering", b"no")]})
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
                    await send({"type": "http.response.body", "body": event.encode(), "more_body": True})
                except OSError:
                    disconnected()
                    break
            if not gone:
                await send({"type": "http.response.body", "body": b"", "more_body": False})
        finally:
            watcher.cancel()
            self.on_disconnect()  # no effect on a finished request; cancels one left behind by an error
            await self.events.aclose()


def _sse(payload: Any) -> str:
    return f"data: {json.dumps(payload, ensure_ascii=False) if not isinstance(payload, str) else payload}\n\n"


def create_app(engine: Engine, *, model_name: str, aliases: tuple[str, ...] = ()) -> Starlette:
    """The application serving ``engine`` as the model ``model_name`` (``aliases`` are accepted too)."""
    names = (model_name, *aliases)
    created = int(time.time())

    def check_model(body: dict) -> None:
        model = body.get("model")
        if model is not None and model not in names:
            raise APIError(404, f"The model {model!r} does not exist; this server serves {model_name!r}",
                           param="model", code="model_not_found")

    async def read_body(request: Request) -> dict:
        raw = await request.body()
        try:
            body = json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError) as error:
            raise _bad(f"the request body is not valid JSON: {error}", code="invalid_json") from None
        if not isinstance(body, dict):
            raise _bad("the request body must be a JSON object")
        return body

    def submit(prompt_tokens: list[int], settings: Settings, prompt_param: str):
        context = engine.context_length
        if len(prompt_tokens) >= context:
            raise _bad(f"This model's maximum context length is {context} tokens; the prompt has "
                       f"{len(prompt_tokens)} tokens. Shorten the {prompt_param}.", prompt_param,
                       "context_length_exceeded")
        room = context - len(prompt_tokens)
        max_tokens = settings.max_tokens if settings.max_tokens is not None else room
        if max_tokens > room:
            raise _bad(f"This model's maximum context length is {context} tokens; you asked for {max_tokens} "
                       f"tokens after a prompt of {len(prompt_tokens)} tokens. Ask for at most {room}.",
                       settings.max_tokens_param, "context_length_exceeded")
        try:
            return engine.submit(prompt_tokens, max_new_tokens=max_tokens, temperature=settings.temperature,
                                 top_k=settings.top_k, top_p=settings.top_p, seed=settings.seed, stop=settings.stop,
                                 stop_token_ids=settings.stop_token_ids, ignore_eos=settings.ignore_eos)
        except QueueFullError as error:
            raise APIError(429, str(error), type="rate_limit_error", code="queue_full",
                           headers={"Retry-After": str(RETRY_AFTER_SECONDS)}) from None
        except EngineClosedError as error:
            raise APIError(503, str(error), type="server_error", code="shutting_down") from None
        except InvalidInputError as error:
            raise _bad(str(error)) from None

    def encode(prompt, param: str) -> list[int]:
        try:
            return engine.encode(prompt)
        except InvalidInputError as error:
            raise _bad(str(error), param) from None

    def finish_error(completion) -> APIError | None:
        if completion.finish_reason == "cancelled":
            return APIError(503, "the request was cancelled: the server is shutting down", type="server_error",
                            code="cancelled")
        return None

    async def complete(request: Request, *, chat: bool) -> Response:
        body = await read_body(request)
        check_model(body)
        settings = Settings(body, chat=chat)
        if chat:
            prompt_param, prompt = "messages", _messages_of(body)
            if engine.chat_template is None:
                raise _bad("this model has no chat template: use /v1/completions", "messages")
        else:
            prompt_param, prompt = "prompt", _prompt_of(body)
        tokens = encode(prompt, prompt_param)
        handle = submit(tokens, settings, prompt_param)
        ident = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}"
        base = {"id": ident, "object": "chat.completion.chunk" if chat else "text_completion",
                "created": int(time.time()), "model": body.get("model") or model_name}
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
        return JSONResponse({**base, "object": "chat.completion" if chat else "text_completion",
                             "choices": [choice],
                             "usage": _usage(completion.prompt_tokens, completion.completion_tokens)})

    async def _stream(handle, base: dict, chat: bool, include_usage: bool) -> AsyncIterator[str]:
        usage_field = {"usage": None} if include_usage else {}

        def chunk(text: str | None, finish: str | None, first: bool = False) -> dict:
            if chat:
                delta = {"role": "assistant", "content": ""} if first else ({} if text is None else {"content": text})
                choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
            else:
                choice = {"index": 0, "text": text or "", "logprobs": None, "finish_reason": finish}
            return {**base, "choices": [choice], **usage_field}

        if chat:
            yield _sse(chunk(None, None, first=True))
        completion_tokens = 0
        try:
            async for part in handle.achunks():
                completion_tokens += len(part.tokens)
                if part.finish_reason == "cancelled":
                    raise APIError(503, "the request was cancelled: the server is shutting down",
                                   type="server_error", code="cancelled")
                if part.text:
                    yield _sse(chunk(part.text, None))
                if part.finish_reason is not None:
                    yield _sse(chunk(None, part.finish_reason))
        except RequestFailedError as error:
            yield _sse(APIError(500, str(error), type="server_error", code="request_failed").body())
        except APIError as error:
            yield _sse(error.body())
        else:
            if include_usage:
                yield _sse({**base, "choices": [], "usage": _usage(handle.prompt_tokens, completion_tokens)})
        yield _sse("[DONE]")

    async def completions(request: Request) -> Response:
        return await complete(request, chat=False)

    async def chat_completions(request: Request) -> Response:
        return await complete(request, chat=True)

    async def models(request: Request) -> Response:
        return JSONResponse({"object": "list", "data": [
            {"id": name, "object": "model", "created": created, "owned_by": "specdec", "root": model_name,
             "max_model_len": engine.context_length} for name in names]})

    async def health(request: Request) -> Response:
        stats = engine.stats()
        ok = stats["alive"] and not stats["closing"]
        dtype = getattr(engine.target, "dtype", None)
        return JSONResponse({"status": "ok" if ok else "unavailable", **stats,
                             "dtype": None if dtype is None else str(dtype).rpartition(".")[2],
                             "exact": bool(getattr(engine.target, "exact", False))},
                            status_code=200 if ok else 503)

    async def metrics(request: Request) -> Response:
        return Response(prometheus.render(engine, model_name=model_name), media_type=prometheus.CONTENT_TYPE)

    def wrap(endpoint):
        async def handler(request: Request) -> Response:
            try:
                return await endpoint(request)
            except APIError as error:
                return error.response()
        return handler

    async def not_found(request: Request, exc) -> Response:
        return APIError(404, f"no route {request.method} {request.url.path}", code="not_found").response()

    async def method_not_allowed(request: Request, exc) -> Response:
        return APIError(405, f"{request.method} is not allowed on {request.url.path}",
                        code="method_not_allowed").response()

    async def server_error(request: Request, exc) -> Response:
        return APIError(500, f"internal error: {type(exc).__name__}: {exc}", type="server_error").response()

    routes = [
        Route("/v1/completions", wrap(completions), methods=["POST"]),
        Route("/v1/chat/completions", wrap(chat_completions), methods=["POST"]),
        Route("/v1/models", wrap(models), methods=["GET"]),
        Route("/health", wrap(health), methods=["GET"]),
        Route("/metrics", wrap(metrics), methods=["GET"]),
    ]
    app = Starlette(routes=routes, exception_handlers={404: not_found, 405: method_not_allowed,
                                                       Exception: server_error})
    app.state.engine = engine
    app.state.model_name = model_name
    return app
