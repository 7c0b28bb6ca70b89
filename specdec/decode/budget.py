"""How much each request drafts in a step, and how many prompt tokens the step carries.

Speculation trades spare compute for fewer steps. When many requests share a step there is no
spare compute left (a CPU, or a GPU at a large batch): every drafted node is paid for by the whole
step. So each step, ``Speculation.plan`` gives every request being decoded a **tree budget**: the
drafted nodes it may verify (0: decode it plainly, a one-node tree and no drafter call), chosen to
maximize the expected tokens per second of the whole step:

    score(S, k) = (B + sum over i in S of (a_i(k) - 1)) / (target(B) + extra(S, k))
    extra(S, k) = target(B * width(S, k)) - target(B) + draft(|S|)

over a budget k (``BUDGETS``, drafted nodes) and the set S of requests that draft, where B rows are
decoded, a_i(k) is request i's expected tokens per step (bonus counted) when its tree is cut to its
first k drafted nodes, width is the node count every tree row is padded to (the target takes one
(B, N) tree per forward, so a row that does not draft still pays the width when others do; each
request's expected width at k, the widest of S counted), and target / draft are the step's costs on
this machine (``specdec.tuning.costs``: a measured curve of forward seconds against tokens and
rows, corrected online from the steps' own timings: the plain step from plain steps, what trees add
from drafting steps). **A step that carries prompt tokens decodes plainly**: prompts waiting means
the compute is not spare (their prefill brings requests into the batch sooner), and drafting beside
them, weighed against the few rows decoding there, looked cheap: with 32 clients on 16 slots the
default path drafted beside the chunks of every ramp-up and made 0.62x of plain decoding
in-process. (Before: priced where the step is, weighed against the rows' own plain step.)
For each k the requests are ranked by a_i(k) and every prefix of the ranking is scored:
|BUDGETS| x B evaluations. Plain decoding wins unless drafting beats it by ``MARGIN``; among the
drafting choices within the cost fit's error of the best, the largest budget is taken.

**Acceptance, per request.** A tree's nodes are ordered so that parents come first (the prefix tree
puts the drafter's best beam first), so its first k + 1 nodes are a tree too and the path a verifier
accepts in the full tree, cut at node k, is what the cut tree accepts: one step with a full tree
tells a_i(k) for every k at once. Trees differ in size from step to step (a lookup beam rides along
only where the text repeats), so each request keeps, per budget, decaying averages
(``REQUEST_DECAY``) of how often its trees reach past the budget below, what the nodes between the
two accept when they do, and how many nodes a tree cut at the budget keeps (its expected width),
starting from the engine's averages over all requests; a_i(k) adds up the reaches times the gains.
The gains are learnt only from trees that reached that far and were verified there: a cut tree tells
nothing of the budgets above the cut, and learning those from the small trees that the cut leaves
whole would price the large trees' nodes at the small ones' (none) and keep cutting them; a gain no
tree has shown yet is the first guess, so the first large trees are verified whole and teach it.
While a request does not draft its estimates drift back toward the engine's (``FORGET`` per step).
**Kinds:** a drafter may sort a request's coming step before it drafts (``step_kind``,
``specdec.protocols.StepKinds``; the prompt-lookup beam: whether the text ends with an n-gram seen
before); every average here, the request's and the engine's, is then kept apart per kind, and a
step is decided on its kind's.
The plain step's price is learnt from plain steps only, so after ``PLAIN_EVERY`` steps without one
a step is decoded plainly (a price left too dear by a slow step would otherwise never be tested).
After ``EXPLORE_EVERY`` steps without its whole tree verified (it did not draft, or drafted less) a
request verifies its whole tree once more (a prompt-lookup match, say, appears only once the text
repeats itself), at most one such step in ``EXPLORE_EVERY``, or in as many more as keep the step's
extra cost, spread over them, within ``EXPLORE_COST`` of a step: a request that stopped drafting
on a few bad steps is tried again, however dear its tree, and a large batch is not slowed to try
it.

**What steps delivered.** A prediction can be wrong where it was never tested (a fresh engine
met a burst of 16 requests and drafted every step at half plain decoding's throughput), so the
tokens per second that decode steps actually delivered are kept per row count, plain and drafting
apart (``specdec.decode.realized``): at a row count drafting takes at most ``PROBE`` steps on
the prediction alone, and then stops where its steps delivered less than plain ones (below
``LOSS`` of their tokens per second, or by more than their scatter explains), to be tried again
after as many plain steps there as keep a probe's lost time within ``RETRY_COST`` of them
(twice as many after each probe that loses again).

**Lossless.** A budget only cuts a tree before verification; the verifier accepts what the target
itself would produce at every node it is given (greedy, and the exact tree walk whose uniforms are
keyed by the token's position, ``specdec.decode.requests``), so a request's tokens do not depend on
its budgets. A stateful drafter is told every committed token, drafted or not (``observe``).

**Prompt chunks** (``prefill_tokens``, for ``max_prefill_tokens="auto"``): the most prompt tokens
whose forward, beside the step's decoding rows, keeps the step within ``stall`` times the plain
step of the batch being filled (the decoding rows and the prompts in line for a row): an
inter-token latency target for the requests being decoded, at most twice the plain step of a
batch that holds every request in the engine (up to its slots) by default, whether or not they
draft beside the chunk; at least ``MIN_PREFILL`` tokens and at most
``specdec.slots.PREFILL_CHUNK``.
"""

from __future__ import annotations

import math
import os
from typing import Sequence

import attrs
import numpy as np

from specdec.decode.realized import RealizedRates, bucket
from specdec.errors import InvalidInputError
from specdec.tuning.costs import StepCosts, plain_share
from specdec.slots import PREFILL_CHUNK

__all__ = [
    "BUDGETS",
    "MODES",
    "PLAIN_REASONS",
    "Speculation",
    "StepBudgets",
    "check_speculation",
    "make_speculation",
    "speculation_mode",
]

MODES = ("auto", "always", "never")
SPECULATION_VARIABLE = (
    "SPECDEC_SPECULATION"  # the default mode when set (the test suite pins "always")
)
BUDGETS = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64)  # drafted nodes a request may verify in a step
PREFILL_STALL = (
    2.0  # a step carrying prompt chunks lasts at most this many times the step without them
)
MIN_PREFILL = 16  # prompt tokens a step carries at least, so that a long prompt always advances
MARGIN = 0.03  # drafting must beat plain decoding's predicted tokens/s by this much
TIE_LIMIT = 0.05  # choices within the cost fit's error of the best, up to this share, are ties
REQUEST_DECAY = 0.15  # weight of a request's newest step in its acceptance average
PRIOR_DECAY = 0.05  # weight of a step in the engine-wide acceptance average
FORGET = 0.05  # per step without drafting, a request's estimate moves this far back to the engine's
# steps without its whole tree after which a request tries it again, one per this many steps,
EXPLORE_EVERY = 16
EXPLORE_COST = 0.05  # ... when its extra cost spread over them is at most this share of a step
# a step decoded plainly after this many steps without one: the plain step's price is learnt from
# plain steps alone (``specdec.tuning.costs``), and a price left too dear would never be tested
PLAIN_EVERY = 64
# why a request's row decoded plainly in a step (``Speculation.reasons``; the decode loop adds
# "no draft" for a row whose drafter proposed nothing)
PLAIN_REASONS = ("prompt", "measuring", "prediction", "realized", "never", "no draft")
# tokens per step before any was seen
GUESS = 1.0 + 0.4 * np.sqrt(np.asarray(BUDGETS, dtype=np.float64))
_LIMITS = np.asarray(BUDGETS, dtype=np.float64)
_PREVIOUS = np.concatenate([[0.0], _LIMITS[:-1]])  # the budget below each (0 below the first)


@attrs.frozen
class StepBudgets:
    """The budgets of one step: ``budgets`` {request id: drafted nodes (0: plain; None: the whole
    tree)}, and what the plan expects: ``tokens`` in the forward besides prompt chunks, ``drafting``
    requests that call the drafter, ``seconds`` of the step."""

    budgets: dict
    tokens: int
    drafting: int
    seconds: float = 0.0


def check_speculation(value):
    """``value`` as given: "auto", "always", "never", None (``$SPECDEC_SPECULATION``, else "auto")
    or a ``Speculation`` object."""
    if value is None:
        value = os.environ.get(SPECULATION_VARIABLE, "").strip() or "auto"
    if isinstance(value, Speculation):
        return value
    if not isinstance(value, str) or value.lower() not in MODES:
        raise InvalidInputError(
            f"speculation must be one of {', '.join(MODES)} (or a "
            f"specdec.decode.budget.Speculation), got {value!r}"
        )
    return value.lower()


def speculation_mode(value, caps, needs_draft_probs: bool) -> str:
    """The mode a decoder runs ``value`` in: verifiers that read draft distributions verify
    whole drafts only (every request drafts, "always"); a drafter whose trees are the root alone
    ("none") leaves "auto" nothing to weigh ("never")."""
    mode = check_speculation(value)
    if needs_draft_probs:
        return "always"
    return "never" if mode == "auto" and caps.max_tree_size == 1 else mode


def make_speculation(value, caps, needs_draft_probs: bool) -> "Speculation":
    """The policy of a decoder whose drafter has ``caps``: a mode name makes one (in the mode
    ``speculation_mode`` says), an object is used as it is; either is told the drafter's largest
    tree (``Speculation.use_tree_size``)."""
    value = speculation_mode(value, caps, needs_draft_probs)
    speculation = value if isinstance(value, Speculation) else Speculation(value)
    speculation.use_tree_size(caps.max_tree_size)
    return speculation


class _Acceptance:
    """Decaying averages of what a request's trees hold and accept, per budget j (drafted nodes
    ``BUDGETS[j]``, the budget below it ``prev_j``, 0 below the first): ``reach[j]`` the share of
    trees with more than ``prev_j`` drafted nodes, ``gain[j]`` the drafted tokens accepted among
    nodes ``prev_j + 1 .. BUDGETS[j]`` of such a tree, ``width[j]`` the drafted nodes a tree cut at
    ``BUDGETS[j]`` keeps. ``gain`` is conditioned on the tree reaching that far, and learnt only
    where its nodes were verified: a budget that cuts the large trees (a lookup match, say) and
    keeps the small ones whole would otherwise learn the larger budgets' gains from the small
    trees alone, and never choose them. A gain never seen keeps the first guess (``GUESS``): it
    counts only as far as trees reach there, and such a tree is then verified and teaches it.
    ``known``: gains observed at least once (the first moves the average from the prior it
    starts at); ``stale``: steps since its whole tree was last verified (it did not draft, or its
    budget cut the tree). A request's first trees (``warm``) weigh as in a running mean (1/2,
    1/3, ... down to ``decay``): its own trees, not the average over the requests before it,
    soon decide (after one request that accepted nothing, the next, accepting two drafted tokens
    a tree, was still predicted to lose after its first tree, which moved the estimate 15%)."""

    def __init__(self, decay: float, most: float = float(BUDGETS[-1]), *, warm: bool = False):
        self.decay = decay
        self.warm = warm  # the first trees weigh as in a running mean (1/2, 1/3, ...)
        self.trees = 0
        self.gain = np.diff(GUESS, prepend=1.0)
        self.known = np.zeros(len(BUDGETS), dtype=bool)
        self.drafted = False  # reach and width observed
        self.stale = 0
        self.bound(most)

    def bound(self, most: float) -> None:
        """Trees of at most ``most`` drafted nodes (the drafter's caps): before any tree was
        seen, they reach as far as that and a budget keeps at most that many nodes."""
        if not self.drafted:
            self.reach = (most > _PREVIOUS).astype(np.float64)
            self.width = np.minimum(_LIMITS, most)

    @property
    def tokens(self) -> np.ndarray:
        """Tokens per step expected at each budget (the bonus token counted)."""
        return 1.0 + np.cumsum(self.reach * self.gain)

    @property
    def nodes(self) -> float:
        """Nodes of the whole tree (its root counted)."""
        return float(self.width[-1] + 1.0)

    def observe(self, gain: np.ndarray, seen: np.ndarray, drafted: int, prior: "_Acceptance"):
        """One tree of ``drafted`` nodes past its root; ``gain[j]`` where ``seen[j]``."""
        self.trees += 1
        step = max(self.decay, 1.0 / (self.trees + 1)) if self.warm else self.decay
        old = np.where(self.known, self.gain, prior.gain)
        self.gain = np.where(seen, (1 - step) * old + step * gain, self.gain)
        self.known |= seen
        reach = drafted > _PREVIOUS
        width = np.minimum(_LIMITS, drafted)
        old_reach, old_width = (
            (self.reach, self.width) if self.drafted else (prior.reach, prior.width)
        )
        self.reach = (1 - step) * old_reach + step * reach
        self.width = (1 - step) * old_width + step * width
        self.drafted = True

    def drift(self, prior: "_Acceptance", share: float) -> None:
        """Move ``share`` of the way back to ``prior`` (a step without drafting)."""
        self.gain = np.where(self.known, self.gain + share * (prior.gain - self.gain), self.gain)
        if self.drafted:
            self.reach = self.reach + share * (prior.reach - self.reach)
            self.width = self.width + share * (prior.width - self.width)


class Speculation:
    """The per-step budget policy of a decoder (module docstring): ``mode`` "auto" (from costs and
    acceptance), "always" (every request drafts its whole tree) or "never" (plain decoding).
    Subclasses may override ``choose``; budgets never change a request's tokens."""

    def __init__(self, mode: str = "auto", *, stall: float = PREFILL_STALL):
        if mode not in MODES:
            raise InvalidInputError(f"speculation must be one of {', '.join(MODES)}, got {mode!r}")
        self.mode = mode
        self.stall = float(stall)
        self.costs: StepCosts | None = None
        self._rows: dict[tuple[int, int], _Acceptance] = {}  # (request id, kind) -> its own
        self._priors: dict[int, _Acceptance] = {}  # kind -> the engine's, over all requests
        self._kinds: dict[int, int] = {}  # this step's: request id -> the kind of its step
        self._most: float | None = None  # the drafter's largest tree's drafted nodes
        self._quiet = EXPLORE_EVERY  # steps since a request was last tried again (_explore)
        self._since_plain = 0  # decode steps since the last one decoded plainly
        self.realized = RealizedRates()  # what steps delivered, per row count
        self._step_rows, self._step_tokens = 0, 0  # the decode rows of this step and their tokens
        self._step_drafted: set[int] = set()  # the requests that drafted this step
        self.reasons: dict[int, str] = {}  # this step's: request id -> why it decodes plainly

    @property
    def needs_costs(self) -> bool:
        return self.mode == "auto"

    def resume(self) -> None:
        """A new decoder takes this policy over (``specdec.decode.memory``): what it learnt over
        requests stays; each request's acceptance is gone with the request, and the first plain
        and drafting steps are timed as one-off costs again (a new drafter's first call)."""
        self._rows.clear()
        self._kinds = {}
        self.reasons = {}
        self._step_rows, self._step_tokens = 0, 0
        self._step_drafted = set()
        self.realized.restart()

    def use_costs(self, costs: StepCosts) -> None:
        self.costs = costs

    def use_tree_size(self, nodes: int | None) -> None:
        """The drafter's largest tree (``DrafterCaps.max_tree_size``, its root counted; None:
        unknown): what a request is expected to draft before its first tree is seen. Without it
        a fresh engine priced every request's tree at the largest budget (64 drafted nodes), so
        a request whose first few trees accepted little was never tried again (trying it looked
        dear) and one that accepted priced its trees wider than they are."""
        if nodes is not None:
            self._most = float(max(int(nodes) - 1, 0))
            for prior in self._priors.values():
                prior.bound(self._most)

    def _prior(self, kind: int) -> _Acceptance:
        """The engine's acceptance over every request's steps of ``kind``."""
        prior = self._priors.get(kind)
        if prior is None:
            prior = self._priors[kind] = _Acceptance(PRIOR_DECAY)
            if self._most is not None:
                prior.bound(self._most)
        return prior

    def _row(self, request_id: int) -> _Acceptance | None:
        """A request's own acceptance in steps of this step's kind (None: none seen yet)."""
        return self._rows.get((request_id, self._kinds.get(request_id, 0)))

    # -- estimates ---------------------------------------------------------------------------

    def estimate(self, request_id: int) -> tuple[np.ndarray, float]:
        """(tokens per step at each budget, whole-tree nodes) expected of a request."""
        tokens, width = self._estimates([request_id])
        return tokens[0], float(width[0, -1] + 1.0)

    def _estimates(self, ids: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
        """(B, budgets) tokens per step and drafted nodes kept expected of requests ``ids`` at
        each budget; what a request has not shown yet, the engine's average over all requests."""
        tokens, width = [], []
        for request_id in ids:
            prior, row = self._prior(self._kinds.get(request_id, 0)), self._row(request_id)
            if row is None:
                tokens.append(prior.tokens)
                width.append(prior.width)
                continue
            gain = np.where(row.known, row.gain, prior.gain)
            reach, kept = (row.reach, row.width) if row.drafted else (prior.reach, prior.width)
            tokens.append(1.0 + np.cumsum(reach * gain))
            width.append(kept)
        return np.array(tokens), np.array(width)

    # -- the choice --------------------------------------------------------------------------

    def step_budgets(
        self, request_ids: Sequence[int], chunk_tokens: int = 0, kinds: dict | None = None
    ) -> StepBudgets:
        """Budgets for the requests decoded this step, beside ``chunk_tokens`` prompt tokens;
        ``kinds``: request id -> the kind of its step (``Drafter.step_kind``; 0 where absent)."""
        self._kinds = dict(kinds or {})
        self._step_rows, self._step_tokens = 0, 0  # a step begins: its rows are counted anew
        self._step_drafted = set()
        self.reasons = {}
        ids = list(request_ids)
        if not ids:
            return StepBudgets({}, 0, 0)
        if self.mode == "never":
            self.reasons = dict.fromkeys(ids, "never")
            return StepBudgets(dict.fromkeys(ids, 0), len(ids), 0)
        if self.mode == "always" or self.costs is None:
            return StepBudgets(
                dict.fromkeys(ids, None),
                int(round(len(ids) * (self._estimates(ids)[1][:, -1].max() + 1.0))),
                len(ids),
            )
        plan = self.choose(ids, chunk_tokens)
        if not self.reasons:  # a subclass's choice: what it left plain, it left on its prediction
            self.reasons = {i: "prediction" for i in ids if plan.budgets.get(i) == 0}
        return plan

    def choose(self, ids: list[int], chunk_tokens: int) -> StepBudgets:
        """The budget and drafting set of the best predicted tokens per second (module docstring):
        every budget (columns) and every prefix of the requests ranked by their gain at it (rows).
        Among the choices within the cost fit's error of the best, the largest budget (then the
        most drafting requests) is taken: a cut tree tells nothing of what lies past the cut. A
        step that carries prompt tokens decodes plainly (module docstring)."""
        costs, batch = self.costs, len(ids)
        plain_time = float(costs.target(chunk_tokens + batch, batch + (chunk_tokens > 0)))
        chosen = StepBudgets(dict.fromkeys(ids, 0), batch, 0, plain_time)
        if chunk_tokens or self._since_plain >= PLAIN_EVERY:
            self.reasons = dict.fromkeys(ids, "prompt" if chunk_tokens else "measuring")
            return chosen
        tokens, kept = self._estimates(ids)  # (B, budgets) each
        gain = tokens - 1.0
        order = np.argsort(-gain, axis=0, kind="stable")  # (B, budgets): by gain at each budget
        ranked = np.take_along_axis(gain, order, axis=0)
        # every tree row is padded to the widest tree of the first m requests
        widest = np.maximum.accumulate(np.take_along_axis(kept, order, axis=0), axis=0)
        width = np.ceil(1.0 + widest - 1e-9).astype(np.int64)
        drafting = np.arange(1, batch + 1)[:, None]
        extra = costs.target(batch * width, batch, batch) - plain_time + costs.draft(drafting)
        scores = (batch + np.cumsum(ranked, axis=0)) / np.maximum(plain_time + extra, 1e-9)
        best = float(scores.max())
        near = np.argwhere(scores >= best * (1 - min(costs.error(), TIE_LIMIT)))
        j = int(near[:, 1].max())
        m = int(near[near[:, 1] == j, 0].max())
        if best > (batch / plain_time if plain_time > 0 else 0.0) * (1 + MARGIN):
            budgets = dict.fromkeys(ids, 0)
            budgets.update({ids[i]: BUDGETS[j] for i in order[: m + 1, j]})
            seconds = plain_time + float(extra[m, j])
            chosen = StepBudgets(budgets, int(batch * width[m, j]), m + 1, seconds)
        plan = self._explore(ids, kept[:, -1] + 1.0, chosen)
        if plan.drafting and not self.realized.allows(batch):  # drafting lost at this row count
            why = "realized" if self.realized.losing(bucket(batch)) else "measuring"
            self.reasons = dict.fromkeys(ids, why)
            return StepBudgets(dict.fromkeys(ids, 0), batch, 0, plain_time)
        self.reasons = {i: "prediction" for i in ids if plan.budgets[i] == 0}
        return plan

    def _explore(self, ids: list[int], nodes: np.ndarray, chosen: StepBudgets) -> StepBudgets:
        """``chosen`` with the request whose whole tree was verified longest ago drafting its whole
        tree: its estimate is old. At most one such step in ``EXPLORE_EVERY`` steps, or in as
        many more as keep its extra seconds, spread over them, within ``EXPLORE_COST`` of a step
        (and that request's tree not verified whole for as long). A tree costlier than that was
        never tried again before: where a tree step cost twice a plain one (float32 on an
        AVX2-only CPU), one request that accepted nothing left the engine's average too low for
        every request after it, and none drafted again (0 of 127 steps on each of seven
        MT-Bench prompts). The request itself waits ``EXPLORE_EVERY`` of its own steps, not
        ``every``: requests shorter than ``every`` (26 steps against a dear tree's 30 on a busy
        machine) were never tried again, so after one that accepted little, four requests that
        repeat code decoded plainly in every step where drafting gave 4 tokens a step."""
        batch, budgets = len(ids), dict(chosen.budgets)
        width = chosen.tokens / batch if batch else 1.0
        stale = [
            b
            for b, i in enumerate(ids)
            if budgets[i] is not None and (row := self._row(i)) and row.stale >= EXPLORE_EVERY
        ]
        if not stale or self._quiet < EXPLORE_EVERY:
            return chosen
        b = max(stale, key=lambda b: self._row(ids[b]).stale)
        wider = max(width, float(np.ceil(nodes[b])))
        drafting = chosen.drafting + (budgets[ids[b]] == 0)
        seconds = float(self.costs.target(batch * wider, batch, batch) + self.costs.draft(drafting))
        extra = (seconds - chosen.seconds) / (EXPLORE_COST * max(chosen.seconds, 1e-9))
        every = max(EXPLORE_EVERY, math.ceil(extra))  # steps the extra cost is spread over
        if self._quiet < every:  # the engine's spacing bounds the cost; a request waits only
            return chosen  # EXPLORE_EVERY of its own steps (one shorter than ``every`` never did)
        budgets[ids[b]] = None
        return StepBudgets(budgets, int(batch * wider), drafting, seconds)

    def prefill_tokens(self, request_ids: Sequence[int], setting, queued: int = 0) -> int | None:
        """Prompt tokens this step may carry: ``setting`` when it is a number or None, else
        ("auto") the most that keep the step within ``stall`` times the plain step of the batch
        being filled: the decoding rows and the ``queued`` prompts in line for a row (being
        prefilled, or waiting for a free slot). The plain step, not the one a drafting plan
        predicts: drafting is then weighed beside the chunk against that same plain step
        (``choose``), and a chunk sized to a drafting step that the choice then decodes plainly
        would stretch every row's step. The queued prompts count because a limit of the few rows
        decoding alone fed on itself under a queue: small chunks kept prompts in their slots,
        so fewer rows decoded, and the next chunk was smaller still (with 26 clients on 16
        slots, 3-8 rows decoding beside chunks of 17-30 tokens, the queue's prompts prefilled
        over 4-6 steps each)."""
        if setting != "auto":
            return setting
        if not request_ids or self.costs is None:
            return PREFILL_CHUNK
        rows, filled = len(request_ids), len(request_ids) + max(int(queued), 0)
        limit = self.stall * float(self.costs.target(filled, filled))

        def within(chunk: int) -> bool:  # the prompt tokens ride as one more row
            return float(self.costs.target(rows + chunk, rows + 1)) <= limit

        low, high = MIN_PREFILL, PREFILL_CHUNK
        if within(high):
            return high
        while high - low > 1:  # the largest chunk budget within the limit (the curve increases)
            middle = (low + high) // 2
            low, high = (middle, high) if within(middle) else (low, middle)
        return low

    # -- what happened -----------------------------------------------------------------------

    def observe_rows(
        self,
        request_ids: Sequence[int],
        budgets: Sequence,
        verified: np.ndarray,
        full_nodes: np.ndarray,
        path: np.ndarray,
        num_accepted: np.ndarray,
    ) -> None:
        """A group's rows were verified: ``verified`` nodes of trees of ``full_nodes`` (before
        their budgets cut them), accepted ``path`` (B, D+1) with ``num_accepted`` (B,)."""
        self._step_rows += len(request_ids)
        self._step_tokens += int(np.sum(np.asarray(num_accepted)[: len(request_ids)])) + len(
            request_ids
        )
        for b, request_id in enumerate(request_ids):
            kind = self._kinds.get(request_id, 0)
            prior = self._prior(kind)
            row = self._rows.setdefault((request_id, kind), _Acceptance(REQUEST_DECAY, warm=True))
            if budgets[b] == 0:  # did not draft: drift back toward the engine's average
                row.drift(prior, FORGET)
                row.stale += 1
                continue
            self._step_drafted.add(request_id)
            drafted, kept = int(full_nodes[b]) - 1, int(verified[b]) - 1
            cut = kept < drafted
            if not cut and row.stale >= EXPLORE_EVERY:  # tried again (_explore)
                self._quiet = 0
            row.stale = row.stale + 1 if cut else 0
            # accepted drafted nodes (their indices): what a tree cut at each budget accepts
            nodes = np.sort(path[b, 1 : int(num_accepted[b]) + 1])
            accepted = np.searchsorted(nodes, _LIMITS, side="right").astype(np.float64)
            gain = np.diff(accepted, prepend=0.0)
            # the nodes of budget j were in the tree, and all verified
            seen = (drafted > _PREVIOUS) & ((not cut) | (_LIMITS <= kept))
            row.observe(gain, seen, drafted, prior)
            prior.observe(gain, seen, drafted, prior)

    def observe_step(
        self,
        tokens: int,
        seconds: float,
        drafting: int,
        draft_seconds: float,
        rows: int = 1,
        plain_tokens: int | None = None,
    ) -> None:
        """A step ran: ``tokens`` in ``rows`` rows of its forward (``plain_tokens`` decoded
        plainly; None: all), ``seconds`` for the target part, ``drafting`` requests drafted in
        ``draft_seconds``."""
        self._quiet += 1
        plain = plain_share(tokens, plain_tokens) == tokens
        self._since_plain = 0 if plain else self._since_plain + 1
        if self.costs is not None:
            self.costs.observe(tokens, seconds, drafting, draft_seconds, rows, plain_tokens)
        decode_rows, committed, drafted = self._step_rows, self._step_tokens, self._step_drafted
        self._step_rows, self._step_tokens, self._step_drafted = 0, 0, set()
        if decode_rows and plain_share(tokens, plain_tokens) == decode_rows:  # no prompt tokens
            self.realized.observe(
                decode_rows, committed, seconds + draft_seconds, drafting > 0, drafted
            )

    def forget(self, request_id: int) -> None:
        """A request ended."""
        for key in [key for key in self._rows if key[0] == request_id]:
            del self._rows[key]
        self.realized.forget(request_id)
