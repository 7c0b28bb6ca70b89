"""A stateful drafter's ``end(slot, reason)`` is told why its request ended, and one written as
``end(slot)`` before the reason existed still works (``specdec.capabilities.request_end``).

On the Decoder (the float64 reference, one step per call; the Engine's reasons are tested in
``tests/serving/test_drafter_end.py``): a request that reaches ``max_new_tokens`` ends with
"length", a stop token with "stop", a cancel or a close with "cancelled", a request whose step
fails with "error". The random target repeats its last token: prompt [1, 2, 3] gives 25, 18, 18,
..., prompt [4, 5] gives 21, 21, ...
"""

from __future__ import annotations

import attrs
import numpy as np
import pytest

import specdec
from specdec.capabilities import ends_with_reason, request_end
from specdec.decode.loop import Decoder
from specdec.reference.model import load_target
from specdec.testing.requests import decoding_plan

A, B = [1, 2, 3], [4, 5]


class Reasons:
    """A stateful drafter that drafts nothing and records ``begin`` and ``end(slot, reason)``."""

    def __init__(self, prompt_states=True):
        self.caps = specdec.DrafterCaps(stateful=True, prompt_states=prompt_states)
        self.events = []

    def begin(self, slot, prompt, output):
        self.events.append(("begin", tuple(prompt.tolist())))

    def propose(self, context):
        roots = np.asarray(context.root_tokens)
        return specdec.Draft(root_tokens=context.root_tokens, beams=roots[:, None, None])

    def observe(self, accepted):
        pass

    def end(self, slot, reason):
        self.events.append(("end", reason))


class OldEnd(Reasons):
    """The same, with the ``end(slot)`` of drafters written before the reason existed."""

    def end(self, slot):
        self.events.append(("end", None))


class FailingFor:
    """The plan's verifier, raising for requests sampled at ``temperature``."""

    def __init__(self, inner, temperature):
        self.inner, self.temperature, self.caps = inner, temperature, inner.caps

    def verify(self, tree, draft, target, sampling, uniforms):
        if sampling.temperature == self.temperature:
            raise RuntimeError("this verifier fails for these requests")
        return self.inner.verify(tree, draft, target, sampling, uniforms)


def test_the_signature_says_whether_end_takes_the_reason():
    class Old:
        def end(self, slot): ...

    class New:
        def end(self, slot, reason): ...

    class Optional:
        def end(self, slot, reason=None): ...

    class Varargs:
        def end(self, slot, *args): ...

    kinds = (Old, New, Optional, Varargs)
    assert [ends_with_reason(kind()) for kind in kinds] == [False, True, True, True]
    assert not ends_with_reason(object())
    calls = []
    old, new = Old(), New()
    old.end = lambda slot: calls.append(("old", slot))
    new.end = lambda slot, reason: calls.append(("new", slot, reason))
    request_end(old)(3, "stop"), request_end(new)(4, "length")
    assert calls == [("old", 3), ("new", 4, "length")]


def decoder(model_dir, drafter, slots=1, failing=None):
    plan = decoding_plan(load_target(model_dir, slots=slots, capacity=64), drafter)
    if failing is not None:
        plan = attrs.evolve(plan, verifier=FailingFor(plan.verifier, failing))
    return Decoder(plan)


def run(decoder, failures=None):
    for _ in range(50):
        if decoder.idle:
            return
        decoder.step(failures=failures)
    raise AssertionError("the decoder did not finish")


@pytest.mark.parametrize("prompt_states", [True, False])
def test_end_is_told_length_stop_cancelled_and_error(model_dir, prompt_states):
    drafter = Reasons(prompt_states)
    d = decoder(model_dir, drafter, slots=2)
    d.submit(specdec.Request(prompt=A, max_new_tokens=3))
    d.submit(specdec.Request(prompt=B, max_new_tokens=10, stop_token_ids=(21,)))  # its first token
    run(d)
    ends = sorted(e for e in drafter.events if e[0] == "end")
    assert ends == [("end", "length"), ("end", "stop")]
    drafter.events.clear()
    cancelled = d.submit(specdec.Request(prompt=A, max_new_tokens=20))
    d.step(), d.step()
    assert d.cancel(cancelled) and drafter.events == [("begin", tuple(A)), ("end", "cancelled")]
    drafter.events.clear()
    d.submit(specdec.Request(prompt=A, max_new_tokens=20))
    d.step()
    d.close()
    assert drafter.events == [("begin", tuple(A)), ("end", "cancelled")]

    drafter = Reasons(prompt_states)
    d, failures = decoder(model_dir, drafter, failing=0.7), []
    sampled = specdec.SamplingConfig(temperature=0.7)
    d.submit(specdec.Request(prompt=A, max_new_tokens=8, sampling=sampled, seed=1))
    run(d, failures)
    assert len(failures) == 1 and drafter.events == [("begin", tuple(A)), ("end", "error")]


def test_a_drafter_whose_end_takes_no_reason_still_works(model_dir):
    drafter = OldEnd()
    d = decoder(model_dir, drafter)
    d.submit(specdec.Request(prompt=A, max_new_tokens=3))
    cancelled = d.submit(specdec.Request(prompt=B, max_new_tokens=9))
    while cancelled not in [rid for rid, _ in d.table.active.values()]:
        d.step()
    d.cancel(cancelled)
    assert drafter.events == [
        ("begin", tuple(A)),
        ("end", None),
        ("begin", tuple(B)),
        ("end", None),
    ]
    plain = specdec.generate(model_dir, A, drafter="none", backend="numpy", max_new_tokens=6)
    old = specdec.generate(model_dir, A, drafter=OldEnd(), backend="numpy", max_new_tokens=6)
    assert old.tokens == plain.tokens


def test_a_request_cancelled_while_its_prompt_is_prefilled_never_begins(model_dir):
    drafter = Reasons(prompt_states=False)
    d = decoder(model_dir, drafter)
    request = d.submit(specdec.Request(prompt=list(range(1, 11)), max_new_tokens=4))
    d.step(max_prefill_tokens=3)  # the first of four chunks
    assert d.cancel(request) and drafter.events == [] and not d.plan.target.cache.admitted.any()
