"""specdec.decode.budget, specdec.tuning.costs and specdec.decode.prefill: each step's tree budgets,
the step costs they weigh and the prompt chunks a step carries; and that no budget changes a
request's tokens.

The choice is tested on made-up costs (a line: seconds = 20 ms + 1 ms per token, and a
flat one), its bookkeeping on made-up verdicts. Losslessness is tested end to end on the float64
reference with the budgets themselves drawn by Hypothesis: every prompt of a batch, every
drafter (stateless and stateful), greedy and sampled, gives the tokens of plain decoding alone.
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import specdec
from specdec.decode.batching import cut_tree, merge_trees
from specdec.decode.budget import (
    BUDGETS,
    EXPLORE_EVERY,
    MIN_PREFILL,
    REQUEST_DECAY,
    Speculation,
    StepBudgets,
    check_speculation,
)
from specdec.tuning.costs import CostCurve, StepCosts, _Fit, increasing
from specdec.errors import InvalidInputError
from specdec.decode.prefill import choose_chunks
from specdec.reference.tree import build_prefix_tree
from specdec.decode.requests import Request, RequestState
from specdec.slots import PREFILL_CHUNK
from specdec.decode.checks import check_tree_output
from specdec.drafting.none import NoDrafter
from specdec.testing import make_random_drafter

LINE = CostCurve(tokens=(1, 1024), seconds=(0.021, 0.021 + 0.001 * 1023))  # 20 ms + 1 ms per token


def policy(curve=LINE) -> Speculation:
    speculation = Speculation("auto")
    speculation.use_costs(StepCosts(curve))
    return speculation


def teach(
    speculation: Speculation,
    request_id: int,
    tokens_per_step: float,
    nodes: int = 9,
    steps: int = 20,
    accepted_nodes=None,
):
    """Steps of a request whose whole tree (``nodes``) had every row accept ``tokens_per_step - 1``
    drafted tokens, at ``accepted_nodes`` (default: along the first beam, nodes 1, 2, ...)."""
    accepted = int(tokens_per_step - 1)
    along = list(range(1, accepted + 1)) if accepted_nodes is None else list(accepted_nodes)
    path = np.array([[0] + along + [-1] * (nodes - 1 - accepted)])
    for _ in range(steps):
        speculation.observe_rows(
            [request_id], [None], np.array([nodes]), np.array([nodes]), path, np.array([accepted])
        )


# ---------------------------------------------------------------------------------------------
# The choice


def test_one_request_that_accepts_drafts_and_a_full_batch_decodes_plainly():
    speculation = policy()
    for i in range(32):
        teach(
            speculation, i, 3.0, accepted_nodes=(6, 8)
        )  # accepted deep in the tree: it takes 8 nodes
    alone = speculation.step_budgets([0])
    assert alone.budgets[0] == 8 and alone.drafting == 1
    batch = speculation.step_budgets(
        list(range(32))
    )  # 32 x 9 nodes cost 6x the plain step; 3 tokens do not pay
    assert set(batch.budgets.values()) == {0} and batch.drafting == 0


def test_a_request_that_accepts_nothing_decodes_plainly_even_alone():
    speculation = policy()
    teach(speculation, 0, 1.0)
    assert speculation.step_budgets([0]).budgets == {0: 0}


def test_free_tokens_make_every_request_draft_its_whole_tree():
    speculation = policy(
        CostCurve(tokens=(1, 1024), seconds=(0.02, 0.02))
    )  # a forward costs the same at any size
    for i in range(8):
        teach(speculation, i, 4.0, nodes=9)
    plan = speculation.step_budgets(list(range(8)))
    assert plan.drafting == 8 and min(plan.budgets.values()) >= 3  # every token it accepts


def test_the_budget_is_cut_where_extra_nodes_stop_paying():
    """Tokens past the first beam never come: a budget of the first beam's 3 nodes wins over 9."""
    speculation = policy()
    teach(speculation, 0, 4.0, nodes=10)  # accepts 3 drafted tokens, nodes 1-3
    plan = speculation.step_budgets([0])
    assert plan.budgets[0] == 3


def test_modes_always_and_never():
    assert set(Speculation("always").step_budgets([0, 1]).budgets.values()) == {None}
    assert set(Speculation("never").step_budgets([0, 1]).budgets.values()) == {0}
    assert Speculation("never").step_budgets([]) == StepBudgets({}, 0, 0)


def test_speculation_option_is_checked(monkeypatch):
    monkeypatch.delenv("SPECDEC_SPECULATION", raising=False)
    assert check_speculation(None) == "auto" and check_speculation("NEVER") == "never"
    monkeypatch.setenv("SPECDEC_SPECULATION", "never")
    assert check_speculation(None) == "never"
    with pytest.raises(InvalidInputError, match="speculation must be one of auto, always, never"):
        check_speculation("sometimes")


class CountingNone(NoDrafter):
    """Plain decoding that counts its ``propose`` calls."""

    calls = 0

    def propose(self, context):
        self.calls += 1
        return super().propose(context)


@pytest.mark.parametrize("mode, called", [("auto", False), ("always", True)])
def test_a_drafter_of_root_only_trees_is_not_called_under_auto(model_dir, mode, called):
    drafter = CountingNone()
    result = specdec.generate(
        model_dir,
        [[5, 6, 7]] * 2,
        drafter=drafter,
        backend="numpy",
        max_new_tokens=6,
        speculation=mode,
    )
    assert (drafter.calls > 0) == called
    plain = specdec.generate(
        model_dir, [5, 6, 7], drafter="none", backend="numpy", max_new_tokens=6
    )
    assert result.tokens == [plain.tokens] * 2


class FixedCosts(StepCosts):
    """Costs that the steps' own timings do not change (a tiny test model's are all alike)."""

    def observe(self, *args) -> None:
        pass


@pytest.mark.parametrize(
    "curve, batch, drafts",
    [
        (
            CostCurve(tokens=(1, 1024), seconds=(0.02, 0.02)),
            3,
            True,
        ),  # a forward costs the same at any size
        (
            CostCurve(tokens=(1, 2, 1024), seconds=(0.02, 0.2, 100.0)),
            3,
            False,
        ),  # a second token costs 10x the first
    ],
)
def test_auto_decodes_plainly_where_drafting_cannot_pay(model_dir, curve, batch, drafts):
    speculation = Speculation("auto")
    speculation.use_costs(FixedCosts(curve))
    prompts = [[5, 6, 7, 5, 6, 7, 5, 6]] * batch
    result = specdec.generate(
        model_dir,
        prompts,
        drafter="lookup",
        backend="numpy",
        max_new_tokens=12,
        speculation=speculation,
    )
    assert (result.stats.verified_tokens > result.stats.row_steps - batch) == drafts
    assert (
        result.tokens
        == [
            specdec.generate(
                model_dir, prompts[0], drafter="none", backend="numpy", max_new_tokens=12
            ).tokens
        ]
        * batch
    )


# ---------------------------------------------------------------------------------------------
# What a step tells the policy


def test_one_full_tree_tells_what_every_cut_would_have_accepted():
    speculation = policy()
    path = np.array([[0, 2, 5, -1]])  # accepted node 2 (depth 1), then node 5 (depth 2)
    speculation.observe_rows([7], [None], np.array([9]), np.array([9]), path, np.array([2]))
    row = speculation._rows[7, 0]
    reached = BUDGETS.index(8) + 1  # the budgets up to the tree's 8 drafted nodes
    assert row.known[:reached].all() and not row.known[reached:].any()  # learnt from one step
    for _ in range(
        int(np.ceil(np.log(1e-8) / np.log(1 - REQUEST_DECAY)))
    ):  # the first step's weight below 1e-8
        speculation.observe_rows([7], [None], np.array([9]), np.array([9]), path, np.array([2]))
    # tokens per step had the tree been cut at k nodes (no tree reaches past 8)
    expected = {1: 1, 2: 2, 3: 2, 4: 2, 6: 3, 8: 3, 12: 3, 64: 3}
    for k, tokens in expected.items():
        assert row.tokens[BUDGETS.index(k)] == pytest.approx(tokens, abs=1e-6)
    assert row.nodes == pytest.approx(9)


def test_gains_past_a_cut_are_learnt_from_the_trees_that_reach_there():
    """Trees of 4 drafted nodes accepting node 1, and one step in four a tree of 14 (a lookup
    beam riding along) accepting nodes 1 and 5-8. Cut at 4 for a while (the large trees cut, the
    small ones whole), the budgets past 4 keep what the large trees accepted there: on the line
    (20 ms + 1 ms a token) a budget of 8 (3 tokens a step in about 26 ms) beats 4 (2 in 25 ms).
    Learnt from the small trees alone, 8 would look no better than 4."""
    speculation = policy()

    def step(big: bool, budget):
        drafted = 14 if big else 4
        kept = drafted if budget is None else min(drafted, budget)
        accepted = [n for n in ((1, 5, 6, 7, 8) if big else (1,)) if n <= kept]
        path = np.array([[0, *accepted] + [-1] * (drafted - len(accepted))])
        speculation.observe_rows(
            [0],
            [budget],
            np.array([kept + 1]),
            np.array([drafted + 1]),
            path,
            np.array([len(accepted)]),
        )

    for i in range(200):  # the first guess forgotten
        step(i % 4 == 0, None)
    before = speculation.estimate(0)[0]
    for i in range(80):
        step(i % 4 == 0, 4)
    tokens, nodes = speculation.estimate(0)
    assert tokens[BUDGETS.index(4)] == pytest.approx(2.0, abs=0.01)
    assert tokens[BUDGETS.index(8)] == pytest.approx(before[BUDGETS.index(8)], abs=0.01)
    reach = speculation._rows[0, 0].reach[BUDGETS.index(6)]  # the recent share of large trees
    assert 0.15 < reach < 0.35
    assert tokens[BUDGETS.index(8)] == pytest.approx(2.0 + 4 * reach, abs=1e-3)  # 5-8 when there
    assert nodes == pytest.approx(5.0 + 10 * reach, abs=1e-3)
    assert speculation.step_budgets([0]).budgets == {0: 8}


def test_a_cut_tree_tells_nothing_about_larger_budgets():
    speculation = policy()
    path = np.array([[0, 1, 2, -1]])
    speculation.observe_rows(
        [3], [3], np.array([4]), np.array([9]), path, np.array([2])
    )  # cut to 3 drafted nodes
    row = speculation._rows[3, 0]
    assert row.known[: BUDGETS.index(3) + 1].all() and not row.known[BUDGETS.index(4) :].any()


def test_a_request_that_stops_drafting_drifts_back_to_the_engines_average():
    speculation = policy()
    teach(speculation, 1, 1.0, steps=120)  # its start (the engine's first guess) forgotten
    teach(speculation, 0, 5.0)  # the engine's average rises
    before = speculation.estimate(1)[0][BUDGETS.index(8)]
    for _ in range(40):
        speculation.observe_rows(
            [1], [0], np.array([1]), np.array([1]), np.array([[0]]), np.array([0])
        )
    after = speculation.estimate(1)[0][BUDGETS.index(8)]
    assert before == pytest.approx(1.0, abs=0.01) and after > before + 0.5


STEEP = CostCurve(
    tokens=(1, 1024), seconds=(0.001, 1.024)
)  # 1 ms per token: a 3-node tree costs 3 steps


@pytest.mark.parametrize(
    "curve, tried",
    [(CostCurve(tokens=(1, 1024), seconds=(0.02, 0.02)), True), (LINE, True), (STEEP, False)],
)
def test_a_request_idle_for_a_while_drafts_again_where_that_is_cheap(curve, tried):
    speculation = policy(curve)
    teach(
        speculation, 0, 1.0, nodes=3, steps=200
    )  # accepts nothing, and so does the engine's average
    plain = (np.array([1]), np.array([1]), np.array([[0]]), np.array([0]))
    for _ in range(EXPLORE_EVERY - 1):
        speculation.observe_rows([0], [0], *plain)
    assert speculation.step_budgets([0]).budgets == {0: 0}
    speculation.observe_rows([0], [0], *plain)
    # a 3-node tree: +10% on the line, +200% on the steep curve (more than 16 steps x 5%)
    assert speculation.step_budgets([0]).budgets == ({0: None} if tried else {0: 0})


def test_a_fresh_engine_prices_the_drafters_own_tree_and_tries_a_poor_start_again():
    """The drafter's largest tree bounds what a request is expected to draft before its trees
    are seen: a request of a 7-node drafter whose first trees accepted nothing is tried again
    after ``EXPLORE_EVERY`` plain steps (priced as 64 nodes, it never was)."""
    speculation = policy(CostCurve(tokens=(1, 1024), seconds=(0.021, 0.021 + 0.002 * 1023)))
    speculation.use_tree_size(7)
    tokens, nodes = speculation.estimate(0)
    assert nodes == 7.0 and np.all(tokens[BUDGETS.index(6) :] == tokens[BUDGETS.index(6)])
    teach(speculation, 0, 1.0, nodes=7, steps=30)  # a poor start
    plain = (np.array([1]), np.array([1]), np.array([[0]]), np.array([0]))
    for _ in range(EXPLORE_EVERY):
        assert speculation.step_budgets([0]).budgets == {0: 0}
        speculation.observe_rows([0], [0], *plain)
        speculation.observe_step(1, 0.021, 0, 0.0)
    assert speculation.step_budgets([0]).budgets == {0: None}


def test_requests_are_tried_again_at_most_once_in_so_many_steps():
    speculation = policy()
    for request in (0, 1):
        teach(speculation, request, 1.0, nodes=3, steps=200)
    plain = (np.array([1, 1]), np.array([1, 1]), np.array([[0], [0]]), np.array([0, 0]))
    for _ in range(EXPLORE_EVERY):
        speculation.observe_rows([0, 1], [0, 0], *plain)
    first = speculation.step_budgets([0, 1]).budgets
    assert sorted(first.values(), key=str) == [0, None]  # one of the two, not both
    tried = next(r for r, budget in first.items() if budget is None)
    speculation.observe_rows(
        [0, 1],
        [first[0], first[1]],
        np.array([3, 1]) if tried == 0 else np.array([1, 3]),
        np.array([3, 3]),
        np.array([[0], [0]]),
        np.array([0, 0]),
    )
    for step in range(EXPLORE_EVERY):
        assert speculation.step_budgets([0, 1]).budgets == {0: 0, 1: 0}, (
            step
        )  # the other waits its turn
        speculation.observe_step(2, 0.021, 0, 0.0)
    assert speculation.step_budgets([0, 1]).budgets == {tried: 0, 1 - tried: None}


def test_step_costs_fit_a_fixed_cost_and_a_scale():
    costs = StepCosts(CostCurve(tokens=(1, 16, 64), seconds=(0.02, 0.025, 0.05)))
    assert costs.target([1, 64]).tolist() == pytest.approx(
        [0.02, 0.05]
    )  # the curve until a step ran
    for _ in range(200):
        for tokens, seconds in ((1, 0.005 + 2 * 0.02), (64, 0.005 + 2 * 0.05)):
            costs.observe(tokens, seconds, 0, 0.0, rows=tokens)  # decode steps, a token a row
    assert costs.target([16], 16).item() == pytest.approx(
        0.005 + 2 * 0.025, rel=0.05
    )  # the prior pulls a little
    fit = _Fit(0.0, 0.0, 1.0)
    for rows in (1, 2, 4, 8) * 5:
        fit.observe(rows, 0.002 + 0.0005 * rows)
    assert fit.coefficients() == pytest.approx((0.002, 0.0005), rel=0.1)


def test_decode_steps_take_the_fixed_cost_learnt_from_steps_carrying_prompts():
    """Under a queue every step carries prompt tokens: the decode fit, which sizes the prompt
    chunks, has no step of its own and takes the loop's fixed cost the chunk fit learnt (it
    priced decode steps at the bare curve before, 13 ms too cheap); its own steps then rule.
    The chunks here are of two sizes far apart, so that the chunk fit can tell its fixed cost
    from its scale."""
    costs = StepCosts(LINE)
    for step in range(40):
        tokens = 8 + (16 if step % 2 else 448)  # 8 rows decoding beside a chunk
        costs.observe(tokens, 0.013 + LINE.at(tokens, 9).item(), 0, 0.0, rows=9)
    assert costs.target(8, 8).item() == pytest.approx(0.013 + LINE.at(8, 8).item(), rel=0.01)
    for step in range(40):
        rows = 4 if step % 2 else 8
        costs.observe(rows, 0.005 + LINE.at(rows, rows).item(), 0, 0.0, rows=rows)
    assert costs.target(8, 8).item() == pytest.approx(0.005 + LINE.at(8, 8).item(), rel=0.02)


def test_what_trees_add_is_scaled_apart_from_the_plain_step():
    # the plain step costs 1.15x the curve and each node trees add 2x what the curve says (the
    # chain curve underprices trees): after a run of drafting steps the plain step is still
    # priced at its own cost (one scale for both priced it at the drafting steps' and made
    # drafting look better than it is)
    costs = StepCosts(LINE)

    def seconds(tokens, plain=8):
        return 1.15 * LINE.at(plain).item() + 2.0 * (LINE.at(tokens) - LINE.at(plain)).item()

    for step in range(40):
        tokens = 8 if step % 2 else 32
        costs.observe(tokens, seconds(tokens), 0, 0.0, rows=8, plain_tokens=8)
    for step in range(40):  # drafting only, as the choice does once it drafts
        tokens = 24 if step % 2 else 40
        costs.observe(tokens, seconds(tokens), 8, 0.002, rows=8, plain_tokens=8)
    assert costs.target(8, 8).item() == pytest.approx(seconds(8), rel=0.03)
    assert costs.target(32, 8, plain=8).item() == pytest.approx(seconds(32), rel=0.03)


def test_the_choice_decodes_plainly_where_trees_cost_more_than_the_curve_says():
    speculation = policy()
    ids = list(range(8))
    for request_id in ids:
        teach(speculation, request_id, 2.0, nodes=4)
    plain_step = 1.1 * LINE.at(8).item()  # 30.8 ms

    def step_seconds(tokens):  # what trees add costs 5x the curve's increment
        return plain_step + 5.0 * (LINE.at(tokens) - LINE.at(8)).item()

    drafted = []
    for step in range(60):
        planned = speculation.step_budgets(ids)
        drafted.append(planned.drafting > 0)
        speculation.observe_step(
            planned.tokens, step_seconds(planned.tokens), planned.drafting, 0.0, 8, 8
        )
    # the curve says drafting pays (16 tokens in 36 ms against 8 in 28); it costs 70.8 ms here,
    # so plain decoding (8 tokens in 30.8 ms) is chosen once a drafting step has been seen, and
    # the plain steps that follow do not reprice what trees add
    assert drafted[0] and sum(drafted) <= 2
    assert speculation.step_budgets(ids).budgets == dict.fromkeys(ids, 0)


def test_a_tree_far_larger_than_any_drafted_is_priced_at_least_at_the_curve():
    """A fresh engine of a 1.5B model drafted a short request at one row, where a tree's 13
    tokens cost what one does and the plain step ran faster than the curve (measured under
    load) said: those steps fitted what trees add at 0.01 of the curve, and the burst's first
    drafting step at 16 rows, 400 tokens, was priced 0.27 s and took 3.3 s (the curve: 3.0).
    The fit is trusted only as far as its steps reached; beyond, at least the curve's slope."""
    curve = CostCurve(
        tokens=(1, 2, 4, 8, 16, 32, 64, 128, 256, 512),
        seconds=(0.241, 0.241, 0.241, 0.246, 0.263, 0.293, 0.612, 1.123, 2.156, 4.144),
        rows=(1, 2, 4, 8, 16),
        row_seconds=(0.0, 0.009, 0.009, 0.009, 0.009),
    )
    costs = StepCosts(curve)
    costs.observe(1, 0.5, 0, 0.0)  # the first step: left out
    for step in range(12):  # the warm-up request: drafting steps and plain ones, one row
        if step % 3:
            costs.observe(13, 0.176 + 0.004 * (step % 2), 1, 0.015, rows=1, plain_tokens=1)
        else:
            costs.observe(1, 0.170 + 0.004 * (step % 2), 0, 0.0, rows=1)
    increment = (curve.at(400, 16) - curve.at(16, 16)).item()
    seen = (curve.at(13) - curve.at(1)).item()  # the largest increment the fit saw
    added = (costs.target(400, 16, 16) - costs.target(16, 16)).item()
    assert added >= increment - seen  # 0.0 before: 24 tokens a row priced as one
    # within what the steps saw, the fit still rules: a 13-token tree at one row adds little
    assert (costs.target(13, 1, 1) - costs.target(1, 1)).item() < 0.02


def test_the_first_drafting_step_at_a_further_row_count_does_not_price_trees():
    """A batch of two whose other request ended drafted its first step at one row in 205 ms (a
    kernel's first run at that shape), the next in 50: fitted, it priced trees out at one row
    for the requests that followed (a single chat after a two-request batch never drafted)."""
    costs = StepCosts(LINE)
    costs.observe(2, 0.5, 0, 0.0, rows=2)  # the first step: left out
    for _ in range(4):  # two rows: drafting steps of 8 tokens and plain ones
        costs.observe(8, 0.045, 2, 0.004, rows=2, plain_tokens=2)
        costs.observe(2, 0.040, 0, 0.0, rows=2)
    costs.observe(1, 0.030, 0, 0.0, rows=1)
    costs.observe(4, 0.205, 1, 0.060, rows=1, plain_tokens=1)  # one row's first: one-off
    costs.observe(4, 0.034, 1, 0.002, rows=1, plain_tokens=1)
    assert (costs.target(4, 1, 1) - costs.target(1, 1)).item() < 0.02  # 0.035 when fitted
    assert costs.draft(1).item() < 0.01


def test_a_plain_step_faster_than_the_curve_is_priced_at_what_it_took():
    """A 1.5B model's plain steps at 4 rows took 0.185 s where the curve (measured beside other
    work) said 0.24: the fit's line then runs through the origin, and the prior's slope, pulled
    at full weight, held the price at 0.206 s after three such steps, so drafting steps that only
    broke even looked 10% better than plain decoding."""
    costs = StepCosts(CostCurve(tokens=(1, 4, 16, 64), seconds=(0.22, 0.24, 0.30, 0.60)))
    costs.observe(4, 0.5, 0, 0.0, rows=4)  # the first step: left out
    for step in range(3):
        costs.observe(4, 0.185, 0, 0.0, rows=4)
    assert costs.target(4, 4).item() == pytest.approx(0.185, rel=0.02)  # 0.204 before
    # steps slower than the curve keep both the fixed cost and the scale they show
    slow = StepCosts(CostCurve(tokens=(1, 4, 16, 64), seconds=(0.22, 0.24, 0.30, 0.60)))
    slow.observe(4, 0.5, 0, 0.0, rows=4)
    for step in range(3):
        slow.observe(4, 0.26, 0, 0.0, rows=4)
    assert slow.target(4, 4).item() == pytest.approx(0.26, rel=0.02)


@given(st.lists(st.integers(1, 1000), min_size=1, max_size=12))
def test_a_measured_curve_is_pooled_into_the_closest_non_decreasing_one(values):
    pooled = increasing(values)
    assert len(pooled) == len(values) and np.all(np.diff(pooled) >= -1e-9)
    assert pooled.sum() == pytest.approx(sum(values))  # pooling keeps each block's mean
    if all(b >= a for a, b in zip(values, values[1:])):
        assert pooled.tolist() == pytest.approx(values)


def test_one_slow_size_does_not_lift_every_larger_one():
    # 2 tokens timed slow while other work ran: a running maximum would price 4 and 8 tokens at
    # 0.030
    pooled = increasing([0.020, 0.030, 0.021, 0.022])
    assert pooled.tolist() == pytest.approx([0.020] + [(0.030 + 0.021 + 0.022) / 3] * 3)


def test_a_drafters_first_call_does_not_price_drafting():
    costs = StepCosts(LINE)
    costs.observe(2, 0.022, 1, 0.5)  # the first call: one-off costs
    assert costs.draft([1]).item() == 0.0
    for _ in range(3):
        costs.observe(2, 0.022, 1, 0.004)
    assert 0.0 < costs.draft([1]).item() < 0.01


def test_cost_curve_interpolates_and_continues_its_last_slope():
    curve = CostCurve(tokens=(1, 8, 16), seconds=(0.01, 0.01, 0.03))
    assert curve.at([1, 4, 12, 32]).tolist() == pytest.approx([0.01, 0.01, 0.02, 0.07])


def test_rows_add_what_they_cost_beyond_a_chain_of_the_same_tokens():
    curve = CostCurve(
        tokens=(1, 16), seconds=(0.03, 0.045), rows=(1, 4, 16), row_seconds=(0.0, 0.002, 0.014)
    )
    assert curve.at([1, 16], 1).tolist() == pytest.approx([0.03, 0.045])  # one row: the chain
    assert curve.at(16, 16).item() == pytest.approx(0.045 + 0.014)
    assert curve.at(10, 10).item() == pytest.approx(0.039 + 0.008)  # both interpolated
    assert curve.at(32, 32).item() == pytest.approx(0.061 + 0.030)  # both continued
    assert CostCurve.from_json(curve.to_json()) == curve
    partial = {**curve.to_json(), "row_seconds": [0.0]}
    assert CostCurve.from_json(partial) is None and CostCurve.from_json({"tokens": [1]}) is None


def test_a_row_costing_more_than_its_token_makes_drafting_pay_sooner():
    """8 requests that accept their one drafted token in one step of five (about 1.23 tokens a
    step when asked): on the line (20 ms + 1 ms a token) a drafting step costs 29% more than the
    28 ms plain one, more than it brings; with 35 ms for 8 rows beyond the chain the plain step
    costs 63 ms, drafting 13% more, and it pays (control: the same chain without rows)."""
    rows = CostCurve(
        tokens=LINE.tokens, seconds=LINE.seconds, rows=(1, 8), row_seconds=(0.0, 0.035)
    )
    chosen = {}
    for name, curve in (("chain", LINE), ("rows", rows)):
        speculation = policy(curve)
        for i in range(8):
            for step in range(62):
                teach(speculation, i, 2.0 if step % 5 == 0 else 1.0, nodes=2, steps=1)
        assert 1.2 < speculation.estimate(0)[0][0] < 1.25
        chosen[name] = speculation.step_budgets(list(range(8))).drafting
    assert chosen == {"chain": 0, "rows": 8}


@pytest.mark.parametrize("accepting, drafts", [(False, 0), (True, 4)])
def test_a_step_that_carries_prompt_tokens_decodes_plainly(accepting, drafts):
    """4 requests, accepting about 0.14 tokens a step (drafting does not pay for them) or 1 (it
    does): beside a prompt chunk they decode plainly either way, since the prompts' prefill is
    what the compute is for while they wait (weighed against the 4 rows alone, drafting one node
    each beside a 500-token chunk looked cheap and slowed every ramp-up)."""
    speculation = policy()
    for i in range(4):
        for step in range(64):
            hit = accepting or step % 5 == 0
            teach(speculation, i, 2.0 if hit else 1.0, nodes=2, steps=1)
    assert speculation.step_budgets(list(range(4)), 500).budgets == dict.fromkeys(range(4), 0)
    assert speculation.step_budgets(list(range(4)), 0).drafting == drafts


class ErrorCosts(StepCosts):
    def __init__(self, curve, error):
        super().__init__(curve)
        self._error = error

    def error(self) -> float:
        return self._error


@pytest.mark.parametrize("error, budget", [(0.0, 1), (0.04, 6)])
def test_a_larger_budget_is_taken_within_the_cost_fits_error(error, budget):
    """A request accepting its first drafted node, and node 6 too in a third of its steps
    (about 2.39 tokens a step at budget 6, ending on such a step): on the line the 1-node budget
    scores best (2 tokens in 22 ms), the 6-node one 2.7% below it (2.39 in 27 ms). Within a 4%
    error of the costs the larger is taken (what lies past a cut is never seen again); with
    known costs, not."""
    speculation = Speculation("auto")
    speculation.use_costs(ErrorCosts(LINE, error))
    for step in range(58):
        hit = step % 3 == 0
        teach(speculation, 0, 3.0 if hit else 2.0, 7, 1, (1, 6) if hit else (1,))
    assert 2.35 < speculation.estimate(0)[0][BUDGETS.index(6)] < 2.45
    assert speculation.step_budgets([0]).budgets == {0: budget}


def test_the_cost_fits_error_is_its_scatter_over_the_root_of_its_weight():
    exact, noisy = _Fit(0.0, 1.0, 0.02), _Fit(0.0, 1.0, 0.02)
    rng = np.random.default_rng(0)
    for x in np.tile([0.02, 0.03, 0.05], 40):
        exact.observe(x, 0.005 + x)
        noisy.observe(x, (0.005 + x) * (1 + 0.1 * rng.standard_normal()))
    assert exact.error() < 1e-3
    weight = exact.weight  # about 20: the memory of the decaying weights
    assert 0.5 * 0.1 / np.sqrt(weight) < noisy.error() < 2 * 0.1 / np.sqrt(weight)


def test_the_curve_is_measured_for_rows_and_leaves_the_slots_free(model_dir):
    from specdec.generation.loading import load_backend
    from specdec.plugins.registry import default_registry
    from specdec.tuning.costs import measure_curve

    target = specdec.load(model_dir, backend="numpy", slots=4, capacity=128)
    backend = load_backend("numpy", default_registry())
    curve = measure_curve(backend, target, [0, 1, 2, 3], repeats=1)
    assert curve.rows == (1, 2, 4) and curve.row_seconds[0] == 0.0
    assert np.all(np.diff(curve.row_seconds) >= 0) and min(curve.row_seconds) >= 0
    assert curve.tokens == (1, 2, 4, 8, 16, 32, 64)  # the sizes that fit after its prompt
    result = specdec.generate(
        target, [[5, 6, 7]] * 4, drafter="none", backend="numpy", max_new_tokens=2
    )
    assert len(result.tokens) == 4  # every slot free again


def test_a_slow_curve_measurement_says_how_far_it_is(model_dir, monkeypatch, capsys):
    """The first drafting generate on a busy machine measured step costs for ten minutes after
    its one line, with no word of progress: rounds are said as they end past a minute (here
    every round, the minute set to nothing)."""
    from specdec import progress
    from specdec.generation.loading import load_backend
    from specdec.plugins.registry import default_registry
    from specdec.tuning.costs import measure_curve

    monkeypatch.setattr(progress, "LINE_SECONDS", 0.0)
    target = specdec.load(model_dir, backend="numpy", slots=1, capacity=64)
    backend = load_backend("numpy", default_registry())
    assert measure_curve(backend, target, [0], repeats=2) is not None
    err = capsys.readouterr().err
    assert "specdec: measuring step costs: 1 of 3 rounds done" in err
    assert "specdec: measuring step costs: 3 of 3 rounds done" in err


def test_the_curve_line_says_how_many_requests_it_measures_for(tmp_path, monkeypatch, capsys):
    """The kit printed "measuring what a step of tiny costs" three times in a row, once per slot
    count, which read as a loop: the line names the count."""
    from specdec.tuning import costs

    monkeypatch.setattr(costs, "_cache_file", lambda b, t, n: tmp_path / f"costs-{n}.json")
    made = costs.CostCurve(tokens=(1, 2), seconds=(0.01, 0.02))
    monkeypatch.setattr(costs, "measure_curve", lambda *args, **kwargs: made)
    costs.curve_for(None, None)
    costs.curve_for(None, None, slots=(0, 1, 2))
    # the measuring lines (a busy machine adds its own line after each)
    err = [line for line in capsys.readouterr().err.splitlines() if "measuring" in line]
    assert err[0].startswith("specdec: measuring what a step of this model costs on this machine")
    assert "costs with up to 3 requests at once on this machine" in err[1], err
    # two targets of one model in other forms measure apart: the line names the form (the
    # same line twice read as one measurement repeated)
    import types

    exact = types.SimpleNamespace(
        name="m", dtype="torch.float32", exactness=types.SimpleNamespace(on=True)
    )
    costs.curve_for(None, exact, slots=(0, 1, 2, 3))
    assert "what a step of m (float32, exact mode) costs with up to 4" in capsys.readouterr().err


def test_a_curve_measured_beside_other_work_is_measured_again_and_the_quieter_kept(
    tmp_path, monkeypatch
):
    from specdec.tuning import costs
    from specdec.tuning import machine, store

    monkeypatch.setattr(costs, "_cache_file", lambda *args: tmp_path / "costs.json")
    made = iter(
        [costs.CostCurve(tokens=(1, 2), seconds=(s, 2 * s)) for s in (0.03, 0.02, 0.025, 0.01)]
    )
    shares = iter([0.5, 0.7, 0.6, 0.99])
    monkeypatch.setattr(costs, "measure_curve", lambda *args, **kwargs: next(made))
    monkeypatch.setattr(machine, "free_share", lambda wall, cpu, others: next(shares))
    quiet = [False]
    monkeypatch.setattr(store, "quiet_now", lambda: quiet[0])

    def start(now_quiet):  # a new start of the process (its probe says ``now_quiet``), the curve
        quiet[0] = now_quiet
        store.forget_this_process()
        return costs.curve_for(None, None).seconds[0]

    # measured at a share of 0.5, read at busy starts; at quiet starts measured again: 0.7 is
    # kept, 0.6 is not, 0.99 is
    seen = [start(q) for q in (False, False, True, True, False, True)]
    assert seen == [0.03, 0.03, 0.02, 0.02, 0.02, 0.01]

    (tmp_path / "costs.json").unlink()
    monkeypatch.setattr(machine, "free_share", lambda wall, cpu, others: 0.95)
    made = iter([costs.CostCurve(tokens=(1, 2), seconds=(s, 2 * s)) for s in (0.04, 0.05)])
    assert [start(True) for _ in range(3)] == [0.04] * 3  # measured quiet: read
    (tmp_path / "costs.json").unlink()
    monkeypatch.setattr(machine, "free_share", lambda wall, cpu, others: 0.5)
    made = iter([costs.CostCurve(tokens=(1, 2), seconds=(s, 2 * s)) for s in (0.06, 0.07)])
    store.forget_this_process()
    # busy, but measured by this process: read until the next start
    assert [costs.curve_for(None, None).seconds[0] for _ in range(3)] == [0.06] * 3


def test_a_curve_taken_beside_other_work_says_so_once_where_auto_prices_with_it(
    tmp_path, monkeypatch, capsys
):
    """Auto drafted in 2 of 15 steps on a curve measured while other work held 83% of the
    cores, and nothing said why its prediction held drafting back."""
    from specdec.tuning import costs, machine, store

    monkeypatch.setattr(costs, "_cache_file", lambda *args: tmp_path / "costs.json")
    monkeypatch.setattr(store, "_SAID_BUSY", set())
    made = costs.CostCurve(tokens=(1, 2), seconds=(0.03, 0.06))
    monkeypatch.setattr(costs, "measure_curve", lambda *args, **kwargs: made)
    monkeypatch.setattr(machine, "free_share", lambda wall, cpu, others: 0.17)
    monkeypatch.setattr(store, "quiet_now", lambda: False)
    for _ in range(3):  # measured, then read: one line
        costs.curve_for(None, None)
    said = [line for line in capsys.readouterr().err.splitlines() if "step costs" in line]
    assert said == [
        "specdec: the step costs speculation='auto' prices drafting with were measured while "
        "other work held 83% of the cores, so auto may draft in fewer steps than this machine "
        "pays for; they are measured again at a start that finds the machine quiet "
        "(speculation='always' drafts every step meanwhile)"
    ]
    (tmp_path / "costs.json").unlink()
    monkeypatch.setattr(store, "_SAID_BUSY", set())
    monkeypatch.setattr(machine, "free_share", lambda wall, cpu, others: 0.97)
    costs.curve_for(None, None)
    assert "step costs" not in capsys.readouterr().err  # quiet: nothing to say


# ---------------------------------------------------------------------------------------------
# Prompt chunks


def test_prefill_budget_keeps_the_step_within_its_stall():
    speculation = policy()
    for i in range(4):
        teach(speculation, i, 1.0)
    budget = speculation.prefill_tokens(
        [0, 1, 2, 3], "auto"
    )  # 4 plain rows: 24 ms; twice that allows 24 tokens
    assert budget in (23, 24)
    assert speculation.prefill_tokens([], "auto") == PREFILL_CHUNK  # nobody to stall
    assert (
        speculation.prefill_tokens([0], 100) == 100
        and speculation.prefill_tokens([0], None) is None
    )
    steep = policy(CostCurve(tokens=(1, 2), seconds=(0.02, 1.0)))
    assert steep.prefill_tokens([0], "auto") == MIN_PREFILL  # a long prompt always advances


def test_prompts_in_line_size_the_chunk_to_the_batch_being_filled():
    """4 rows decoding and 12 prompts in line for a row: the chunk keeps the step within twice
    the plain step of 16 rows (36 ms on the line: 48 tokens), not of the 4 rows alone (24
    tokens), which under a queue fed on itself (small chunks, prompts held in their slots,
    fewer rows decoding, smaller chunks)."""
    speculation = policy()
    rows = [0, 1, 2, 3]
    assert speculation.prefill_tokens(rows, "auto", queued=12) in (47, 48)
    assert speculation.prefill_tokens(rows, "auto", queued=0) == speculation.prefill_tokens(
        rows, "auto"
    )


def test_the_prefill_budget_is_sized_to_the_rows_plain_step_whether_or_not_they_draft():
    """4 requests that accept 3 tokens a step draft 8-node trees (a 60 ms step on the line); the
    prompt chunk beside them is still sized to twice their plain step (24 ms), as for requests
    that do not draft: a chunk sized to the drafting step would make a step that the choice
    decodes plainly beside it run past the stall."""
    drafting, plain = policy(), policy()
    for i in range(4):
        teach(drafting, i, 3.0, accepted_nodes=(6, 8))
        teach(plain, i, 1.0)
    assert (
        drafting.step_budgets([0, 1, 2, 3]).drafting == 4
        and plain.step_budgets([0, 1, 2, 3]).drafting == 0
    )
    assert drafting.prefill_tokens([0, 1, 2, 3], "auto") == plain.prefill_tokens(
        [0, 1, 2, 3], "auto"
    )


def test_a_short_prompt_goes_before_a_long_one_and_the_long_one_keeps_a_share():
    chunks = choose_chunks([2000], [12, 900, 30], 128)
    assert chunks[:2] == [
        ("waiting", 0, 12),
        ("waiting", 2, 30),
    ]  # whole: their first tokens come now
    assert chunks[2] == ("prefilling", 0, 128 - 12 - 30)
    assert choose_chunks([2000], [90, 10], 128) == [
        ("waiting", 0, 90),
        ("prefilling", 0, 38),
    ]  # 32 kept for it
    assert choose_chunks([2000], [100], 128) == [
        ("prefilling", 0, 128)
    ]  # the rest goes oldest first
    assert choose_chunks([600, 10], [5], float("inf")) == [
        ("prefilling", 1, 10),
        ("waiting", 0, 5),
        ("prefilling", 0, PREFILL_CHUNK),
    ]


@given(
    prefilling=st.lists(st.integers(1, 1500), max_size=3),
    waiting=st.lists(st.integers(1, 1500), max_size=4),
    budget=st.integers(1, 1024),
)
def test_chunks_respect_the_budget_and_take_each_prompt_at_most_once(prefilling, waiting, budget):
    chunks = choose_chunks(prefilling, waiting, budget)
    assert sum(t for *_, t in chunks) <= budget
    assert len({(k, i) for k, i, _ in chunks}) == len(chunks)
    sizes = {"prefilling": prefilling, "waiting": waiting}
    assert all(1 <= t <= min(sizes[k][i], PREFILL_CHUNK) for k, i, t in chunks)
    if prefilling and budget >= 4:
        assert any(k == "prefilling" and i == 0 for k, i, _ in chunks)  # the oldest always advances


# ---------------------------------------------------------------------------------------------
# Cut trees and position-keyed uniforms


@given(
    beams=st.lists(st.lists(st.integers(0, 3), min_size=3, max_size=3), min_size=1, max_size=4),
    rows=st.integers(1, 3),
    data=st.data(),
)
def test_a_cut_tree_is_the_first_nodes_of_the_whole_one(beams, rows, data):
    beams = np.array([[[5] + b for b in beams]] * rows)  # (rows, W, 4), root 5
    tree = build_prefix_tree(beams)
    budgets = data.draw(
        st.lists(st.one_of(st.none(), st.integers(0, 12)), min_size=rows, max_size=rows)
    )
    cut = cut_tree(
        tree.tokens, tree.parents, tree.depth, tree.ancestor_mask, tree.num_nodes, budgets
    )
    keep = [n if k is None else min(n, k + 1) for n, k in zip(tree.num_nodes, budgets)]
    if cut is None:
        assert keep == tree.num_nodes.tolist()
        return
    check_tree_output("cut_tree", cut.tokens, cut.parents, cut.num_nodes, 16)
    assert cut.num_nodes.tolist() == keep and cut.size == max(keep)
    for b, n in enumerate(keep):
        assert np.array_equal(cut.tokens[b, :n], tree.tokens[b, :n])
        assert np.array_equal(cut.ancestor_mask[b, :n, :n], tree.ancestor_mask[b, :n, :n])
    padded = merge_trees(
        [
            (
                cut.tokens[b : b + 1, :n],
                cut.parents[b : b + 1, :n],
                cut.depth[b : b + 1, :n],
                cut.ancestor_mask[b : b + 1, :n, :n],
                cut.num_nodes[b : b + 1],
            )
            for b, n in enumerate(keep)
        ]
    )
    for field in ("tokens", "parents", "depth", "ancestor_mask"):  # padding as merge_trees pads
        assert np.array_equal(getattr(padded, field)[:, : cut.size], getattr(cut, field))


def test_token_uniforms_are_keyed_by_position():
    request = Request(
        prompt=[1, 2], sampling=specdec.SamplingConfig(temperature=0.7), seed=4, max_new_tokens=80
    )
    one, other = RequestState(request, 0), RequestState(request, 1)
    first = one.token_uniforms(3)
    one.emit([9, 9, 9])
    other.emit([9])
    other.draw((5, 5))  # the drafter's stream does not move the tokens'
    other.emit([9, 9])
    assert np.array_equal(one.token_uniforms(40), other.token_uniforms(40))
    assert np.array_equal(first, RequestState(request, 2).token_uniforms(3))
    assert np.array_equal(np.random.default_rng([4, 0]).random(43)[3:], one.token_uniforms(40))


# ---------------------------------------------------------------------------------------------
# Budgets never change a request's tokens (float64 reference)


class Drawn(Speculation):
    """Budgets from a list drawn by Hypothesis, in turn for each row of each step."""

    def __init__(self, budgets):
        super().__init__("always")
        self.draws = itertools.cycle(budgets)

    def step_budgets(self, request_ids, chunk_tokens=0):
        return StepBudgets({i: next(self.draws) for i in request_ids}, len(request_ids), 0)


BUDGET_DRAWS = st.lists(st.sampled_from([0, 0, 1, 2, 3, 5, None]), min_size=1, max_size=12)


@pytest.fixture(scope="module")
def drafters(model_dir, tmp_path_factory):
    root = tmp_path_factory.mktemp("budget_drafters")
    return {
        kind: make_random_drafter(root / kind, model_dir, kind=kind, seed=3)
        for kind in ("redrafter", "eagle", "draft_model")
    }


@pytest.mark.parametrize("drafter", ["lookup", "redrafter", "eagle", "draft_model"])
@settings(max_examples=10, deadline=None)
@given(
    prompts=st.lists(
        st.lists(st.integers(1, 95), min_size=1, max_size=5).map(lambda p: p * 2),
        min_size=1,
        max_size=3,
    ),
    budgets=BUDGET_DRAWS,
    temperature=st.sampled_from([0.0, 0.0, 0.8]),
    seed=st.integers(0, 2**20),
)
def test_budgets_drawn_by_hypothesis_never_change_a_requests_tokens(
    model_dir, drafters, drafter, prompts, budgets, temperature, seed
):
    source = drafters.get(drafter, drafter)
    options = (
        {"sample": False} if drafter == "draft_model" else {}
    )  # sampled chains: rejection, whole drafts only
    result = specdec.generate(
        model_dir,
        prompts,
        drafter=source,
        backend="numpy",
        max_new_tokens=10,
        temperature=temperature,
        seed=[seed + i for i in range(len(prompts))],
        speculation=Drawn(budgets),
        **options,
    )
    for prompt, tokens, s in zip(prompts, result.tokens, itertools.count(seed)):
        plain = specdec.generate(
            model_dir,
            prompt,
            drafter="none",
            backend="numpy",
            max_new_tokens=10,
            temperature=temperature,
            seed=[s],
        ).tokens
        assert tokens == plain, (
            f"prompt {prompt} with budgets {budgets} differs from plain decoding alone"
        )


class _FrozenCosts(StepCosts):
    """A cost model that never learns from the steps (its prediction stays what it was)."""

    def observe(self, *args, **kwargs) -> None:
        pass


@pytest.mark.parametrize("rows", [1, 16])
def test_drafting_that_delivers_less_than_plain_stops_within_a_few_steps(rows):
    """Whatever the prediction says (here a cost model that prices trees at almost nothing and
    never corrects itself), a row count whose drafting steps deliver fewer tokens per second
    than its plain steps decodes plainly after at most PROBE drafting steps (and the first, left
    out as one-off costs), and tries drafting again only after the plain steps that keep its
    probes' lost time within RETRY_COST of them (specdec.decode.realized): three drafting steps
    of twice the tokens at four times the seconds lose 3 * 2 * (2 - 1) = 6 plain steps."""
    from specdec.decode.realized import PROBE, RETRY_COST

    RETRY = math.ceil(PROBE * 2 * (2 - 1) / RETRY_COST)

    speculation = Speculation("auto")
    speculation.use_costs(_FrozenCosts(CostCurve(tokens=(1, 1024), seconds=(0.02, 0.0201))))
    ids = list(range(rows))
    for i in ids:
        teach(speculation, i, 3.0)
    drafted = []
    for step in range(RETRY + 20):
        plan = speculation.step_budgets(ids)
        budgets = [plan.budgets[i] for i in ids]
        drafting = sum(b != 0 for b in budgets)
        accepted = np.full(rows, 1 if drafting else 0)
        nodes = np.full(rows, 9 if drafting else 1)
        path = np.zeros((rows, 9), dtype=np.int64)
        path[:, 1] = accepted
        speculation.observe_rows(ids, budgets, nodes, np.full(rows, 9), path, accepted)
        # drafting steps: twice the tokens at four times the seconds of a plain step
        seconds = 0.08 if drafting else 0.02
        speculation.observe_step(rows * int(nodes[0]), seconds, drafting, 0.0, rows, rows)
        drafted.append(bool(drafting))
    first = PROBE + 1  # the first drafting step is not counted
    assert all(drafted[:first]) and not any(drafted[first : first + RETRY])
    assert any(drafted[first + RETRY :])  # tried again, once its losses are old


def test_a_probe_that_loses_little_is_retried_sooner_than_one_that_loses_much():
    """The plain steps before drafting is probed again are sized by what the probes cost: a row
    count whose drafting steps delivered 0.7x of plain decoding's tokens/s is tried again after
    fewer plain steps than one whose drafting steps delivered 0.25x, and each probe lost in a row
    doubles the wait (specdec.decode.realized.retry_steps)."""
    from specdec.decode.realized import MIN_RETRY, PROBE, RETRY_COST, RealizedRates

    def waits(draft_seconds: float) -> tuple[int, int]:
        rates = RealizedRates()
        rates.observe(1, 1, 0.02, drafted=False)  # the first of each kind: one-off costs
        rates.observe(1, 2, draft_seconds, drafted=True)
        for _ in range(PROBE):
            assert rates.allows(1)
            rates.observe(1, 2, draft_seconds, drafted=True)
        rates.observe(1, 1, 0.02, drafted=False)  # the yardstick
        first = rates.retry_steps(0)
        steps = 1
        while not rates.allows(1):
            rates.observe(1, 1, 0.02, drafted=False)
            steps += 1
        for _ in range(PROBE):  # the second probe loses too
            rates.observe(1, 2, draft_seconds, drafted=True)
        return first, steps, rates.retry_steps(0)

    # 2 tokens in 0.057 s: 0.7x of plain's 50 tokens/s; in 0.16 s: 0.25x
    little, little_steps, little_again = waits(0.057)
    much, much_steps, much_again = waits(0.16)
    assert little == max(math.ceil(PROBE * 2 * (1 / 0.7 - 1) / RETRY_COST), MIN_RETRY)
    assert little < much == math.ceil(PROBE * 2 * (4 - 1) / RETRY_COST)
    # the yardstick step counts among them: drafting was found to lose with it
    assert little_steps == little and much_steps == much
    assert little_again == 2 * little and much_again == 2 * much


def test_drafting_that_delivers_more_than_plain_goes_on():
    speculation = Speculation("auto")
    speculation.use_costs(_FrozenCosts(CostCurve(tokens=(1, 1024), seconds=(0.02, 0.0201))))
    teach(speculation, 0, 3.0)
    drafted = []
    for _ in range(40):
        plan = speculation.step_budgets([0])
        drafting = int(plan.budgets[0] != 0)
        accepted = np.array([2 if drafting else 0])
        path = np.zeros((1, 9), dtype=np.int64)
        path[0, 1:3] = [1, 2] if drafting else [0, 0]
        nodes = np.array([9 if drafting else 1])
        speculation.observe_rows([0], [plan.budgets[0]], nodes, np.array([9]), path, accepted)
        speculation.observe_step(int(nodes[0]), 0.025 if drafting else 0.02, drafting, 0.0, 1, 1)
        drafted.append(bool(drafting))
    assert sum(drafted) >= 35  # 3 tokens in 1.25 steps' time: it keeps drafting


def test_drafting_that_loses_a_little_at_every_step_stops_within_a_few_steps():
    """A drafter that accepts nothing and costs little: every drafting step commits the one token
    a plain step does in 7% more time (0.93x), steps scattered by +-3% around that. Its estimate
    stays just above plain (a fresh request drifts back toward the engine's prior while it decodes
    plainly), so the prediction keeps choosing it; a loss that small is not a clear one (below
    LOSS), but every drafting step shows it alike, and the realized check stops drafting after
    PROBE steps (and the first) and two plain steps to weigh them against, then probes again at
    most every MIN_RETRY plain steps (doubling). Before, it drafted in about 60% of the steps."""
    from specdec.decode.realized import MIN_RETRY, PROBE, YARDSTICK

    speculation = Speculation("auto")
    speculation.use_costs(_FrozenCosts(CostCurve(tokens=(1, 1024), seconds=(0.02, 0.0201))))
    speculation.use_tree_size(4)  # a chain of three drafted tokens
    drafted = []
    for step in range(96):
        plan = speculation.step_budgets([0])
        drafting = int(plan.budgets[0] != 0)
        nodes = np.array([4 if drafting else 1])
        path = np.array([[0, -1, -1, -1]])
        speculation.observe_rows([0], [plan.budgets[0]], nodes, np.array([4]), path, np.zeros(1))
        scatter = 1.0 + 0.03 * math.sin(1.7 * step)  # deterministic, far from a tie
        seconds = (0.02 / 0.93 if drafting else 0.02) * scatter
        speculation.observe_step(int(nodes[0]), seconds, drafting, 0.0, 1, 1)
        drafted.append(bool(drafting))
    # the first plain run of MIN_RETRY steps starts once the probes and the yardstick are done
    runs = "".join("d" if d else "p" for d in drafted)
    assert runs.find("p" * MIN_RETRY) <= PROBE + 1 + YARDSTICK + 2, runs
    # then at most PROBE drafting steps per retry, the retries at least MIN_RETRY, 2 MIN_RETRY,
    # 4 MIN_RETRY ... plain steps apart
    assert sum(drafted) <= PROBE + 1 + PROBE * 3, runs


def test_the_first_step_at_a_new_row_count_is_not_priced():
    """A batch of two whose other request ended took its first drafting step at one row in 205
    ms (a kernel's first run at that row count) where the next took 50: counted, it judged
    drafting lost at one row, and the next 70 plain steps there, the following requests'
    included, decoded plainly."""
    from specdec.decode.realized import PROBE, RealizedRates

    rates = RealizedRates()
    for rows, tokens, seconds, drafted in [(2, 4, 0.18, True), (2, 2, 0.043, False)] * 2:
        rates.observe(rows, tokens, seconds, drafted)
    rates.observe(1, 2, 0.205, True)  # the first drafting step at one row
    for _ in range(PROBE):
        rates.observe(1, 2, 0.05, True)  # 40 tokens/s
    for _ in range(3):
        rates.observe(1, 1, 0.042, False)  # 24 tokens/s
    assert rates.describe()["1"] == {"plain": 23.8, "draft": 40.0}
    assert not rates.losing(0) and rates.allows(1)


def test_a_verdict_lapses_when_the_requests_it_was_measured_on_have_ended():
    """One request whose first three drafting steps at one row accepted nothing (the start of an
    answer) judged drafting lost there; the next request, which accepts 2 tokens a step, decoded
    36 of its 58 steps plainly on that verdict. A verdict speaks of its requests' acceptance:
    when they have all ended, the row count is probed afresh."""
    from specdec.decode.realized import PROBE, RealizedRates

    rates = RealizedRates()
    for _ in range(PROBE + 1):  # the first: a one-off, left out
        rates.observe(1, 1, 0.05, True, [7])  # accepted nothing: 20 tokens/s
    for _ in range(3):
        rates.observe(1, 1, 0.04, False)  # 25 tokens/s
    assert rates.losing(0) and not rates.allows(1)
    rates.forget(8)  # another request ended: the verdict stands
    assert not rates.allows(1)
    rates.forget(7)
    assert rates.allows(1)  # probing again from scratch
    for _ in range(PROBE):
        rates.observe(1, 3, 0.05, True, [9])  # 60 tokens/s
    rates.observe(1, 1, 0.04, False)
    assert not rates.losing(0) and rates.allows(1)


def test_a_request_after_one_that_accepted_nothing_tries_a_dear_tree_again():
    """Where a tree step costs twice a plain one (float32 on an AVX2-only CPU), a first request
    that accepted nothing left the engine's average too low for the next: predicted to lose, it
    never drafted, and exploring its tree was refused as too dear (over EXPLORE_COST spread over
    EXPLORE_EVERY steps), so it never learnt that it accepts three tokens a step (0 of 127 steps
    drafted on each MT-Bench prompt after the first). Exploring is spaced out instead."""
    from specdec.decode.budget import EXPLORE_COST

    curve = CostCurve(tokens=(1, 2, 1024), seconds=(0.04, 0.08, 0.09))  # any tree: 2x plain
    speculation = Speculation("auto")
    speculation.use_costs(_FrozenCosts(curve))
    teach(speculation, 0, 1.0, steps=30)  # the first request accepted nothing
    speculation.forget(0)
    drafted = []
    for step in range(80):
        plan = speculation.step_budgets([1])
        drafting = plan.budgets[1] != 0
        nodes = np.array([9 if drafting else 1])
        path = np.array([[0, 1, 2] + [-1] * 6])
        accepted = np.array([2 if drafting else 0])
        speculation.observe_rows([1], [plan.budgets[1]], nodes, np.array([9]), path, accepted)
        seconds = 0.08 if drafting else 0.04
        speculation.observe_step(int(nodes[0]), seconds, int(drafting), 0.0, 1, 1)
        drafted.append(drafting)
    every = math.ceil((0.08 - 0.04) / (EXPLORE_COST * 0.04))  # 20 steps
    first = drafted.index(True)
    assert first <= every + 1, drafted  # never, before
    assert sum(drafted[first:]) >= 0.8 * len(drafted[first:])  # 3 tokens in 2 steps' time: on


def test_requests_shorter_than_the_exploring_spacing_are_tried_again():
    """A tree dear enough that exploring is spaced 40 steps apart, and requests of 26 steps: each
    request had to be stale for 40 of its own steps before it was tried again, so none ever was.
    After a first request that accepted nothing, requests that repeat code (6 tokens a step when
    they draft) decoded plainly in every step. The engine's spacing bounds the cost; a
    request waits EXPLORE_EVERY of its own steps."""
    from specdec.decode.budget import EXPLORE_COST, EXPLORE_EVERY

    curve = CostCurve(tokens=(1, 2, 1024), seconds=(0.04, 0.12, 0.13))  # any tree: 3x plain
    every = math.ceil((0.12 - 0.04) / (EXPLORE_COST * 0.04))
    assert every == 40 and EXPLORE_EVERY < 26 < every
    speculation = Speculation("auto")
    speculation.use_costs(_FrozenCosts(curve))
    teach(speculation, 0, 1.0, steps=30)  # the first request accepted nothing
    speculation.forget(0)
    drafted = {}
    for request in range(1, 6):
        for step in range(26):
            plan = speculation.step_budgets([request])
            drafting = plan.budgets[request] != 0
            nodes = np.array([9 if drafting else 1])
            path = np.array([[0, 1, 2, 3, 4, 5] + [-1] * 3])
            accepted = np.array([5 if drafting else 0])
            speculation.observe_rows(
                [request], [plan.budgets[request]], nodes, np.array([9]), path, accepted
            )
            speculation.observe_step(
                int(nodes[0]), 0.12 if drafting else 0.04, int(drafting), 0.0, 1, 1
            )
            drafted.setdefault(request, []).append(drafting)
        speculation.forget(request)
    assert any(drafted[1]), drafted  # tried again, though shorter than the spacing
    assert sum(drafted[5]) >= 0.8 * 26, drafted  # 6 tokens in 3 steps' time: drafting on
