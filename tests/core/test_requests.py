"""Requests over target slots (specdec.decode.loop.Decoder): a request's tokens do not depend on
what else shares its steps, or when others arrive, finish or are cancelled; stateful drafters see
every request begin, every accepted token with its hidden state, and every request end.

Exact by construction: the float64 reference runs each tree row alone (specdec.reference.model),
each request draws from its own generator, and the drafters here are integer-exact on the host
(none, lookup) or greedy (where the output is the target's whatever is drafted).
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import specdec
from specdec.decode.loop import Decoder
from specdec.reference.model import load_target
from specdec.testing import make_random_drafter
from specdec.testing.requests import decoding_plan, run_schedule

SAMPLINGS = [
    specdec.SamplingConfig(),
    specdec.SamplingConfig(temperature=0.8),
    specdec.SamplingConfig(temperature=1.2, top_k=20),
]


@pytest.fixture(scope="module")
def redrafter(model_dir, tmp_path_factory):
    return make_random_drafter(
        tmp_path_factory.mktemp("requests") / "redrafter", model_dir, kind="redrafter", seed=3
    )


def run(plan, schedule, budget=None) -> dict[int, list[int]]:
    tokens = run_schedule(plan, schedule, max_prefill_tokens=budget)
    assert not plan.target.cache.admitted.any(), "every slot is free at the end"
    return tokens


requests = st.builds(
    lambda prompt, sampling, seed, new: specdec.Request(
        prompt=prompt, sampling=sampling, seed=seed, max_new_tokens=new
    ),
    st.one_of(
        st.lists(st.integers(0, 95), min_size=1, max_size=6),
        st.lists(st.integers(0, 95), min_size=1, max_size=3).map(lambda p: p * 3),
    ),
    st.sampled_from(SAMPLINGS),
    st.integers(0, 2**31),
    st.integers(1, 9),
)
schedules = st.lists(
    st.tuples(st.integers(0, 6), requests, st.one_of(st.none(), st.integers(0, 8))),
    min_size=1,
    max_size=5,
)


@pytest.mark.parametrize("drafter", ["none", "lookup", "redrafter"])
@settings(max_examples=15, deadline=None)
@given(schedule=schedules, slots=st.integers(1, 3), budget=st.sampled_from([None, 2, 5]))
def test_a_request_decodes_the_same_whatever_shares_its_steps(
    model_dir, redrafter, drafter, schedule, slots, budget
):
    """... and however its prompt is chunked (a budget of prompt tokens per step)."""
    if (
        drafter == "redrafter"
    ):  # its float drafts change with the batch: greedy output is the target's anyway
        schedule = [
            (a, r.__class__(prompt=r.prompt, max_new_tokens=r.max_new_tokens), c)
            for a, r, c in schedule
        ]
    name = redrafter if drafter == "redrafter" else drafter
    together = run(
        decoding_plan(load_target(model_dir, slots=slots, capacity=64), name), schedule, budget
    )
    alone_plan = decoding_plan(load_target(model_dir, slots=1, capacity=64), name)
    for index, tokens in together.items():
        _, request, _ = schedule[index]
        alone = run(alone_plan, [(0, request, None)])[0]
        assert tokens == alone, (
            f"request {index} ({request}) with {slots} slot(s) and schedule "
            f"{[(a, c) for a, _, c in schedule]} differs from decoding it alone"
        )


def test_generate_with_fewer_slots_than_prompts_queues_them(model_dir):
    prompts = [[1, 2, 3], [4, 5], [6], [7, 8, 9, 10]]
    one = specdec.generate(
        specdec.load(model_dir, backend="numpy", slots=1),
        prompts,
        drafter="lookup",
        backend="numpy",
        max_new_tokens=6,
        stop_at_eos=False,
    )
    four = specdec.generate(
        specdec.load(model_dir, backend="numpy", slots=4),
        prompts,
        drafter="lookup",
        backend="numpy",
        max_new_tokens=6,
        stop_at_eos=False,
    )
    assert one.tokens == four.tokens and all(len(t) == 6 for t in one.tokens)


class Recorder:
    """A stateful drafter that drafts nothing and records its lifecycle."""

    caps = specdec.DrafterCaps(stateful=True, hidden_layers=(0,))

    def __init__(self):
        self.events, self.open = [], {}

    def begin(self, slot, prompt, output):
        assert slot not in self.open, f"slot {slot} began twice without end"
        self.open[slot] = {
            "prompt": prompt.tolist(),
            "tokens": [],
            "hidden": [output.hidden],
            "layer0": [output.layers[0]],
        }
        self.events.append(("begin", slot))

    def propose(self, context):
        assert set(context.slots.tolist()) <= set(self.open), (
            "propose for a slot that did not begin"
        )
        return specdec.Draft(
            root_tokens=context.root_tokens, beams=np.asarray(context.root_tokens)[:, None, None]
        )

    def observe(self, accepted):
        for b, slot in enumerate(accepted.slots.tolist()):
            n = int(accepted.num_accepted[b]) + 1
            record = self.open[slot]
            record["tokens"].extend(accepted.tokens[b, :n].tolist())
            record["hidden"].append(np.asarray(accepted.hidden[b, :n]))
            record["layer0"].append(np.asarray(accepted.layers[0][b, :n]))
            assert (accepted.tokens[b, n:] == -1).all()

    def end(self, slot):
        self.events.append(("end", slot, self.open.pop(slot)))


def test_stateful_drafter_sees_every_request_begin_commit_and_end(model_dir):
    target = load_target(model_dir, slots=2, capacity=64)
    recorder = Recorder()
    plan = decoding_plan(target, recorder)
    prompts = [[1, 2, 3], [4, 5], [6, 7, 8, 9]]
    emitted = run(plan, [(0, specdec.Request(prompt=p, max_new_tokens=5), None) for p in prompts])
    ended = [event[2] for event in recorder.events if event[0] == "end"]
    assert (
        len(ended) == 3
        and not recorder.open
        and [e[0] for e in recorder.events].count("begin") == 3
    )
    fresh = load_target(model_dir, slots=1, capacity=64)
    for record in ended:
        index = prompts.index(record["prompt"])
        # every committed token: the prompt's first emitted token onwards, except the last
        # (never committed)
        assert record["tokens"] == emitted[index][:-1]
        text = record["prompt"] + record["tokens"]
        expected = fresh.admit(0, text, layers=[0])
        fresh.release(0)
        np.testing.assert_allclose(
            np.concatenate(record["hidden"]), expected.hidden, rtol=0, atol=1e-12
        )
        np.testing.assert_allclose(
            np.concatenate(record["layer0"]), expected.layers[0], rtol=0, atol=1e-12
        )


def test_cancel_frees_the_slot_and_ends_the_request(model_dir):
    target = load_target(model_dir, slots=1, capacity=64)
    recorder = Recorder()
    decoder = Decoder(decoding_plan(target, recorder))
    first = decoder.submit(specdec.Request(prompt=[1, 2], max_new_tokens=20))
    second = decoder.submit(specdec.Request(prompt=[3], max_new_tokens=2))
    decoder.step(), decoder.step()
    assert decoder.cancel(first) and not target.cache.admitted.any()
    assert recorder.events[-1][:2] == ("end", 0)
    while not decoder.idle:
        decoder.step()
    assert [e[:2] for e in recorder.events] == [("begin", 0), ("end", 0), ("begin", 0), ("end", 0)]
    assert not decoder.cancel(second), "a finished request is no longer there to cancel"


def test_requests_beyond_the_capacity_are_refused_before_anything_runs(model_dir):
    target = load_target(model_dir, slots=1, capacity=16)
    decoder = Decoder(decoding_plan(target, "none"))
    with pytest.raises(
        specdec.InvalidInputError, match="needs 20 positions; the target's slots hold 16"
    ):
        decoder.submit(specdec.Request(prompt=[1] * 10, max_new_tokens=10))
    assert decoder.idle and not target.cache.admitted.any()


def counting(target):
    """``target`` whose forwards are recorded (each one's chunks and tree rows); admit refused."""
    forward, target.forwards = target.forward_tree, []

    def forward_tree(tree, slots, *, context=(), layers=()):
        target.forwards.append(
            ([(int(s), len(t)) for s, t in context], [] if tree is None else list(slots))
        )
        return forward(tree, slots, context=context, layers=layers)

    def admit(slot, prompt, *, layers=()):
        raise AssertionError(
            "the decoder prefills prompt chunks inside forward_tree, not with admit"
        )

    target.forward_tree, target.admit = forward_tree, admit
    return target


def test_each_step_is_one_forward_of_prompt_chunks_and_every_groups_trees(model_dir):
    """A long prompt arrives while two requests with different sampling settings decode: every
    step is one forward; the prompt goes in chunks of the budget beside their trees, and they
    emit tokens every step meanwhile."""
    target = counting(load_target(model_dir, slots=3, capacity=64))
    decoder = Decoder(decoding_plan(target, "lookup"))
    greedy = decoder.submit(specdec.Request(prompt=[1, 2, 3], max_new_tokens=40))
    sampled = decoder.submit(
        specdec.Request(
            prompt=[4, 5],
            max_new_tokens=40,
            sampling=specdec.SamplingConfig(temperature=0.8),
            seed=1,
        )
    )
    assert [r.requests for r in decoder.step(max_prefill_tokens=4)] == [
        (greedy,)
    ]  # 3 + 2 > 4: one prompt
    assert [r.requests for r in decoder.step(max_prefill_tokens=4)] == [(sampled,), (greedy,)]
    long = decoder.submit(specdec.Request(prompt=list(range(10, 21)), max_new_tokens=4))
    target.forwards.clear()
    emitted = []
    for _ in range(3):
        results = decoder.step(max_prefill_tokens=4)
        emitted.append(
            {
                r: len(t)
                for result in results
                for r, t in zip(result.requests, result.new_tokens, strict=True)
            }
        )
    chunks = [f[0] for f in target.forwards]
    assert chunks == [[(2, 4)], [(2, 4)], [(2, 3)]], "11 prompt tokens in chunks of the budget"
    assert all(sorted(f[1]) == [0, 1] for f in target.forwards), (
        "both groups' trees ride every forward"
    )
    assert all(e[greedy] >= 1 and e[sampled] >= 1 for e in emitted), (
        "the decoding requests did not stall"
    )
    assert long not in emitted[0] and long not in emitted[1] and emitted[2][long] == 1, (
        "first token at the last chunk"
    )
    decoder.close()
    assert not target.cache.admitted.any()


class FailingFor:
    """The plan's verifier, raising for requests with one sampling temperature."""

    def __init__(self, inner, temperature):
        self.inner, self.temperature, self.caps = inner, temperature, inner.caps

    def verify(self, tree, draft, target, sampling, uniforms):
        if sampling.temperature == self.temperature:
            raise RuntimeError("this verifier fails for these requests")
        return self.inner.verify(tree, draft, target, sampling, uniforms)


def test_a_prompt_chunk_whose_forward_fails_fails_its_request_alone(model_dir):
    """A forward that fails for one prompt's chunk: the step is retried request by request, that
    request fails (once: a lone chunk is not retried again), the others decode as alone."""
    target = load_target(model_dir, slots=2, capacity=64)
    forward = target.forward_tree

    def forward_tree(tree, slots, *, context=(), layers=()):
        if any(13 in list(tokens) for _, tokens in context):
            raise RuntimeError("poisoned chunk")
        return forward(tree, slots, context=context, layers=layers)

    target.forward_tree = forward_tree
    good_request = specdec.Request(prompt=[1, 2, 3], max_new_tokens=6)
    schedule = [
        (0, good_request, None),
        (0, specdec.Request(prompt=[13, 14], max_new_tokens=6), None),
    ]
    failures = []
    tokens = run_schedule(
        decoding_plan(target, "lookup"), schedule, max_prefill_tokens=8, failures=failures
    )
    assert [index for index, _ in failures] == [1]
    assert not target.cache.admitted.any()
    alone = decoding_plan(load_target(model_dir, slots=1, capacity=64), "lookup")
    assert tokens == {0: run(alone, [(0, good_request, None)])[0]}


def test_a_request_failing_after_the_forward_leaves_that_forwards_prompt_chunks_committed_once(
    model_dir,
):
    """A verifier fails for one request after a forward that also carried another request's prompt
    chunk: that chunk is committed once (not prefilled again when the failing step is retried row
    by row), the failing request is dropped, and every other request decodes as it would alone."""
    import attrs

    plan = decoding_plan(counting(load_target(model_dir, slots=3, capacity=64)), "lookup")
    plan = attrs.evolve(plan, verifier=FailingFor(plan.verifier, 0.7))
    failing = specdec.Request(
        prompt=[4, 5], max_new_tokens=6, sampling=specdec.SamplingConfig(temperature=0.7), seed=2
    )
    greedy = specdec.Request(prompt=[1, 2, 3], max_new_tokens=6)
    chunked = specdec.Request(prompt=list(range(10, 19)), max_new_tokens=6)
    schedule = [(0, failing, None), (0, greedy, None), (1, chunked, None)]
    failures = []
    tokens = run_schedule(plan, schedule, max_prefill_tokens=4, failures=failures)
    assert [index for index, _ in failures] == [0]
    assert not plan.target.cache.admitted.any()
    sent = sum(size for chunks, _ in plan.target.forwards for _, size in chunks)
    assert sent == 2 + 3 + 9, (
        f"{sent} prompt tokens forwarded for prompts of 2 + 3 + 9: a chunk ran twice"
    )
    alone = decoding_plan(load_target(model_dir, slots=1, capacity=64), "lookup")
    assert tokens == {
        index: run(alone, [(0, request, None)])[0] for index, request in ((1, greedy), (2, chunked))
    }
