"""A request that ends frees its slot in the step it ends, counted step by step on the Decoder.

Every target forward is recorded as the requests it holds a prompt chunk or a tree row for (and
every whole-prompt ``admit`` of a stateful drafter's request), per ``Decoder.step`` call. With one
slot and a second request waiting, a slot released late shows at once: the waiting request must
be admitted in the very step after the first one ends, and no later forward may hold a row for
the request that ended. A request ends by finishing (``max_new_tokens``), by a stop token, by
``Decoder.cancel`` between steps, or by failing (``step(failures=...)``); a stateful drafter is
told (``end``) in that same step. Deterministic: the Decoder runs on the test's thread, one step
per call, on the float64 reference; the random target repeats its last token, so greedy tokens
are known (prompt [1, 2, 3] gives 25, 18, 18, ...).
"""

from __future__ import annotations

import attrs
import numpy as np
import pytest

import specdec
from specdec.decode.loop import Decoder
from specdec.reference.model import load_target
from specdec.testing.requests import decoding_plan

A, B = [1, 2, 3], [4, 5]  # A's greedy tokens: 25, 18, 18, ...


class EndRecorder:
    """A stateful drafter that drafts nothing and records ``begin`` and ``end`` with the step."""

    caps = specdec.DrafterCaps(stateful=True)

    def __init__(self):
        self.events, self.step = [], 0

    def begin(self, slot, prompt, output):
        self.events.append((self.step, "begin", tuple(prompt.tolist())))

    def propose(self, context):
        return specdec.Draft(
            root_tokens=context.root_tokens, beams=np.asarray(context.root_tokens)[:, None, None]
        )

    def observe(self, accepted):
        pass

    def end(self, slot):
        self.events.append((self.step, "end", slot))


class FailingFor:
    """The plan's verifier, raising for requests sampled at ``temperature``."""

    def __init__(self, inner, temperature):
        self.inner, self.temperature, self.caps = inner, temperature, inner.caps

    def verify(self, tree, draft, target, sampling, uniforms):
        if sampling.temperature == self.temperature:
            raise RuntimeError("this verifier fails for these requests")
        return self.inner.verify(tree, draft, target, sampling, uniforms)


class Steps:
    """A Decoder over a reference target with ``slots`` slots, each step's forwards recorded.

    ``log[i]``: the forwards (and admissions) of the i-th ``step()``, each ``(kind, request ids
    of its chunks, request ids of its tree rows)``; ``free[i]``: whether every slot was free
    after it."""

    def __init__(self, model_dir, drafter="none", slots=1, failing=None):
        self.target = target = load_target(model_dir, slots=slots, capacity=64)
        plan = decoding_plan(target, drafter)
        if failing is not None:
            plan = attrs.evolve(plan, verifier=FailingFor(plan.verifier, failing))
        self.decoder, self.drafter = Decoder(plan), drafter
        self.ids, self.log, self.free, self.admitting = {}, [], [], False
        self.failures = None if failing is None else []  # None: what a step raises is raised
        forward, admit = target.forward_tree, target.admit

        def forward_tree(tree, slots, *, context=(), layers=()):
            if (
                self.admitting
            ):  # the reference's admit runs its prompt as chunks: recorded as the admission
                return forward(tree, slots, context=context, layers=layers)
            active = self.decoder.table.active
            rows = [] if tree is None else [active[int(s)][0] for s in slots]
            self.log[-1].append(("forward", [active[int(s)][0] for s, _ in context], rows))
            return forward(tree, slots, context=context, layers=layers)

        def admitting(slot, prompt, *, layers=()):
            self.log[-1].append(("admit", [self.ids[tuple(prompt)]], []))
            self.admitting = True
            try:
                return admit(slot, prompt, layers=layers)
            finally:
                self.admitting = False

        target.forward_tree, target.admit = forward_tree, admitting

    def submit(self, prompt, **settings) -> int:
        request_id = self.decoder.submit(specdec.Request(prompt=prompt, **settings))
        self.ids[tuple(prompt)] = request_id
        return request_id

    def step(self) -> list[tuple]:
        self.log.append([])
        if isinstance(self.drafter, EndRecorder):
            self.drafter.step = len(self.log)
        self.decoder.step(failures=self.failures)
        self.free.append(not self.target.cache.admitted.any())
        return self.log[-1]

    def run(self) -> list[list[tuple]]:
        while not self.decoder.idle:
            self.step()
            assert len(self.log) < 50, "the decoder did not finish"
        return self.log

    def holding(self, request_id: int) -> list[int]:
        """The steps (1-based) whose forwards or admissions hold a chunk or a row for
        ``request_id``."""
        return [
            i + 1 for i, step in enumerate(self.log) if any(request_id in c + r for _, c, r in step)
        ]


def chunk(request):
    return [("forward", [request], [])]


def row(*requests):
    return [("forward", [], list(requests))]


def test_a_finished_request_frees_its_slot_in_its_last_step_and_the_next_request_takes_it(
    model_dir,
):
    steps = Steps(model_dir)
    a, b = steps.submit(A, max_new_tokens=3), steps.submit(B, max_new_tokens=2)
    assert steps.run() == [chunk(a), row(a), row(a), chunk(b), row(b)], (
        "one forward per step, B right after A"
    )
    assert steps.free == [False, False, True, False, True], (
        "A's slot is free after the step of its third token"
    )


def test_with_two_slots_the_waiting_request_is_admitted_beside_the_running_one(model_dir):
    steps = Steps(model_dir, slots=2)
    a, c = steps.submit(A, max_new_tokens=2), steps.submit([6, 7], max_new_tokens=5)
    b = steps.submit(B, max_new_tokens=2)
    log = steps.run()
    assert log[:4] == [[("forward", [a, c], [])], row(a, c), [("forward", [b], [c])], row(b, c)], (
        log
    )
    assert (
        steps.holding(a) == [1, 2]
        and steps.holding(b) == [3, 4]
        and steps.holding(c) == [1, 2, 3, 4, 5]
    )


def test_a_stop_token_ends_the_request_in_that_step(model_dir):
    steps = Steps(model_dir)
    a = steps.submit(A, max_new_tokens=10, stop_token_ids=(18,))  # its second token
    b = steps.submit(B, max_new_tokens=2)
    assert steps.run() == [chunk(a), row(a), chunk(b), row(b)]
    assert steps.free == [False, True, False, True]


def test_a_request_cancelled_between_steps_frees_its_slot_at_once(model_dir):
    steps = Steps(model_dir)
    a, b = steps.submit(A, max_new_tokens=20), steps.submit(B, max_new_tokens=2)
    steps.step(), steps.step()
    assert steps.decoder.cancel(a) and not steps.target.cache.admitted.any(), (
        "cancel frees the slot before any step"
    )
    assert steps.run()[2:] == [chunk(b), row(b)] and steps.holding(a) == [1, 2]


def test_a_request_that_fails_frees_its_slot_in_the_failing_step(model_dir):
    steps = Steps(model_dir, failing=0.7)
    a = steps.submit(A, max_new_tokens=8, sampling=specdec.SamplingConfig(temperature=0.7), seed=1)
    b = steps.submit(B, max_new_tokens=2)
    assert steps.run() == [chunk(a), row(a), chunk(b), row(b)]
    assert [request for request, _ in steps.failures] == [a] and steps.free == [
        False,
        True,
        False,
        True,
    ]


@pytest.mark.parametrize("ending", ["finish", "stop", "cancel", "fail"])
def test_a_stateful_drafter_is_told_in_the_step_its_request_ends(model_dir, ending):
    """Stateful drafters' requests are admitted whole (``admit``) before the step's forward: the
    waiting request's admission comes in the step after the first one ends, and ``end`` in it."""
    recorder = EndRecorder()
    steps = Steps(model_dir, drafter=recorder, failing=0.7 if ending == "fail" else None)
    settings = {
        "finish": dict(max_new_tokens=3),
        "stop": dict(max_new_tokens=10, stop_token_ids=(18,)),
        "cancel": dict(max_new_tokens=20),
        "fail": dict(max_new_tokens=8, sampling=specdec.SamplingConfig(temperature=0.7), seed=1),
    }[ending]
    a, b = steps.submit(A, **settings), steps.submit(B, max_new_tokens=2)
    admit_a = [("admit", [a], [])]
    if ending == "cancel":
        steps.step()
        recorder.step = "between steps"
        assert steps.decoder.cancel(a)
        last = "between steps"
        expected_a = [admit_a + row(a)]
    else:
        last = {"finish": 2, "stop": 1, "fail": 1}[
            ending
        ]  # the step whose forward gave A's last token
        expected_a = [admit_a + row(a)] + [row(a)] * (last - 1)
    log = steps.run()
    assert log == expected_a + [[("admit", [b], [])] + row(b)], log
    assert [e for e in recorder.events if e[1] == "end"] == [
        (last, "end", 0),
        (len(log), "end", 0),
    ], recorder.events
