"""One huge request, or a client that stalls mid-body, delays no other client: the body is parsed,
checked and tokenized on a worker thread, and the tokenizer lets go of the interpreter lock.

Counted, not timed: while a 3 MB prompt is being tokenized, another client's stream keeps
receiving tokens; while that request is then held on its worker thread (a test hook), the stream
goes on, /health answers and a small request is served."""

from __future__ import annotations

import json
import socket
import threading
import time

import httpx
import pytest

from specdec.serving.limits import Limits

pytest.importorskip("uvicorn")


class Stream:
    """A streamed completion read on its own thread; ``count`` is the events received so far."""

    def __init__(self, url: str, payload: dict):
        self.count, self.done, self.stop = 0, False, threading.Event()
        self.thread = threading.Thread(target=self._read, args=(url, payload), daemon=True)
        self.thread.start()

    def _read(self, url, payload):
        with httpx.stream("POST", url, json=payload, timeout=120) as response:
            for line in response.iter_lines():
                if line.startswith("data: {"):
                    self.count += 1
                if self.stop.is_set():
                    return
        self.done = True


def test_a_huge_request_and_a_stalled_client_do_not_stall_another_stream(
    serve, gate_drafter, monkeypatch, wait_for
):
    from specdec.serving import prepare

    class Paced(gate_drafter):
        """Plain decoding, a token per step and a step every 10 ms or more: a stream that lasts."""

        def propose(self, context):
            time.sleep(0.01)
            return super().propose(context)

    # the huge prompt is tokenized, as it is by a model whose context can hold it
    monkeypatch.setattr(prepare, "CHARS_PER_TOKEN", 10**6)
    server, base = serve(
        Paced(),
        slots=2,
        capacity=2048,
        server_options={"limits": Limits(max_body_bytes=16 * 1024 * 1024, body_timeout=120)},
    )
    tokenize, state = prepare.tokenize, {}
    entered, release = threading.Event(), threading.Event()

    def watched(tokenizer, text):
        if len(text) < 1_000_000:
            return tokenize(tokenizer, text)
        state["before"] = stream.count
        ids = tokenize(tokenizer, text)
        state["after"] = stream.count
        entered.set()
        assert release.wait(120), "the test never released the huge request"
        return ids

    monkeypatch.setattr(prepare, "tokenize", watched)

    stream = Stream(
        base + "/completions",
        {
            "model": "tiny",
            "prompt": [5, 6],
            "max_tokens": 2000,
            "temperature": 0,
            "stream": True,
            "ignore_eos": True,
        },
    )
    assert wait_for(lambda: stream.count >= 2), "the stream never started"
    stalled = socket.create_connection(("127.0.0.1", server.port), timeout=30)
    stalled.sendall(
        b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        b"Content-Length: 1000\r\n\r\n{\"prompt\": \"da"
    )  # and then nothing
    huge = json.dumps(
        {"model": "tiny", "prompt": "daba deba diba " * 200_000, "max_tokens": 4}
    ).encode()
    assert len(huge) > 3_000_000
    result = {}
    sender = threading.Thread(
        target=lambda: result.update(
            reply=httpx.post(
                base + "/completions",
                content=huge,
                headers={"Content-Type": "application/json"},
                timeout=300,
            )
        )
    )
    sender.start()
    try:
        assert entered.wait(240), "the huge prompt was never tokenized"
        # the huge request is held on its worker thread: everything else goes on
        held_at = stream.count
        assert wait_for(lambda: stream.count >= held_at + 3), (
            "the stream stalled behind the huge request"
        )
        assert httpx.get(base.removesuffix("/v1") + "/health", timeout=30).status_code == 200
        small = httpx.post(
            base + "/completions",
            json={"model": "tiny", "prompt": [7], "max_tokens": 2, "temperature": 0},
            timeout=60,
        )
        assert small.status_code == 200 and small.json()["usage"]["completion_tokens"] == 2
    finally:
        release.set()
        sender.join(300)
        stalled.close()
        stream.stop.set()
    assert not stream.done, (
        "the stream ended before the checks were made: it was too short to tell anything"
    )
    # a tokenizer holding the interpreter lock lets at most the event in flight through
    # (1 when tried)
    assert state["after"] - state["before"] >= 3, (
        "the stream stalled while the huge prompt was tokenized"
    )
    reply = result["reply"]
    assert reply.status_code == 400 and reply.json()["error"]["code"] == "context_length_exceeded"
    assert reply.json()["error"]["param"] == "prompt"


def test_large_bodies_are_prepared_one_at_a_time_and_small_ones_beside_them(
    serve, monkeypatch, wait_for
):
    from specdec.serving import prepare

    monkeypatch.setattr(prepare, "CHARS_PER_TOKEN", 10**6)  # the large prompts are tokenized
    server, base = serve(
        "lookup", server_options={"limits": Limits(max_body_bytes=16 * 1024 * 1024)}
    )
    tokenize, inside, release = prepare.tokenize, [], threading.Event()

    def held(tokenizer, text):
        if len(text) > 100_000:
            inside.append(text[:1])
            assert release.wait(120), "the test never released the large request"
        return tokenize(tokenizer, text)

    monkeypatch.setattr(prepare, "tokenize", held)
    replies = []

    def send(letter):
        raw = json.dumps(
            {"model": "tiny", "prompt": letter + " daba" * 120_000, "max_tokens": 2}
        ).encode()
        replies.append(
            httpx.post(
                base + "/completions",
                content=raw,
                headers={"Content-Type": "application/json"},
                timeout=300,
            )
        )

    first = threading.Thread(target=send, args=("a",))
    first.start()
    try:
        assert wait_for(lambda: len(inside) == 1), (
            "the first large request never reached the tokenizer"
        )
        second = threading.Thread(target=send, args=("b",))
        second.start()
        limiter = server.app.state.large_body_limiter
        assert wait_for(lambda: limiter[0].statistics().tasks_waiting == 1), (
            "the second did not wait its turn"
        )
        assert inside == ["a"]
        small = httpx.post(
            base + "/completions",
            json={"model": "tiny", "prompt": "daba", "max_tokens": 2},
            timeout=60,
        )
        assert small.status_code == 200  # a small body does not wait behind the large ones
    finally:
        release.set()
        first.join(300)
        second.join(300)
    assert inside == ["a", "b"] and [r.status_code for r in replies] == [400, 400]
