"""The fields of a completions or chat-completions body, checked: every field is one this server
honours, or one it does not support left at its neutral value, or the request is refused with a
400 naming the field (``unsupported_parameter``, or ``unknown_parameter`` for a field that is
not OpenAI's). Nothing is silently ignored."""

from __future__ import annotations

import json
import math

from specdec.serving.errors import bad

DEFAULT_TEMPERATURE = 1.0  # OpenAI's default: a request without temperature is sampled
MAX_STOP_STRINGS = 16
MAX_STOP_CHARS = 1024  # each stop string: the text held back per step scales with the longest
MAX_STOP_TOKEN_IDS = 256
ROLES = ("system", "user", "assistant")

HONOURED = {
    "model",
    "max_tokens",
    "temperature",
    "top_p",
    "n",
    "stream",
    "stream_options",
    "stop",
    "seed",
    "user",
    "top_k",
    "stop_token_ids",
    "ignore_eos",
}
HONOURED_COMPLETIONS = HONOURED | {"prompt"}
HONOURED_CHAT = HONOURED | {"messages", "max_completion_tokens"}
# fields a request may carry that this server does not support: field -> the neutral values accepted
UNSUPPORTED = {
    "logprobs": (None, False, 0),
    "top_logprobs": (None, 0),
    "echo": (None, False),
    "best_of": (None, 1),
    "suffix": (None, ""),
    "presence_penalty": (None, 0, 0.0),
    "frequency_penalty": (None, 0, 0.0),
    "logit_bias": (None, {}),
    "tools": (None, []),
    "functions": (None, []),
    "tool_choice": (None, "none"),
    "function_call": (None, "none"),
    "response_format": (None, {"type": "text"}),
    "parallel_tool_calls": (None,),
    "store": (None, False),
    "metadata": (None, {}),
    "service_tier": (None, "auto", "default"),
    "modalities": (None, ["text"]),
    "audio": (None,),
    "prediction": (None,),
    "reasoning_effort": (None,),
    "web_search_options": (None,),
}
UNSUPPORTED_COMPLETIONS = (
    "logprobs",
    "echo",
    "best_of",
    "suffix",
    "presence_penalty",
    "frequency_penalty",
    "logit_bias",
)


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _neutral(value, accepted) -> bool:
    """``value`` is one of ``accepted`` as JSON sees it (``true`` is not ``1``, ``1.0`` is not
    ``1``)."""
    return (
        any(value == a and type(value) is type(a) for a in accepted if a is not None)
        or value is None
    )


def check_fields(body: dict, *, chat: bool) -> None:
    """Refuse a field this route does not honour unless it holds a neutral value."""
    honoured = HONOURED_CHAT if chat else HONOURED_COMPLETIONS
    unsupported = UNSUPPORTED if chat else {k: UNSUPPORTED[k] for k in UNSUPPORTED_COMPLETIONS}
    for field, value in body.items():
        if field in honoured:
            continue
        if field in unsupported:
            if not _neutral(value, unsupported[field]):
                neutral = ", ".join(json.dumps(a) for a in unsupported[field] if a is not None)
                raise bad(
                    f"{field} is not supported by this server (leave it out, or give null"
                    f"{', ' + neutral if neutral else ''})",
                    field,
                    "unsupported_parameter",
                )
            continue
        route = "chat completions" if chat else "completions"
        raise bad(
            f"Unrecognized request argument supplied: {field!r} (not a field of {route} this "
            "server knows)",
            field,
            "unknown_parameter",
        )
    if body.get("model") is not None and not isinstance(body["model"], str):
        raise bad("model must be a string", "model")
    if body.get("user") is not None and not isinstance(body["user"], str):
        raise bad("user must be a string", "user")


class Settings:
    """The decoding settings of one request body, checked (``vocab``: the model's vocabulary
    size)."""

    def __init__(self, body: dict, *, chat: bool, vocab: int):
        n = body.get("n", 1)
        if n is not None and (not _is_int(n) or n != 1):
            raise bad(f"n must be 1 (one choice per request), got {n!r}", "n")
        temperature = body.get("temperature")
        if temperature is None:
            temperature = DEFAULT_TEMPERATURE
        if not _is_number(temperature) or not 0 <= temperature <= 2:
            raise bad(f"temperature must be a number in [0, 2], got {temperature!r}", "temperature")
        top_p = body.get("top_p")
        if top_p is not None and (not _is_number(top_p) or not 0 < top_p <= 1):
            raise bad(f"top_p must be a number in (0, 1], got {top_p!r}", "top_p")
        top_k = body.get("top_k")
        if top_k is not None and (not _is_int(top_k) or top_k < -1):
            raise bad(
                f"top_k must be a positive integer (-1 or 0: no limit), got {top_k!r}", "top_k"
            )
        seed = body.get("seed")
        if seed is not None and (not _is_int(seed) or seed < 0):
            raise bad(f"seed must be an integer >= 0, got {seed!r}", "seed")
        stop = body.get("stop")
        if isinstance(stop, str):
            stop = [stop]
        if stop is not None and (
            not isinstance(stop, list)
            or not all(isinstance(s, str) for s in stop)
            or len(stop) > MAX_STOP_STRINGS
        ):
            raise bad(
                f"stop must be a string or a list of at most {MAX_STOP_STRINGS} strings", "stop"
            )
        if stop and max(map(len, stop)) > MAX_STOP_CHARS:
            raise bad(f"a stop string may hold at most {MAX_STOP_CHARS} characters", "stop")
        stop_token_ids = body.get("stop_token_ids") or []
        if (
            not isinstance(stop_token_ids, list)
            or not all(_is_int(t) for t in stop_token_ids)
            or len(stop_token_ids) > MAX_STOP_TOKEN_IDS
        ):
            raise bad(
                f"stop_token_ids must be a list of at most {MAX_STOP_TOKEN_IDS} token ids",
                "stop_token_ids",
            )
        outside = [t for t in stop_token_ids if not 0 <= t < vocab]
        if outside:
            raise bad(
                f"stop_token_ids has ids outside the vocabulary [0, {vocab}): {outside[:8]}",
                "stop_token_ids",
            )
        ignore_eos = body.get("ignore_eos", False)
        if not isinstance(ignore_eos, bool):
            raise bad("ignore_eos must be true or false", "ignore_eos")
        stream = body.get("stream", False)
        if stream is None:
            stream = False
        if not isinstance(stream, bool):
            raise bad("stream must be true or false", "stream")
        options = body.get("stream_options") or {}
        if not isinstance(options, dict):
            raise bad("stream_options must be an object", "stream_options")
        for key, value in options.items():
            if key != "include_usage":
                raise bad(
                    f"stream_options.{key} is not supported (only include_usage)",
                    "stream_options",
                    "unsupported_parameter",
                )
            if value is not None and not isinstance(value, bool):
                raise bad("stream_options.include_usage must be true or false", "stream_options")
        self.max_tokens_param = "max_tokens"
        max_tokens = body.get("max_tokens")
        if chat and body.get("max_completion_tokens") is not None:
            max_tokens, self.max_tokens_param = (
                body["max_completion_tokens"],
                "max_completion_tokens",
            )
        if max_tokens is not None and (not _is_int(max_tokens) or max_tokens < 1):
            raise bad(
                f"{self.max_tokens_param} must be an integer >= 1, got {max_tokens!r}",
                self.max_tokens_param,
            )
        self.max_tokens = max_tokens if max_tokens is not None else (None if chat else 16)
        self.temperature = float(temperature)
        self.top_p = None if top_p is None else float(top_p)
        self.top_k = None if top_k in (None, 0, -1) or top_k >= vocab else top_k
        self.seed, self.stop, self.stop_token_ids, self.ignore_eos = (
            seed,
            stop or [],
            stop_token_ids,
            ignore_eos,
        )
        self.stream, self.include_usage = stream, bool(options.get("include_usage", False))


def prompt_of(body: dict):
    """The one prompt of a completions body: text or token ids."""
    if "prompt" not in body:
        raise bad("prompt is required", "prompt")
    prompt = body["prompt"]
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]  # a batch of one
    if isinstance(prompt, str):
        if not prompt:
            raise bad("prompt is empty", "prompt")
        return prompt
    if isinstance(prompt, list) and prompt and all(_is_int(t) for t in prompt):
        return prompt
    if (
        isinstance(prompt, list)
        and len(prompt) > 1
        and all(isinstance(p, (str, list)) for p in prompt)
    ):
        raise bad(
            "prompt holds several prompts; this server takes one prompt per request", "prompt"
        )
    raise bad("prompt must be a non-empty string or a non-empty list of token ids", "prompt")


def messages_of(body: dict) -> list[dict]:
    """The chat of a chat-completions body, with each message's content as a string."""
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise bad("messages must be a non-empty list of {role, content} objects", "messages")
    out = []
    for i, message in enumerate(messages):
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise bad(f"messages[{i}] must be an object with a role and content", "messages")
        if message["role"] not in ROLES:
            raise bad(
                f"messages[{i}].role must be one of {', '.join(ROLES)}, got "
                f"{message['role']!r:.40}",
                "messages",
            )
        for key, value in message.items():
            if key not in ("role", "content") and value is not None:
                raise bad(
                    f"messages[{i}].{key} is not supported by this server (only role and content)",
                    "messages",
                    "unsupported_parameter",
                )
        content = message.get("content")
        if isinstance(content, list):
            parts = []
            for j, part in enumerate(content):
                if (
                    not isinstance(part, dict)
                    or part.get("type") != "text"
                    or not isinstance(part.get("text"), str)
                    or set(part) != {"type", "text"}
                ):
                    raise bad(
                        f"messages[{i}].content[{j}]: only text parts ({{\"type\": \"text\", "
                        "\"text\": ...}) are supported",
                        "messages",
                    )
                parts.append(part["text"])
            content = "".join(parts)
        if content is None:
            content = ""
        if not isinstance(content, str):
            raise bad(f"messages[{i}].content must be a string or a list of text parts", "messages")
        out.append({"role": message["role"], "content": content})
    return out
