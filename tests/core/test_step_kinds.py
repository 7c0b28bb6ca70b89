"""Steps of several kinds (``specdec.protocols.StepKinds``): a drafter sorts each request's coming
step before it drafts, ``speculation="auto"`` learns each kind's acceptance apart, and the
prompt-lookup beam leads the tree where its chain is an n-gram match."""

from __future__ import annotations

import numpy as np
import pytest

import specdec
from specdec.plugins.builtin import NumpyBackend
from specdec.decode.budget import Speculation
from specdec.drafting.lookup import LookupDrafter
from specdec.errors import InvalidInputError
from specdec.tuning.costs import CostCurve, StepCosts
from specdec.types import Draft, DraftContext

# a forward of n tokens costs 40 ms + 10 ms per token past the first: a tree of 9 nodes costs 3x
# a plain step, so drafting pays where a request accepts well and loses where it accepts little
CURVE = CostCurve(tokens=(1, 1024), seconds=(0.04, 0.04 + 0.01 * 1023))


class FrozenCosts(StepCosts):
    """Costs that the steps' own timings do not change."""

    def observe(self, *args, **kwargs) -> None:
        pass


def policy() -> Speculation:
    speculation = Speculation("auto")
    speculation.use_costs(FrozenCosts(CURVE))
    return speculation


def teach(speculation, request_id, kind, accepted, steps=12, nodes=9):
    """``steps`` steps of ``kind`` in which the request's whole tree accepted ``accepted``
    drafted tokens along its first beam."""
    path = np.array([[0] + list(range(1, accepted + 1)) + [-1] * (nodes - 1 - accepted)])
    for _ in range(steps):
        speculation.step_budgets([request_id], kinds={request_id: kind})
        speculation.observe_rows(
            [request_id], [None], np.array([nodes]), np.array([nodes]), path, np.array([accepted])
        )


def budget(speculation, request_id, kind):
    return speculation.step_budgets([request_id], kinds={request_id: kind}).budgets[request_id]


def test_each_kind_of_step_is_judged_on_its_own_acceptance():
    speculation = policy()
    teach(speculation, 0, kind=1, accepted=7)  # 8 tokens a step where the text repeats
    teach(speculation, 0, kind=0, accepted=0)  # nothing elsewhere
    assert budget(speculation, 0, 1) != 0
    assert budget(speculation, 0, 0) == 0
    assert speculation.reasons == {0: "prediction"}
    # the mean over both kinds (4.5 tokens a step) would draft in every step


def test_a_new_request_starts_from_each_kinds_average_over_requests():
    speculation = policy()
    teach(speculation, 0, kind=1, accepted=7, steps=40)
    teach(speculation, 0, kind=0, accepted=0, steps=40)
    speculation.forget(0)
    assert budget(speculation, 5, 1) != 0
    assert budget(speculation, 5, 0) == 0


def test_a_request_ended_leaves_no_acceptance_of_any_kind():
    speculation = policy()
    teach(speculation, 3, kind=0, accepted=1, steps=2)
    teach(speculation, 3, kind=2, accepted=1, steps=2)
    assert {key[0] for key in speculation._rows} == {3}
    speculation.forget(3)
    assert not speculation._rows


def tokens(*values):
    return np.array(values, dtype=np.int64)


class TwoBeams:
    """A beam drafter of two fixed beams (the root, then 40, 41 and 50, 51)."""

    caps = specdec.DrafterCaps(max_tree_size=5)
    beam_width, beam_length = 2, 3

    def propose(self, context):
        roots = np.asarray(context.root_tokens)
        beams = np.stack(
            [
                np.stack([roots, np.full_like(roots, 40), np.full_like(roots, 41)], axis=1),
                np.stack([roots, np.full_like(roots, 50), np.full_like(roots, 51)], axis=1),
            ],
            axis=1,
        )  # (B, 2, 3)
        return Draft(root_tokens=context.root_tokens, beams=beams, sampled=False)


def test_the_lookup_chain_leads_the_tree_where_it_is_an_ngram_match():
    drafter = LookupDrafter(NumpyBackend(), None, inner=TwoBeams(), draft_length=2)
    # row 0 ends with "2 3", seen before (followed by 9); row 1's "5 6" never occurred, but its
    # last token did (a unigram chain, a weaker guess): it keeps the chain last
    history = (tokens(1, 2, 3, 9, 2, 3), tokens(6, 4, 5, 6))
    assert [drafter.step_kind(h) for h in history] == [1, 0]
    roots = np.array([h[-1] for h in history])
    draft = drafter.propose(
        DraftContext(root_tokens=roots, hidden=np.zeros((2, 1)), history=history)
    )
    assert draft.beams.tolist() == [
        [[3, 9, 2], [3, 40, 41], [3, 50, 51]],
        [[6, 40, 41], [6, 50, 51], [6, 4, 5]],
    ]
    assert np.asarray(draft.beam_lengths).tolist() == [[3, 3, 3], [3, 3, 3]]


class KindsOfItsOwn(TwoBeams):
    def step_kind(self, history):
        return 1 if len(history) > 4 else 0


def test_beside_a_drafter_with_kinds_of_its_own_the_lookup_beam_adds_its_own():
    drafter = LookupDrafter(NumpyBackend(), None, inner=KindsOfItsOwn())
    assert drafter.step_kind(tokens(1, 2, 3, 9, 2, 3)) == 3  # the inner's 1, and an n-gram match
    assert drafter.step_kind(tokens(1, 2, 3, 9, 3)) == 2
    assert drafter.step_kind(tokens(2, 3, 2, 3)) == 1
    assert drafter.step_kind(tokens(6, 4, 5, 6)) == 0


class BadKinds(LookupDrafter):
    def step_kind(self, history):
        return "repeats"


def test_a_step_kind_that_is_no_integer_is_refused_naming_the_drafter(model_dir):
    speculation = policy()
    with pytest.raises(InvalidInputError, match=r"BadKinds.step_kind must return a non-neg"):
        specdec.generate(
            model_dir,
            [5, 6, 5, 6],
            drafter=BadKinds(NumpyBackend(), None),
            backend="numpy",
            max_new_tokens=4,
            speculation=speculation,
        )


class Recording(Speculation):
    """Auto, keeping the kinds each step was given."""

    def __init__(self):
        super().__init__("auto")
        self.use_costs(FrozenCosts(CostCurve(tokens=(1, 1024), seconds=(0.02, 0.02))))
        self.seen = []

    def step_budgets(self, request_ids, chunk_tokens=0, kinds=None):
        self.seen.append(dict(kinds or {}))
        return super().step_budgets(request_ids, chunk_tokens, kinds=kinds)


def test_the_loop_tells_auto_each_requests_kind_and_the_tokens_stay_plain_decodings(model_dir):
    prompts = [[5, 6, 7, 5, 6, 7, 5, 6], [9, 8, 1, 2]]
    speculation = Recording()
    steps = list(
        specdec.stream(
            model_dir,
            prompts,
            "lookup",
            "numpy",
            max_new_tokens=8,
            speculation=speculation,
            stop_at_eos=False,
        )
    )
    kinds = LookupDrafter(NumpyBackend(), None)
    emitted, expected = [[], []], []
    for step in steps:  # each step's kinds are those of the text before it
        if any(emitted):
            expected.append(
                {
                    b: kinds.step_kind(tokens(*p, *e))
                    for b, (p, e) in enumerate(zip(prompts, emitted))
                    if len(e) < 8
                }
            )
        for b in range(2):
            emitted[b] += step.new_tokens[b]
    assert [seen for seen in speculation.seen if seen] == expected
    assert {k for step in expected for k in step.values()} == {0, 1}  # both kinds occurred
    for prompt, got in zip(prompts, emitted):
        plain = specdec.generate(
            model_dir, prompt, drafter="none", backend="numpy", max_new_tokens=8, stop_at_eos=False
        )
        assert got == plain.tokens
