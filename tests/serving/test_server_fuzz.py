"""The server under Hypothesis: request bodies of every JSON shape, type, size and encoding
(plausible fields with wrong values, unknown fields, lone surrogates, numbers past 64 bits,
NaN, deep nesting, bytes that are not UTF-8, truncated JSON, other content types), on both
completion routes. None is answered 5xx; every refusal is an OpenAI-shaped error; every
acceptance a well-formed reply; and afterwards a normal request is answered as ``generate``
answers it. Deterministic (derandomized) and bounded in examples."""

from __future__ import annotations

import collections
import json

import httpx
import pytest

import specdec
from specdec.serving.limits import Limits

pytest.importorskip("uvicorn")
from hypothesis import HealthCheck, given, settings, strategies as st  # noqa: E402

SURROGATES = st.characters(min_codepoint=0xD800, max_codepoint=0xDFFF, exclude_categories=())
# joined from a list: st.text leaves surrogates out of a mixed alphabet
TEXT = st.lists(st.characters() | SURROGATES, max_size=12).map("".join) | st.sampled_from(
    ["daba deba", "", " ", "\x00", "\ufffd"]
)
INTS = (
    st.integers(-3, 120) | st.integers() | st.sampled_from([2**63 - 1, 2**63, -(2**63) - 1, 10**30])
)
FLOATS = st.floats(allow_nan=True, allow_infinity=True) | st.floats(-1, 3)
SCALARS = st.none() | st.booleans() | INTS | FLOATS | TEXT
VALUES = st.recursive(
    SCALARS,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(TEXT, inner, max_size=4),
    max_leaves=10,
)
ROLES = st.sampled_from(["user", "system", "assistant", "tool", "developer", "", "USER"]) | TEXT
PARTS = st.lists(
    st.fixed_dictionaries(
        {"type": st.sampled_from(["text", "image_url"]) | TEXT, "text": TEXT | VALUES}
    ),
    max_size=3,
)
MESSAGE = st.fixed_dictionaries(
    {},
    optional={"role": ROLES | VALUES, "content": TEXT | PARTS | VALUES, "name": TEXT | st.none()},
)
FIELDS = {
    "model": st.sampled_from(["tiny", "gpt-4"]) | VALUES,
    "prompt": TEXT
    | st.lists(st.integers(-2, 100), max_size=6)
    | st.lists(st.lists(st.integers(0, 99), max_size=3), max_size=2)
    | VALUES,
    "messages": st.lists(MESSAGE, max_size=3) | VALUES,
    "max_tokens": st.integers(-1, 6) | VALUES,
    "max_completion_tokens": st.integers(0, 6) | VALUES,
    "temperature": st.floats(-0.5, 2.5) | VALUES,
    "top_p": st.floats(-0.1, 1.1) | VALUES,
    "top_k": st.integers(-2, 200) | VALUES,
    "seed": INTS | VALUES,
    "n": st.integers(0, 2) | VALUES,
    "stop": TEXT | st.lists(TEXT, max_size=3) | VALUES,
    "stream": st.booleans() | VALUES,
    "stream_options": st.fixed_dictionaries({}, optional={"include_usage": st.booleans() | VALUES})
    | VALUES,
    "stop_token_ids": st.lists(st.integers(-1, 100), max_size=3) | VALUES,
    "ignore_eos": st.booleans() | VALUES,
    "user": TEXT | VALUES,
    "logprobs": VALUES,
    "echo": VALUES,
    "response_format": VALUES,
    "tools": VALUES,
    "tool_choice": VALUES,
    "presence_penalty": VALUES,
    "logit_bias": VALUES,
    "best_of": VALUES,
}
VALID = [
    ("/completions", {"model": "tiny", "prompt": [5, 6], "max_tokens": 3, "temperature": 0}),
    ("/completions", {"prompt": "daba deba", "max_tokens": 2, "stream": True}),
    (
        "/chat/completions",
        {"model": "tiny", "messages": [{"role": "user", "content": "daba"}], "max_tokens": 3},
    ),
    (
        "/chat/completions",
        {
            "messages": [{"role": "system", "content": "x"}, {"role": "user", "content": "y"}],
            "max_tokens": 2,
            "stream": True,
            "stream_options": {"include_usage": True},
        },
    ),
]
# the prompt's fields, whose values reach the tokenizer and the chat template, changed most often
CHANGED_KEYS = sorted(FIELDS) + ["prompt", "messages", "stop"] * 8
CHANGES = st.sampled_from(CHANGED_KEYS).flatmap(
    lambda key: st.tuples(st.just(key), FIELDS[key])
) | st.tuples(TEXT, VALUES)
ROUTES = st.sampled_from(["/completions", "/chat/completions"])


def _changed(valid, changes, drop):
    route, body = valid
    body = {**body, **dict(changes)}
    for key in drop:
        body.pop(key, None)
    return route, body


# a valid body with a field or two changed, added or dropped; or a body of any fields; or any object
REQUESTS = st.builds(
    _changed,
    st.sampled_from(VALID),
    st.lists(CHANGES, max_size=2),
    st.lists(st.sampled_from(sorted(FIELDS)), max_size=1),
) | st.tuples(
    ROUTES, st.fixed_dictionaries({}, optional=FIELDS) | st.dictionaries(TEXT, VALUES, max_size=3)
)
ENCODINGS = st.sampled_from(
    ["ascii"] * 8
    + [
        "utf-8",
        "truncated",
        "deep",
        "long-number",
        "bytes",
        "not-an-object",
        "padded",
        "long-prompt",
    ]
)
LIMIT = (
    100_000  # the fuzzed server's body limit, so that "padded" and "long-prompt" bodies cross it
)
CONTENT_TYPES = st.sampled_from(
    ["application/json"] * 16 + ["text/plain", "application/json; charset=utf-16", ""]
)


def encode(body: dict, how: str, cut: int, junk: bytes) -> bytes:
    if how == "utf-8":  # raw UTF-8, surrogates as the bytes a lax encoder writes
        return json.dumps(body, ensure_ascii=False).encode("utf-8", "surrogatepass")
    if how == "truncated":
        raw = json.dumps(body).encode()
        return raw[: cut % (len(raw) + 1)]
    if how == "deep":
        return b'{"prompt": ' + b"[" * (cut * 50) + b"]" * (cut * 50) + b"}"
    if how == "long-number":
        return b'{"prompt": [5], "max_tokens": 1' + b"0" * (cut * 40) + b"}"
    if how == "bytes":
        return junk
    if how == "padded":  # whitespace around the JSON: 1 KB to 200 KB, over the limit from 100 KB
        return b" " * (cut * 5000) + json.dumps(body).encode()
    if how == "long-prompt":  # a prompt longer than the context, under the limit or over it
        return json.dumps({**body, "prompt": "daba " * (cut * 600)}).encode()
    if how == "not-an-object":
        return json.dumps(list(body.values())).encode()
    return json.dumps(body).encode()  # ascii: lone surrogates as \\udXXX escapes, NaN as NaN


def check_reply(response: httpx.Response, streamed: bool) -> str:
    """The kind of a reply, having checked its shape."""
    assert response.status_code < 500, (response.status_code, response.text[:500])
    if response.status_code != 200:
        body = response.json()
        assert set(body) == {"error"} and set(body["error"]) == {
            "message",
            "type",
            "param",
            "code",
        }, body
        assert isinstance(body["error"]["message"], str) and body["error"]["message"], body
        assert "Traceback" not in body["error"]["message"]
        return f"{response.status_code} {body['error']['code'] or body['error']['type']}"
    if response.headers["content-type"].startswith("text/event-stream"):
        events = response.text.split("\n\n")
        assert events[-2:] == ["data: [DONE]", ""], response.text[-200:]
        for event in events[:-2]:
            payload = json.loads(event.removeprefix("data: "))
            assert "error" not in payload, payload
        return "200 stream"
    assert not streamed
    body = response.json()
    assert body["choices"] and body["usage"]["total_tokens"] >= 1, body
    return "200"


def test_no_body_reaches_a_5xx_and_every_error_is_openai_shaped(serve, model_dir):
    server, base = serve("lookup", slots=2, server_options={"limits": Limits(max_body_bytes=LIMIT)})
    seen = collections.Counter()
    client = httpx.Client(timeout=60)

    @settings(
        max_examples=500,
        derandomize=True,
        database=None,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )
    @given(
        request=REQUESTS,
        how=ENCODINGS,
        cut=st.integers(1, 40),
        junk=st.binary(max_size=40),
        content_type=CONTENT_TYPES,
    )
    def one(request, how, cut, junk, content_type):
        route, body = request
        raw = encode(body, how, cut, junk)
        headers = {"Content-Type": content_type} if content_type else {}
        response = client.post(base + route, content=raw, headers=headers)
        seen[check_reply(response, body.get("stream") is True)] += 1

    try:
        one()
    finally:
        client.close()
    print(f"\nfuzzed {sum(seen.values())} requests:", dict(sorted(seen.items())))
    assert (
        seen["200"] + seen["200 stream"] > 0
        and sum(n for k, n in seen.items() if k.startswith("400")) > 0
    )
    assert server.engine.stats()["alive"]
    reply = httpx.post(
        base + "/completions",
        json={"model": "tiny", "prompt": [5, 6, 7], "max_tokens": 8, "temperature": 0},
        timeout=60,
    )
    alone = specdec.generate(
        model_dir, [5, 6, 7], drafter="lookup", backend="numpy", max_new_tokens=8
    )
    assert reply.status_code == 200 and reply.json()["choices"][0]["text"] == " " + alone.text
    assert reply.json()["usage"]["completion_tokens"] == 8
