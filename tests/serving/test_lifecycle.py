"""Through ``specdec.Engine`` and the server: a request that is cancelled, stopped by a stop string
or ended by its client leaving frees its slot before the engine's next step, and no later forward
holds a row for it.

Step-counted and deterministic: every forward of the engine's target is recorded (on the engine's
thread) as the requests, by prompt, that its prompt chunks and tree rows belong to. The engine is
held inside a step by a gate in its drafter's ``propose``; what the test asks meanwhile (a cancel,
a second request) is queued and read when that step ends, before the next one. With one slot, the
waiting request must then be prefilled in the very next forward. The random target repeats its
last token: prompt [1, 2, 3] gives 25, 18, 18, ... ("laba goba goba ..."), [4, 5] gives 21, 21, ...
"""

from __future__ import annotations

import json
import socket

import httpx
import numpy as np

import specdec

A, B = (1, 2, 3), (4, 5)
WAIT = 60  # seconds an event may take on a loaded machine: these tests count steps, never time them


class Forwards:
    """Records the forwards and admissions of ``target``: ``log`` holds ``(kind, prompts of its
    chunks, prompts of its tree rows)`` each, a row named by the prompt that claimed its slot."""

    def __init__(self, target):
        self.log, self.owner, self.inside = [], {}, False
        forward, admit = target.forward_tree, target.admit

        def forward_tree(tree, slots, *, context=(), layers=()):
            if (
                not self.inside
            ):  # the reference's admit runs its prompt as chunks: recorded as the admission
                for slot, tokens in context:
                    self.owner[int(slot)] = tuple(int(t) for t in tokens)
                rows = [] if tree is None else [self.owner[int(s)] for s in np.asarray(slots)]
                self.log.append(
                    ("forward", [tuple(int(t) for t in tokens) for _, tokens in context], rows)
                )
            return forward(tree, slots, context=context, layers=layers)

        def admitting(slot, prompt, *, layers=()):
            self.owner[int(slot)] = tuple(prompt)
            self.log.append(("admit", [tuple(prompt)], []))
            self.inside = True
            try:
                return admit(slot, prompt, layers=layers)
            finally:
                self.inside = False

        target.forward_tree, target.admit = forward_tree, admitting


def chunk(prompt):
    return ("forward", [prompt], [])


def row(prompt):
    return ("forward", [], [prompt])


def hold_in_first_decode_step(engine, gate):
    """Submit A (40 tokens) and B (2 tokens) to a one-slot engine held in A's first decode step:
    A's prefill has run, its first decode step waits in ``propose``, B waits for the slot."""
    gate.open.clear()
    first = engine.submit(list(A), max_new_tokens=40)
    assert gate.proposing.wait(WAIT), "the engine never reached A's first decode step"
    second = engine.submit(list(B), max_new_tokens=2)
    assert engine.stats()["waiting"] == 1
    return first, second


def test_an_engine_cancel_frees_the_slot_before_the_next_step(make_engine, gate):
    engine = make_engine(gate, slots=1)
    forwards = Forwards(engine.target)
    first, second = hold_in_first_decode_step(engine, gate)
    first.cancel()  # queued: read when the held step ends
    gate.open.set()
    assert second.result(timeout=30).tokens == (21, 21)
    assert first.result(timeout=30).finish_reason == "cancelled"
    assert forwards.log == [chunk(A), row(A), chunk(B), row(B)], "A held a row after its cancel"
    assert not engine.target.cache.admitted.any()


def test_an_engine_cancel_tells_a_stateful_drafter_before_the_next_step(make_engine, gate_drafter):
    class StatefulGate(gate_drafter):
        """The gate, stateful: its requests are admitted whole, and it records ``end``."""

        caps = specdec.DrafterCaps(stateful=True)

        def __init__(self):
            super().__init__()
            self.events = []

        def begin(self, slot, prompt, output):
            self.events.append(("begin", tuple(prompt.tolist())))

        def observe(self, accepted):
            pass

        def end(self, slot):
            self.events.append(("end", slot))

    drafter = StatefulGate()
    engine = make_engine(drafter, slots=1)
    forwards = Forwards(engine.target)
    try:
        first, second = hold_in_first_decode_step(
            engine, drafter
        )  # held before the forward of A's admission step
        first.cancel()
        drafter.open.set()
        assert second.result(timeout=30).tokens == (21, 21)
    finally:
        drafter.open.set()
    assert forwards.log == [("admit", [A], []), row(A), ("admit", [B], []), row(B)], forwards.log
    assert drafter.events == [("begin", A), ("end", 0), ("begin", B), ("end", 0)]


def test_a_stop_string_frees_the_slot_before_the_next_step(make_engine, gate):
    engine = make_engine(gate, slots=1)
    forwards = Forwards(engine.target)
    gate.open.clear()
    first = engine.submit(list(A), max_new_tokens=40, stop="goba")  # its second token
    assert gate.proposing.wait(WAIT)
    second = engine.submit(list(B), max_new_tokens=2)
    gate.open.set()
    assert first.result(timeout=30).finish_reason == "stop" and first.result().text == " laba "
    assert second.result(timeout=30).tokens == (21, 21)
    assert forwards.log == [chunk(A), row(A), chunk(B), row(B)], (
        "A held a row after its stop string"
    )


def test_a_client_leaving_mid_stream_frees_the_slot_before_the_next_step(serve, gate, cancel_asked):
    server, base = serve(gate, slots=1)
    forwards = Forwards(server.engine.target)
    gate.open.clear()
    with httpx.stream(
        "POST",
        base + "/completions",
        json={
            "model": "tiny",
            "prompt": list(A),
            "max_tokens": 40,
            "stream": True,
            "temperature": 0,
        },
    ) as response:
        # the iterator is held: a dropped one is closed when collected, and closes the connection
        lines = response.iter_lines()
        first = next(line for line in lines if line)
        assert json.loads(first[6:])["choices"][0]["text"] == " laba"
        assert gate.proposing.wait(WAIT)
    assert cancel_asked.wait(WAIT), "the server did not notice that its client left"
    gate.open.set()  # the held step ends, then the cancel is read
    reply = httpx.post(
        base + "/completions",
        json={"model": "tiny", "prompt": list(B), "max_tokens": 2, "temperature": 0},
        timeout=30,
    )
    assert reply.status_code == 200 and reply.json()["usage"]["completion_tokens"] == 2
    assert forwards.log == [chunk(A), row(A), chunk(B), row(B)], (
        "A held a row after its client left"
    )


def test_a_client_leaving_a_plain_request_frees_the_slot_before_the_next_step(
    serve, gate, cancel_asked
):
    server, base = serve(gate, slots=1)
    forwards = Forwards(server.engine.target)
    gate.open.clear()
    body = json.dumps({"model": "tiny", "prompt": list(A), "max_tokens": 40}).encode()
    with socket.create_connection(("127.0.0.1", server.port), timeout=30) as connection:
        connection.sendall(
            b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(body) + body
        )
        assert gate.proposing.wait(WAIT), "the request never reached its first decode step"
    assert cancel_asked.wait(WAIT), "the server did not notice that its client left"
    gate.open.set()
    reply = httpx.post(
        base + "/completions",
        json={"model": "tiny", "prompt": list(B), "max_tokens": 2},
        timeout=30,
    )
    assert reply.status_code == 200 and reply.json()["usage"]["completion_tokens"] == 2
    assert forwards.log == [chunk(A), row(A), chunk(B), row(B)], (
        "A held a row after its client left"
    )
