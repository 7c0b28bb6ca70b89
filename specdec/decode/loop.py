"""The backend-agnostic decode loop over request slots: admit -> draft -> build tree -> verify
forward -> accept -> commit -> release.

A ``Decoder`` holds requests waiting for a slot and the requests being decoded, one per target
slot. Each ``step()`` runs one target forward over the requests in their context phase (prompt
chunks: waiting requests are admitted into free slots, long prompts are split over several
steps; a prompt's last chunk gives its first token) and those in their generation phase (one
draft tree per group of requests sharing sampling settings and drafting or not:
``specdec.decode.batching``); how much each drafts, and the step's prompt tokens, are
``specdec.decode.budget``'s choice. A request that ends frees its slot in that step.
``decode_steps`` runs a fixed list of prompts through a Decoder (``generate``); ``specdec.Engine``
feeds one from other threads.

What the drafter, tree builder and verifier return is checked each step (``specdec.decode.checks``),
and an error names the plugin that returned it. Each request draws its randomness from its own
generator on the host (``specdec.decode.requests``), so its tokens do not depend on the batch.
"""

from __future__ import annotations

import contextlib
import functools
import time
from typing import Iterator, Sequence

import attrs
import numpy as np

from specdec import compute
from specdec.capabilities import drafter_caps, request_end, verifier_caps
from specdec.decode import checks as step_checks
from specdec.decode import lease
from specdec.decode.batching import (
    Checked,
    Group,
    commit_verdict,
    drafted_counts,
    group_output,
    last_position,
    observe_accepted,
    step_tree,
)
from specdec.decode.group_step import draft_group, verify_group
from specdec.decode.isolation import StepProgress, run_isolated
from specdec.decode.memory import speculation_for
from specdec.decode.plan import DecodePlan
from specdec.decode.requests import Request, RequestState, check_fits_slots
from specdec.decode.scheduler import Scheduler, check_prefill_setting
from specdec.decode.slot_table import SlotTable
from specdec.decode.step_results import admissions, full_batch, join_admissions, join_steps
from specdec.reference.sampling import sample_from, target_probs
from specdec.tuning.costs import step_costs
from specdec.types import PromptOutput, StepResult


class Decoder:
    """Runs decode steps over the target's slots: the ``Scheduler`` chooses each step's work from
    the ``SlotTable``, the decoder runs it (one forward, the verdicts, the commit) and keeps each
    slot's hidden state. ``submit`` and ``cancel`` between ``step`` calls."""

    def __init__(self, plan: DecodePlan):
        self.plan = plan
        self.caps = drafter_caps(plan.drafter, plan.source("drafter"))
        self.needs_draft_probs = verifier_caps(
            plan.verifier, plan.source("verifier")
        ).needs_draft_probs
        self.layers = self.caps.hidden_layers if self.caps.stateful else ()
        # a stateful drafter's end(slot, reason), or end(slot) when written without the reason
        self._drafter_end = request_end(plan.drafter) if self.caps.stateful else None
        # requests admitted whole by TargetModel.admit: the drafter's begin needs every prompt
        # position
        self.whole_prompts = self.caps.stateful and self.caps.prompt_states
        self.table = SlotTable.of(plan.target.num_slots)
        self._hidden = None  # (num_slots, H) backend array: each slot's hidden state at its root
        self.progress = StepProgress()
        self.steps = 0
        self.speculation = speculation_for(plan, self.caps, self.needs_draft_probs)
        self._budgets: dict = {}  # this step's, request id -> tree nodes (StepWork.budgets)
        self._draft = functools.partial(
            draft_group,
            plan,
            sample_shape=self.caps.sample_shape,
            want_draft_probs=self.needs_draft_probs,
        )
        step_kind = getattr(plan.drafter, "step_kind", None)  # optional (protocols.StepKinds)
        self.scheduler = Scheduler(
            self.table, self.speculation, step_kind if self.speculation.needs_costs else None
        )
        if self.speculation.needs_costs:
            self._measure_costs()

    def _measure_costs(self) -> None:
        """This machine's step costs, measured in the free slots unless cached."""
        if self.speculation.costs is None:
            costs = step_costs(self.plan.backend, self.plan.target, self.table.free)
            self.speculation.use_costs(costs)

    @property
    def idle(self) -> bool:
        return self.table.idle

    @property
    def prefill_budget(self) -> int | None:
        """The prompt tokens the last step with prompts to put in could carry."""
        return self.scheduler.prefill_budget

    def counts(self) -> tuple[int, int]:
        """(waiting, holding a slot); safe to read from another thread."""
        return self.table.counts()

    def submit(self, request: Request) -> int:
        """Queue ``request``; returns its id (0, 1, ... in submission order)."""
        check_fits_slots(request, int(self.plan.target.capacity))
        return self.table.queue(request)

    def cancel(self, request_id: int, reason: str = "cancelled") -> bool:
        """Drop a waiting or active request (its slot is freed now); False when it is not here.
        reason: the finish reason a stateful drafter's ``end`` is told ("stop" when the caller
        ended it at a stop string)."""
        if self.table.unqueue(request_id):
            return True
        slot = self.table.slot_of(request_id)
        if slot is not None:
            self._finish(slot, reason)
        return slot is not None

    def close(self, reason: str = "cancelled") -> None:
        """Cancel everything: free every slot (a stateful drafter's ``end`` is told ``reason``)."""
        self.table.waiting.clear()
        for slot in list(self.table.active):
            self._finish(slot, reason)

    def abandon(self) -> None:
        """After a ``close`` that raised: tell a stateful drafter that every begun request ended in
        an error, as far as it takes it, and keep nothing (a new Decoder starts afresh)."""
        begun = [s for s in list(self.table.active) if self.table.began(s)]
        for slot in begun if self.caps.stateful else ():
            with contextlib.suppress(Exception):  # the decoder is being replaced
                self._drafter_end(slot, "error")

    def _finish(self, slot: int, reason: str) -> None:
        request_id, began = self.table.unseat(slot)
        self.speculation.forget(request_id)
        if self.caps.stateful and began:
            self._drafter_end(slot, reason)
        self.plan.target.release(slot)

    def drop(self, request_id: int, error: Exception, failures: list) -> None:
        """Record ``error`` for ``request_id`` and free its slot if it holds one."""
        failures.append((request_id, error))
        self.speculation.forget(request_id)
        slot = self.table.slot_of(request_id)
        if slot is None:
            return
        _, began = self.table.unseat(slot)
        with contextlib.suppress(Exception):  # the request failed already
            if self.caps.stateful and began:
                self._drafter_end(slot, "error")
        with contextlib.suppress(Exception):
            self.plan.target.release(slot)

    def step(
        self, *, max_prefill_tokens: int | None = None, failures: list | None = None, on_admit=None
    ) -> list[StepResult]:
        """One target forward: prompt chunks of the requests in their context phase, then the
        draft trees of those in their generation phase (``specdec.reference.packing``). Returns
        the admissions' StepResult (requests whose prompt finished this step, with their first
        token; ``is_prefill``) and the decode step's, each when it has rows.

        max_prefill_tokens: prompt tokens per step (None: no bound; "auto": chosen from the step
        costs, ``specdec.decode.budget``; ``specdec.decode.scheduler`` picks the chunks). A
        stateful drafter's requests get ``begin`` once their prompt is in; with
        ``caps.prompt_states`` they are prefilled whole, by ``TargetModel.admit``, before the
        step (its ``begin`` needs every prompt position): the budget counts whole prompts, the
        first always admitted. Each request drafts what ``self.speculation`` budgets it.
        failures: None raises what the step raises; a list keeps the other requests going
        (``specdec.decode.isolation``). on_admit: called with the admissions' StepResult before
        the decode step's is returned.
        """
        check_prefill_setting(max_prefill_tokens)
        results, chunks = [], ()
        if self.table.has_prompts():
            if max_prefill_tokens == "auto":
                self._measure_costs()
            budget = self.scheduler.prompt_budget(max_prefill_tokens)
            if not self.whole_prompts:
                chunks = self.scheduler.chunks(budget)
            elif self.table.waiting and self.table.free:
                results.append(self._admit(self.scheduler.whole_prompts(budget), failures))
        work = self.scheduler.work(chunks)
        if not work.empty:
            self.steps += bool(work.groups)
            self._budgets = work.budgets
            admitted, decoded = run_isolated(self, work.chunks, work.groups, failures)
            if admitted:
                results.append(admitted[0] if len(admitted) == 1 else join_admissions(admitted))
            if work.groups:
                results.append(join_steps(self.steps, decoded))
        for result in results if on_admit is not None else ():
            if result.is_prefill:
                on_admit(result)
        return results

    def _admit(self, requests, failures: list | None) -> StepResult:
        """Admit ``requests`` whole (``caps.prompt_states``): ``TargetModel.admit`` per prompt."""
        start = time.perf_counter()
        ids, tokens = [], []
        for request_id, request in requests:
            try:
                state = self.table.seat(request_id, request, prefilling=False)
                try:
                    output = self.plan.target.admit(state.slot, request.prompt, layers=self.layers)
                except Exception:
                    self.table.unseat(state.slot)
                    raise
                prompt = np.asarray(request.prompt, dtype=np.int64)
                self.plan.drafter.begin(state.slot, prompt, output)
                tokens.append(self._first_token(state, output))
            except Exception as error:
                if failures is None:
                    raise
                self.drop(request_id, error, failures)
                continue
            ids.append(request_id)
        return admissions(self.steps, ids, tokens, time.perf_counter() - start)

    def _first_token(self, state: RequestState, output: PromptOutput) -> list[int]:
        """Emit the first token of a request whose prompt's forward gave ``output``."""
        backend, target = self.plan.backend, self.plan.target
        logits = backend.to_numpy(output.logits)[None]  # (1, V)
        first = (
            np.argmax(logits, axis=-1)
            if state.generator is None
            else sample_from(target_probs(logits, state.request.sampling), state.token_uniforms(1))
        )
        last = backend.from_numpy(np.array([output.hidden.shape[0] - 1]), target)
        if self._hidden is None:
            self._hidden = output.hidden[
                backend.from_numpy(np.zeros(target.num_slots, dtype=np.int64), target)
            ]
        self._hidden[backend.from_numpy(np.array([state.slot]), target)] = output.hidden[last]
        kept = state.emit([int(first[0])])
        if state.done:
            self._finish(state.slot, state.finish_reason)
        return kept

    def run(self, chunks, groups, failures) -> tuple[list[StepResult], list[StepResult]]:
        """One forward of prompt ``chunks`` and the trees of sampling ``groups``; their results
        (``failures``: as in ``step``, for a drafter's ``begin`` that raises)."""
        plan, backend, target = self.plan, self.plan.backend, self.plan.target
        t0 = time.perf_counter()
        active = self.table.active
        drafted = [
            self._draft(key, np.array(slots, dtype=np.int64), active, self._budgets, self._hidden)
            for key, slots in groups
        ]
        t1 = time.perf_counter()
        tree, slots = step_tree(drafted, backend, target)
        context = [(slot, active[slot][1].request.prompt[a:b]) for slot, a, b in chunks]
        try:
            output = target.forward_tree(tree, slots, context=context, layers=self.layers)
        except Exception as exc:  # a bad draft or tree fails here first: name who made it
            for group in drafted:
                step_checks.check_group(plan, group.draft, group.tree, cause=exc)
            raise
        where = f"the {backend.name!r} target {type(target).__name__}"
        step_checks.check_chunk_outputs(where, output.context, context)
        self.progress.forwarded = (chunks, output.context)  # committed: never run again
        verdicts, row = [], 0
        for group in drafted:
            rows, size = len(group.slots), group.tree.size
            own = output if len(drafted) == 1 else group_output(output, row, row + rows, size)
            verdicts.append(verify_group(plan, group, own))
            row += rows
        t2 = time.perf_counter()
        self.progress.committing = True  # from here on a failed step cannot be run again
        if drafted:
            target.commit(tree, commit_verdict(verdicts, backend, target))
        decoded = [self._accept(group, checked) for group, checked in zip(drafted, verdicts)]
        self.progress.forwarded = None
        admitted = self.advance_chunks(chunks, output.context, failures)  # ending frees the slot
        t3 = time.perf_counter()
        chunk_tokens = sum(len(c) for _, c in context)
        self.speculation.observe_step(
            chunk_tokens + (0 if tree is None else tree.size * len(slots)),
            t3 - t1,
            sum(len(g.slots) for g in drafted if g.budgets[:1] != (0,)),
            t1 - t0,
            rows=len(slots) + bool(context),
            plain_tokens=chunk_tokens + (0 if tree is None else len(slots)),
        )
        if decoded:
            times = dict(time_draft=t1 - t0, time_verify=t2 - t1, time_other=t3 - t2)
            decoded[0] = attrs.evolve(decoded[0], **times)
        elif admitted:
            admitted[0] = attrs.evolve(admitted[0], time_prefill=t3 - t0)
        return admitted, decoded

    def _accept(self, group: Group, checked: Checked) -> StepResult:
        """Emit what ``group``'s rows accepted; hidden states of their new roots; finished requests
        leave."""
        backend, target = self.plan.backend, self.plan.target
        path, num_accepted, num_nodes = checked.path, checked.num_accepted, checked.num_nodes
        on_target = lambda array: backend.from_numpy(array, target)  # noqa: E731
        self.speculation.observe_rows(
            group.ids, group.budgets, num_nodes, group.full_nodes, path, num_accepted
        )
        rows = np.arange(len(group.slots))
        self._hidden[group.where] = checked.output.hidden[
            on_target(rows), on_target(path[rows, num_accepted])
        ]
        new_tokens = [
            state.emit(
                [int(t) for t in checked.tokens[b, path[b, 1 : num_accepted[b] + 1]]]
                + [int(checked.bonus[b])]
            )
            for b, state in enumerate(group.states)
        ]
        if self.caps.stateful:
            observe_accepted(self.plan, group, checked)
        for state in group.states:
            if state.done:
                self._finish(state.slot, state.finish_reason)
        reasons = getattr(self.speculation, "reasons", {})
        budgets = group.budgets or (None,) * len(group.ids)
        return StepResult(
            step=self.steps,
            requests=group.ids,
            new_tokens=new_tokens,
            num_accepted=num_accepted,
            num_drafted=drafted_counts(group, checked),
            num_verified=num_nodes.astype(np.int64),
            plain_reasons=tuple(
                None
                if num_nodes[b] > 1
                else ("no draft" if budget != 0 else reasons.get(request_id, "prediction"))
                for b, (request_id, budget) in enumerate(zip(group.ids, budgets))
            ),
        )

    def advance_chunks(
        self, chunks, outputs: Sequence[PromptOutput], failures=None
    ) -> list[StepResult]:
        """Move the prefilled requests' cursors; those whose prompt is in begin with a stateful
        drafter (the states at their last position) and emit their first token."""
        ids, tokens = [], []
        for (slot, _, end), output in zip(chunks, outputs, strict=True):
            request_id, state = self.table.active[slot]
            if end < len(state.request.prompt):
                self.table.cursor[slot] = end
                continue
            del self.table.cursor[slot]
            if self.caps.stateful:
                try:
                    prompt = np.asarray(state.request.prompt, dtype=np.int64)
                    self.plan.drafter.begin(slot, prompt, last_position(output))
                except Exception as error:
                    if failures is None:
                        raise
                    self.drop(request_id, error, failures)
                    continue
            ids.append(request_id)
            tokens.append(self._first_token(state, output))
        return [admissions(self.steps, ids, tokens, 0.0)] if ids else []


def decode_steps(
    plan: DecodePlan, prompts: Sequence[Sequence[int]], *, seed=None
) -> Iterator[StepResult]:
    """Yield one StepResult per target forward (admissions and decode steps) until every prompt
    is done; row b of every result is prompt b (finished or waiting rows: no tokens, zero counts).
    Each step runs on the process's compute thread where the backend wants one
    (``specdec.compute``).

    The target is leased for the whole generation (``specdec.decode.lease``): a second generation on
    it while this one runs raises TargetBusyError at its first step, before touching the cache.
    """
    return compute.iterate(plan.backend, _decode_steps(plan, prompts, seed))


def _decode_steps(plan: DecodePlan, prompts: Sequence[Sequence[int]], seed) -> Iterator[StepResult]:
    lease.acquire(plan.target)
    decoder, reason = None, "cancelled"  # for requests left: the stream was closed (or it raised)
    try:
        decoder = Decoder(plan)
        for request in plan.requests(prompts, seed):
            decoder.submit(request)
        forwards = 0  # each result its own index: an admission once shared the step before's
        while not decoder.idle:
            for result in decoder.step():
                yield attrs.evolve(full_batch(result, len(prompts)), step=forwards)
                forwards += 1
    except Exception:
        reason = "error"
        raise
    finally:
        if decoder is not None:
            decoder.close(reason)
        lease.release(plan.target)
