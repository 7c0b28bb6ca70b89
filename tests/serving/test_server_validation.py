"""Request bodies the server refuses with a 400 naming the field (``specdec.serving.body``,
``.fields``, ``.prepare``): JSON nested too deep, numbers out of range, lone surrogates, fields
it does not support or know, out-of-vocabulary ids; and a failure of its own is a 500 that
shows the client nothing of the exception."""

from __future__ import annotations

import json
import logging

import httpx
import pytest

pytest.importorskip("uvicorn")

ONE = {"model": "tiny", "prompt": [5, 6], "max_tokens": 2, "temperature": 0}
CHAT = {
    "model": "tiny",
    "messages": [{"role": "user", "content": "daba"}],
    "max_tokens": 2,
    "temperature": 0,
}


def error_of(response: httpx.Response) -> dict:
    body = response.json()
    assert set(body) == {"error"} and set(body["error"]) == {"message", "type", "param", "code"}, (
        body
    )
    return body["error"]


def post_raw(base: str, route: str, raw: bytes) -> httpx.Response:
    return httpx.post(
        base + route, content=raw, headers={"Content-Type": "application/json"}, timeout=60
    )


@pytest.fixture
def base(serve):
    return serve("lookup")[1]


@pytest.mark.parametrize(
    "raw, param, words",
    [
        (b"[" * 100_000 + b"]" * 100_000, None, "nested deeper"),
        (b'{"prompt": ' + b"[" * 40 + b"]" * 40 + b"}", "prompt", "nested deeper"),
        (b'{"prompt": [5], "seed": ' + b"7" * 5000 + b"}", "seed", "out of range"),
        (b'{"prompt": [5], "max_tokens": 18446744073709551616}', "max_tokens", "out of range"),
        (b'{"prompt": [5], "temperature": 1e999}', "temperature", "out of range"),
        (b'{"prompt": [5], "temperature": 0.' + b"1" * 100 + b"}", "temperature", "longer than"),
        (b'{"prompt": [5], "top_p": NaN}', "top_p", "not a JSON number"),
        (b'{"prompt": [5], "top_p": -Infinity}', "top_p", "not a JSON number"),
        (b'{"prompt": "caf\\ud800"}', "prompt", "lone surrogate"),
        (b'{"prompt": ["\\udfff"]}', "prompt", "lone surrogate"),
        (b'{"prompt": [5], "stop": ["a", "\\ud83d"]}', "stop", "lone surrogate"),
        (b'{"prompt": [5], "\\ud800": 1}', None, "lone surrogate"),
        (b'{"prompt": "\xed\xa0\x80"}', None, "UTF-8"),
        (b'\xff\xfe{\x00}\x00', None, "UTF-8"),
        (b'\xef\xbb\xbf{"prompt": [5]}', None, "JSON"),
        (b'{"prompt": [5]', None, "JSON"),
        (b"", None, "JSON"),
        (b'"just a string"', None, "object"),
    ],
)
def test_malformed_bodies_are_400_naming_the_field(base, raw, param, words):
    response = post_raw(base, "/completions", raw)
    assert response.status_code == 400, response.text
    error = error_of(response)
    assert error["param"] == param and words in error["message"], error
    assert error["type"] == "invalid_request_error"


@pytest.mark.parametrize(
    "messages, words",
    [
        ([{"role": "user", "content": "caf\ud800"}], "messages[0].content"),
        ([{"role": "us\udc00er", "content": "hi"}], "messages[0].role"),
        (
            [{"role": "user", "content": [{"type": "text", "text": "\ud800"}]}],
            "messages[0].content[0].text",
        ),
        ([{"role": "wizard", "content": "hi"}], "role must be one of"),
        ([{"role": "user", "content": "hi", "name": "bob"}], "messages[0].name"),
        (
            [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}],
            "only text parts",
        ),
        (
            [{"role": "user", "content": [{"type": "text", "text": "a", "extra": 1}]}],
            "only text parts",
        ),
        ([{"role": "user", "content": 5}], "content must be"),
        (["hello"], "messages[0] must be"),
    ],
)
def test_bad_messages_are_400_naming_the_message(base, messages, words):
    raw = json.dumps(
        {**CHAT, "messages": messages}
    ).encode()  # ensure_ascii: lone surrogates as \\ud800 escapes
    response = post_raw(base, "/chat/completions", raw)
    assert response.status_code == 400, response.text
    error = error_of(response)
    assert error["param"] == "messages" and words in error["message"], error


@pytest.mark.parametrize(
    "route, field, value, code",
    [
        ("/chat/completions", "response_format", {"type": "json_object"}, "unsupported_parameter"),
        ("/chat/completions", "tool_choice", "auto", "unsupported_parameter"),
        (
            "/chat/completions",
            "tools",
            [{"type": "function", "function": {"name": "f"}}],
            "unsupported_parameter",
        ),
        ("/chat/completions", "parallel_tool_calls", False, "unsupported_parameter"),
        ("/chat/completions", "logprobs", True, "unsupported_parameter"),
        ("/chat/completions", "top_logprobs", 3, "unsupported_parameter"),
        ("/chat/completions", "presence_penalty", 0.5, "unsupported_parameter"),
        ("/chat/completions", "metadata", {"a": "b"}, "unsupported_parameter"),
        ("/chat/completions", "temprature", 0.5, "unknown_parameter"),
        ("/chat/completions", "prompt", "x", "unknown_parameter"),
        ("/completions", "best_of", 2, "unsupported_parameter"),
        ("/completions", "best_of", True, "unsupported_parameter"),
        ("/completions", "echo", True, "unsupported_parameter"),
        ("/completions", "logit_bias", {"5": 100}, "unsupported_parameter"),
        ("/completions", "response_format", {"type": "text"}, "unknown_parameter"),
        ("/completions", "messages", [], "unknown_parameter"),
        ("/completions", "frobnicate", 1, "unknown_parameter"),
    ],
)
def test_fields_not_honoured_are_refused_by_name(base, route, field, value, code):
    body = CHAT if route == "/chat/completions" else ONE
    response = httpx.post(base + route, json={**body, field: value})
    assert response.status_code == 400, response.text
    error = error_of(response)
    assert error["param"] == field and error["code"] == code, error


@pytest.mark.parametrize(
    "route, extra",
    [
        (
            "/chat/completions",
            {
                "response_format": {"type": "text"},
                "tool_choice": "none",
                "tools": [],
                "logprobs": False,
                "presence_penalty": 0,
                "frequency_penalty": 0.0,
                "user": "u1",
                "store": False,
            },
        ),
        (
            "/chat/completions",
            {"response_format": None, "tool_choice": None, "top_logprobs": None, "n": 1},
        ),
        (
            "/completions",
            {"best_of": 1, "echo": False, "suffix": None, "logprobs": None, "logit_bias": {}},
        ),
    ],
)
def test_neutral_values_of_unsupported_fields_are_accepted(base, route, extra):
    body = CHAT if route == "/chat/completions" else ONE
    response = httpx.post(base + route, json={**body, **extra})
    assert response.status_code == 200, response.text


@pytest.mark.parametrize(
    "field, value",
    [
        ("prompt", [5, 96]),
        ("prompt", [-1]),
        ("prompt", [[5, 10**6]]),
        ("stop_token_ids", [96]),
        ("stop_token_ids", list(range(300))),
        ("stop", ["x" * 2000]),
        ("model", 5),
        ("user", ["x"]),
        ("stream_options", {"include_usage": "yes"}),
        ("stream_options", {"continuous_usage_stats": True}),
    ],
)
def test_bad_ids_and_values_are_400(base, field, value):
    response = httpx.post(base + "/completions", json={**ONE, field: value})
    assert response.status_code == 400, response.text
    assert error_of(response)["param"] == field


def test_a_chat_template_that_refuses_is_400(serve, model_dir):
    server, base = serve("lookup")
    server.engine.chat_template = "{{ raise_exception('no system messages here') }}"
    response = httpx.post(base + "/chat/completions", json=CHAT)
    assert response.status_code == 400 and "chat template refused" in error_of(response)["message"]


def test_top_k_beyond_the_vocabulary_means_no_limit(base):
    def text(**extra):
        return httpx.post(
            base + "/completions",
            json={**ONE, "max_tokens": 6, "temperature": 0.8, "seed": 3, **extra},
        ).json()["choices"][0]["text"]

    assert text(top_k=10**18) == text()


def test_an_internal_error_is_logged_and_never_shown(serve, monkeypatch, caplog):
    from specdec.serving import app

    _, base = serve("lookup")

    def broken(*args, **kwargs):
        raise RuntimeError("secret detail /home/me/.cache")

    monkeypatch.setattr(app, "prepare", broken)
    with caplog.at_level(logging.ERROR, logger="specdec.serving"):
        response = httpx.post(base + "/completions", json=ONE)
    assert response.status_code == 500
    error = error_of(response)
    assert error["type"] == "server_error" and error["code"] == "internal_error"
    assert "secret" not in response.text and "RuntimeError" not in response.text
    ident = error["message"].rpartition("logged as ")[2].rstrip(")")
    assert any(
        ident in r.getMessage() and "secret detail" in (r.exc_text or "") for r in caplog.records
    )


def test_a_text_longer_than_the_context_can_hold_is_refused_before_it_is_tokenized(
    serve, monkeypatch
):
    from specdec.serving import prepare

    tokenize, tokenized = prepare.tokenize, []

    def counted(tokenizer, text):
        tokenized.append(len(text))
        return tokenize(tokenizer, text)

    monkeypatch.setattr(prepare, "tokenize", counted)
    server, base = serve("lookup")
    limit = prepare.max_prompt_chars(server.engine)
    assert limit == server.engine.context_length * prepare.CHARS_PER_TOKEN
    over = ("daba " * (limit // 5 + 1))[: limit + 1]
    chat = [{"role": "user", "content": over}]
    for route, body in (
        ("/completions", {**ONE, "prompt": over}),
        ("/chat/completions", {**CHAT, "messages": chat}),
    ):
        response = httpx.post(base + route, json=body, timeout=60)
        error = error_of(response)
        assert response.status_code == 400 and error["code"] == "context_length_exceeded"
        assert f"at most {limit})" in error["message"] and "characters" in error["message"]
    assert tokenized == []
    within = httpx.post(base + "/completions", json={**ONE, "prompt": over[:limit]}, timeout=60)
    assert error_of(within)["code"] == "context_length_exceeded" and tokenized == [limit]


def test_a_chat_template_over_its_budget_is_400_at_once_without_its_path(serve):
    from specdec.generation.chat import ChatTemplate

    server, base = serve("lookup")
    looping = "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}"
    server.engine.chat_template = ChatTemplate(
        "{% if messages|length > 1 %}" + looping + "{% endif %}{{ messages[0]['content'] }}",
        "/private/models/x/chat_template.jinja",
    )
    two = {**CHAT, "messages": CHAT["messages"] * 2}
    response = httpx.post(base + "/chat/completions", json=two, timeout=60)
    message = error_of(response)["message"]
    assert response.status_code == 400 and "budget" in message and "/private" not in message
    assert httpx.post(base + "/chat/completions", json=CHAT, timeout=60).status_code == 200
