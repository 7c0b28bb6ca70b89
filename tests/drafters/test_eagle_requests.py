"""EAGLE over request slots (specdec.decode.loop.Decoder): every admitted request begins and ends
once, its draft cache follows exactly what the target committed, and a request's tokens
(greedy and seeded sampling) do not depend on what else shares its steps, when others arrive, finish
or are cancelled.

Exact by construction on the reference: the target runs each tree row alone, EAGLE's reference
drafts each row alone, and each request draws its randomness from its own generator.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import specdec
from specdec.reference.model import load_target
from specdec.testing import make_random_drafter
from specdec.testing.requests import decoding_plan, run_schedule
from specdec_eagle.checkpoint import load_eagle_checkpoint
from specdec_eagle.reference import EagleDrafter

SAMPLINGS = [
    specdec.SamplingConfig(),
    specdec.SamplingConfig(temperature=0.8),
    specdec.SamplingConfig(temperature=1.2, top_k=20),
]


@pytest.fixture(scope="module")
def eagle(model_dir, tmp_path_factory):
    return make_random_drafter(
        tmp_path_factory.mktemp("requests") / "eagle",
        model_dir,
        kind="eagle",
        seed=5,
        top_k=3,
        depth=3,
        total_tokens=7,
    )


class Recording(EagleDrafter):
    """The reference EAGLE, recording its lifecycle and checking it on the way."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.events, self.committed = [], {}

    def begin(self, slot, prompt, output):
        assert slot not in self.slots, f"slot {slot} began twice without end"
        super().begin(slot, prompt, output)
        self.committed[slot] = list(prompt)
        self.events.append(("begin", slot))

    def observe(self, accepted):
        super().observe(accepted)
        for b, slot in enumerate(accepted.slots.tolist()):
            self.committed[slot] += accepted.tokens[b, : int(accepted.num_accepted[b]) + 1].tolist()
            # the draft cache holds one entry per committed token but the last
            # (its token is the next root)
            assert self.slots[slot].length == len(self.committed[slot]) - 1

    def end(self, slot, reason):
        assert slot in self.slots, f"slot {slot} ended without begin"
        super().end(slot, reason)
        self.events.append(("end", slot))


def run(plan, schedule) -> dict[int, list[int]]:
    tokens = run_schedule(plan, schedule)
    assert not plan.target.cache.admitted.any(), "every slot is free at the end"
    return tokens


def recording(eagle, target) -> Recording:
    config, weights = load_eagle_checkpoint(eagle)
    return Recording(config, weights, embed_tokens=target.embed_tokens, lm_head=target.lm_head)


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
    max_size=4,
)


@settings(max_examples=12, deadline=None)
@given(schedule=schedules, slots=st.integers(1, 3))
def test_a_request_decodes_the_same_whatever_shares_its_steps(model_dir, eagle, schedule, slots):
    target = load_target(model_dir, slots=slots, capacity=64)
    drafter = recording(eagle, target)
    together = run(decoding_plan(target, drafter), schedule)
    begun = [e[1] for e in drafter.events if e[0] == "begin"]
    ended = [e[1] for e in drafter.events if e[0] == "end"]
    assert sorted(begun) == sorted(ended) and not drafter.slots, "every begin has its end"
    alone_target = load_target(model_dir, slots=1, capacity=64)
    alone_plan = decoding_plan(alone_target, recording(eagle, alone_target))
    for index, tokens in together.items():
        _, request, _ = schedule[index]
        assert tokens == run(alone_plan, [(0, request, None)])[0], (
            f"request {index} ({request}) with {slots} slot(s) differs from decoding it alone"
        )


def test_generate_releases_every_slot_and_matches_plain(model_dir, eagle):
    prompts = [[1, 2, 3], [4, 5], [6], [7, 8, 9, 10], [11]]
    target = specdec.load(model_dir, backend="numpy", slots=2)
    plain = specdec.generate(
        model_dir, prompts, drafter="none", backend="numpy", max_new_tokens=12
    ).tokens
    got = specdec.generate(target, prompts, drafter=str(eagle), backend="numpy", max_new_tokens=12)
    assert got.tokens == plain
    assert not target.cache.admitted.any()
