"""Through ``specdec.Engine``, a stateful drafter's ``end(slot, reason)`` is told why its request
ended: "stop" for a stop string (which only the engine sees), "length", "cancelled" for a
cancel and for a close without drain (the Decoder's reasons:
``tests/core/test_drafter_end_reason.py``).
The random target repeats its last token: prompt [1, 2, 3] gives 25, 18, 18, ... ("laba goba").
"""

from __future__ import annotations

import threading

import numpy as np

import specdec

A, B = [1, 2, 3], [4, 5]


class Reasons:
    """A stateful drafter that drafts nothing and records ``begin`` and ``end(slot, reason)``;
    its ``propose`` waits while ``open`` is clear (``proposing`` set): the engine is held in a
    step."""

    caps = specdec.DrafterCaps(stateful=True)

    def __init__(self):
        self.events = []
        self.open, self.proposing = threading.Event(), threading.Event()
        self.open.set()

    def begin(self, slot, prompt, output):
        self.events.append(("begin", tuple(prompt.tolist())))

    def propose(self, context):
        self.proposing.set()
        assert self.open.wait(60), "the gate stayed closed"
        self.proposing.clear()
        roots = np.asarray(context.root_tokens)
        return specdec.Draft(root_tokens=context.root_tokens, beams=roots[:, None, None])

    def observe(self, accepted):
        pass

    def end(self, slot, reason):
        self.events.append(("end", reason))


def ends(drafter):
    return [reason for kind, reason in drafter.events if kind == "end"]


def test_the_engine_tells_a_stop_string_a_length_a_cancel_and_a_close(make_engine):
    drafter = Reasons()
    engine = make_engine(drafter, slots=1)
    try:
        stopped = engine.submit(A, max_new_tokens=40, stop="goba")  # its second token completes it
        assert stopped.result(timeout=30).finish_reason == "stop"
        assert engine.generate(B, max_new_tokens=2).finish_reason == "length"
        assert ends(drafter) == ["stop", "length"]
        drafter.open.clear()
        running = engine.submit(A, max_new_tokens=40)
        assert drafter.proposing.wait(10)  # held in its first decode step
        running.cancel()
        drafter.open.set()
        assert running.result(timeout=30).finish_reason == "cancelled"
        assert ends(drafter)[2:] == ["cancelled"]
        drafter.open.clear()
        last = engine.submit(A, max_new_tokens=40)
        assert drafter.proposing.wait(10)
        closer = threading.Thread(target=engine.close, kwargs={"drain": False})
        closer.start()
        while not engine.stats()["closing"]:
            closer.join(0.01)
        drafter.open.set()
        closer.join(30)
        assert last.result(timeout=30).finish_reason == "cancelled"
        assert ends(drafter)[3:] == ["cancelled"]
    finally:
        drafter.open.set()
