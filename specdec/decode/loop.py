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

import heapq
import itertools
import time
from collections import deque
from typing import Iterator, Sequence

import attrs
import numpy as np

from specdec import compute
from specdec.decode import lease
from specdec.decode import checks as step_checks
from specdec.decode.batching import (
    Checked,
    Group,
    admissions,
    cut_to_budgets,
    draw,
    drafted_tokens,
    full_batch,
    group_output,
    join_admissions,
    join_steps,
    last_position,
    merge_verdicts,
    observe_accepted,
    plain_group,
    step_tree,
    verify_uniform_shape,
    verify_uniforms,
)
from specdec.decode.budget import check_speculation, make_speculation
from specdec.capabilities import drafter_caps, request_end, verifier_caps
from specdec.tuning.costs import step_costs
from specdec.errors import InvalidInputError
from specdec.decode.plan import DecodePlan
from specdec.decode.prefill import plan_chunks
from specdec.reference.sampling import sample_from, target_probs
from specdec.decode.requests import Request, RequestState
from specdec.types import (
    Draft,
    DraftContext,
    PromptOutput,
    SamplingConfig,
    StepResult,
    TargetOutput,
    Verdict,
)


class Decoder:
    """Decodes requests over the target's slots; ``submit`` and ``cancel`` between ``step``
    calls."""

    def __init__(self, plan: DecodePlan):
        self.plan = plan
        self.caps = drafter_caps(plan.drafter, plan.source("drafter"))
        self.needs_draft_probs = verifier_caps(
            plan.verifier, plan.source("verifier")
        ).needs_draft_probs
        self.layers = self.caps.hidden_layers if self.caps.stateful else ()
        # a stateful drafter's end(slot, reason), or end(slot) when written without the reason
        self.drafter_end = request_end(plan.drafter) if self.caps.stateful else None
        # requests admitted whole by TargetModel.admit: the drafter's begin needs every prompt
        # position
        self.whole_prompts = self.caps.stateful and self.caps.prompt_states
        self.waiting: deque[tuple[int, Request]] = deque()
        self.active: dict[int, tuple[int, RequestState]] = {}  # slot -> (request id, state)
        self._cursor: dict[
            int, int
        ] = {}  # slot -> prompt tokens in the cache, while its prompt is prefilled
        self._free = list(range(int(plan.target.num_slots)))
        self._ids = itertools.count()
        self._hidden = None  # (num_slots, H) backend array: each slot's hidden state at its root
        self._committing = False
        self._forwarded = (
            None  # (chunks, their PromptOutputs) once the running step's forward has run
        )
        self.steps = 0
        # verifiers that read draft distributions verify whole drafts only: every request drafts;
        # a drafter whose trees are the root alone ("none") leaves "auto" nothing to weigh
        mode = check_speculation(plan.speculation)
        if self.needs_draft_probs:
            mode = "always"
        elif mode == "auto" and self.caps.max_tree_size == 1:
            mode = "never"
        self.speculation = make_speculation(mode)
        self._budgets: dict = {}  # request id -> this step's budget (specdec.decode.budget)
        self.prefill_budget = (
            None  # the prompt tokens the last step with prompts to prefill could carry
        )
        if self.speculation.needs_costs and self.speculation.costs is None:
            self._measure_costs()

    def _measure_costs(self) -> None:
        """This machine's step costs, measured in the free slots unless cached."""
        self.speculation.use_costs(step_costs(self.plan.backend, self.plan.target, self._free))

    @property
    def idle(self) -> bool:
        return not self.waiting and not self.active

    def submit(self, request: Request) -> int:
        """Queue ``request``; returns its id (0, 1, ... in submission order)."""
        longest = len(request.prompt) + request.max_new_tokens
        if longest > self.plan.target.capacity:
            raise InvalidInputError(
                f"a prompt of {len(request.prompt)} tokens plus "
                f"max_new_tokens={request.max_new_tokens} needs {longest} positions; the target's "
                f"slots hold {self.plan.target.capacity} (load it with a larger capacity, or ask "
                "for fewer tokens)"
            )
        request_id = next(self._ids)
        self.waiting.append((request_id, request))
        return request_id

    def cancel(self, request_id: int, reason: str = "cancelled") -> bool:
        """Drop a waiting or active request (its slot is freed now); False when it is not here.
        reason: the finish reason a stateful drafter's ``end`` is told ("stop" when the caller
        ended it at a stop string)."""
        for item in self.waiting:
            if item[0] == request_id:
                self.waiting.remove(item)
                return True
        for slot, (rid, _) in list(self.active.items()):
            if rid == request_id:
                self._finish(slot, reason)
                return True
        return False

    def close(self, reason: str = "cancelled") -> None:
        """Cancel everything: free every slot (a stateful drafter's ``end`` is told ``reason``)."""
        self.waiting.clear()
        for slot in list(self.active):
            self._finish(slot, reason)

    def began(self, slot: int) -> bool:
        """The request in ``slot`` has its prompt in, so a stateful drafter's ``begin`` ran."""
        return slot in self.active and slot not in self._cursor

    def _finish(self, slot: int, reason: str) -> None:
        began = self.began(slot)
        self.speculation.forget(self.active.pop(slot)[0])
        self._cursor.pop(slot, None)
        if self.caps.stateful and began:
            self.drafter_end(slot, reason)
        self.plan.target.release(slot)
        heapq.heappush(self._free, slot)

    def step(
        self, *, max_prefill_tokens: int | None = None, failures: list | None = None, on_admit=None
    ) -> list[StepResult]:
        """One target forward: prompt chunks of the requests in their context phase, then the
        draft trees of those in their generation phase (``specdec.reference.packing``). Returns
        the admissions' StepResult (requests whose prompt finished this step, with their first
        token; ``is_prefill``) and the decode step's, each when it has rows.

        max_prefill_tokens: prompt tokens per step (None: no bound; "auto": chosen from the step
        costs, ``specdec.decode.budget``). Prompts that finish within the budget go first, then
        chunks of longer ones (``specdec.decode.prefill``), so long prompts never stall the requests
        being decoded. A stateful drafter's requests get ``begin`` once their prompt is in; with
        ``caps.prompt_states`` they are prefilled whole, by ``TargetModel.admit``, before the
        step (its ``begin`` needs every prompt position): the budget counts whole prompts, the
        first always admitted. Each request drafts what ``self.speculation`` budgets it.
        failures: None raises what the step raises. A list keeps the other requests going: a
        step that raises before its commit is run again one request at a time from the same
        state and random numbers (not with stateful drafters), the request that still raises
        is dropped (its slot freed) and ``(request id, exception)`` appended.
        on_admit: called with the admissions' StepResult before the decode step's is returned.
        """
        if (
            max_prefill_tokens != "auto"
            and max_prefill_tokens is not None
            and max_prefill_tokens < 1
        ):
            raise InvalidInputError(
                f"max_prefill_tokens must be >= 1, None or 'auto', got {max_prefill_tokens}"
            )
        results, chunks = [], []
        if (self.waiting and self._free) or self._cursor:
            if max_prefill_tokens == "auto" and self.speculation.costs is None:
                self._measure_costs()
            budget = self.prefill_budget = self.speculation.prefill_tokens(
                [rid for slot, (rid, _) in self.active.items() if slot not in self._cursor],
                max_prefill_tokens,
                queued=len(self._cursor) + min(len(self.waiting), len(self._free)),
            )
            if not self.whole_prompts:
                chunks = self._schedule_chunks(budget)
            elif self.waiting and self._free:
                results.append(self._admit(budget, failures))
        decoding = [slot for slot in sorted(self.active) if slot not in self._cursor]
        self._budgets = self.speculation.plan(
            [self.active[s][0] for s in decoding], sum(end - start for _, start, end in chunks)
        ).budgets
        groups: dict[tuple[SamplingConfig, bool], list[int]] = {}  # (sampling, drafts) -> slots
        for slot in decoding:
            request_id, state = self.active[slot]
            groups.setdefault((state.request.sampling, self._budgets[request_id] != 0), []).append(
                slot
            )
        if chunks or groups:
            self.steps += bool(groups)
            admitted, decoded = self._run_isolated(chunks, list(groups.items()), failures)
            if admitted:
                results.append(admitted[0] if len(admitted) == 1 else join_admissions(admitted))
            if groups:
                results.append(join_steps(self.steps, decoded))
        if on_admit is not None:
            for result in results:
                if result.is_prefill:
                    on_admit(result)
        return results

    def _schedule_chunks(self, budget: int | None) -> list[tuple[int, int, int]]:
        """This step's prompt chunks, (slot, start, end) of its request's prompt, while ``budget``
        lasts (``specdec.decode.prefill``); a waiting request takes a free slot with its first
        chunk."""
        cursor = list(self._cursor.items())
        waiting = list(itertools.islice(self.waiting, len(self._free)))
        chunks = []
        for kind, index, take in plan_chunks(
            [len(self.active[s][1].request.prompt) - start for s, start in cursor],
            [len(request.prompt) for _, request in waiting],
            float("inf") if budget is None else budget,
        ):
            if kind == "prefilling":
                slot, start = cursor[index]
            else:
                (request_id, request), start = waiting[index], 0
                self.waiting.remove(waiting[index])
                slot = heapq.heappop(self._free)
                self.active[slot] = (request_id, RequestState(request, slot))
                self._cursor[slot] = 0
            chunks.append((slot, start, start + take))
        return chunks

    def _drop(self, request_id: int, error: Exception, failures: list) -> None:
        """Record ``error`` for ``request_id`` and free its slot if it holds one."""
        failures.append((request_id, error))
        self.speculation.forget(request_id)
        slot = next((s for s, (rid, _) in self.active.items() if rid == request_id), None)
        if slot is None:
            return
        began = self.began(slot)
        self.active.pop(slot)
        self._cursor.pop(slot, None)
        ends = ((lambda s: self.drafter_end(s, "error")),) if self.caps.stateful and began else ()
        for release in ends + (self.plan.target.release,):
            try:
                release(slot)
            except Exception:  # noqa: BLE001
                # the request failed already (a chunk that failed claimed no slot)
                pass
        heapq.heappush(self._free, slot)

    def _admit(
        self, max_prefill_tokens: int | None = None, failures: list | None = None
    ) -> StepResult:
        """Admit waiting requests whole (``caps.prompt_states``): ``TargetModel.admit`` per
        prompt."""
        start = time.perf_counter()
        ids, tokens, prefilled = [], [], 0
        while self.waiting and self._free:
            request_id, request = self.waiting[0]
            if (
                max_prefill_tokens is not None
                and prefilled
                and prefilled + len(request.prompt) > max_prefill_tokens
            ):
                break
            self.waiting.popleft()
            prefilled += len(request.prompt)
            try:
                tokens.append(self._admit_one(request_id, request))
            except Exception as error:
                if failures is None:
                    raise
                self._drop(request_id, error, failures)
                continue
            ids.append(request_id)
        return admissions(self.steps, ids, tokens, time.perf_counter() - start)

    def _admit_one(self, request_id: int, request: Request) -> list[int]:
        """Prefill ``request`` into a free slot; its first token (none kept if it ends there)."""
        slot = heapq.heappop(self._free)
        state = RequestState(request, slot)
        try:
            output = self.plan.target.admit(slot, request.prompt, layers=self.layers)
        except Exception:
            heapq.heappush(self._free, slot)
            raise
        self.active[slot] = (request_id, state)
        self.plan.drafter.begin(slot, np.asarray(request.prompt, dtype=np.int64), output)
        return self._first_token(state, output)

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

    def _run_isolated(self, chunks, groups, failures) -> tuple[list[StepResult], list[StepResult]]:
        """``_run``, which with ``failures`` drops the requests it fails for (see ``step``)."""
        if failures is None:
            return self._run(chunks, groups, None)
        chunk_states = [self.active[s][1] for s, *_ in chunks]
        states = chunk_states + [self.active[s][1] for _, slots in groups for s in slots]
        saved = [None if s.generator is None else s.generator.bit_generator.state for s in states]
        self._committing, self._forwarded = False, None
        try:
            return self._run(chunks, groups, failures)
        except Exception as error:
            admitted = None
            if (
                self._forwarded is not None
            ):  # the forward ran: its chunks are committed, their requests move on
                forwarded, self._forwarded = self._forwarded, None
                admitted = self._advance_chunks(*forwarded, failures)
                states, chunks = states[len(chunk_states) :], []
            if (
                len(states) <= 1 or self._committing or self.caps.stateful
            ):  # states: the chunks' and rows' requests
                for state in states:
                    if state.slot in self.active and self.active[state.slot][1] is state:
                        self._drop(self.active[state.slot][0], error, failures)
                return admitted or [], []
        for state, generator_state in zip(states, saved[len(saved) - len(states) :]):
            if generator_state is not None:
                state.generator.bit_generator.state = generator_state
        admitted, decoded = list(admitted or []), []
        alone = [([chunk], []) for chunk in chunks] + [
            ([], [(key, [s])]) for key, slots in groups for s in slots
        ]
        for part_chunks, part_groups in alone:
            a, d = self._run_isolated(part_chunks, part_groups, failures)
            admitted += a
            decoded += d
        return admitted, decoded

    def _draft(self, key: tuple[SamplingConfig, bool], slots: np.ndarray) -> Group:
        """The group's draft and tree: a one-node tree per row when it does not draft, else the
        drafter's, cut to the rows' budgets."""
        plan, backend, target = self.plan, self.plan.backend, self.plan.target
        sampling, drafts = key
        states, ids = [self.active[s][1] for s in slots], tuple(self.active[s][0] for s in slots)
        where = backend.from_numpy(slots, target)
        if not drafts:
            return plain_group(
                Group(
                    sampling=sampling,
                    slots=slots,
                    ids=ids,
                    states=states,
                    where=where,
                    draft=None,
                    tree=None,
                ),
                backend,
                target,
            )
        sample_shape = self.caps.sample_shape
        context = DraftContext(
            root_tokens=backend.from_numpy(
                np.array([s.root for s in states], dtype=np.int64), target
            ),
            hidden=self._hidden[where],
            sampling=sampling,
            num_generated=np.array([s.emitted for s in states], dtype=np.int64),
            uniforms=draw(states, sample_shape) if sample_shape else None,
            want_draft_probs=self.needs_draft_probs,
            history=tuple(s.history for s in states),
            slots=slots,
        )
        draft = plan.drafter.propose(context)
        budgets = tuple(self._budgets.get(i) for i in ids)
        tree, full = cut_to_budgets(plan.tree_builder.build(draft), budgets, backend, target)
        return Group(
            sampling=sampling,
            slots=slots,
            ids=ids,
            states=states,
            where=where,
            draft=draft,
            tree=tree,
            budgets=budgets,
            full_nodes=full,
        )

    def _run(self, chunks, groups, failures) -> tuple[list[StepResult], list[StepResult]]:
        """One forward of prompt ``chunks`` and the trees of sampling ``groups``; their results
        (``failures``: as in ``step``, for a drafter's ``begin`` that raises)."""
        backend, target = self.plan.backend, self.plan.target
        t0 = time.perf_counter()
        drafted = [self._draft(key, np.array(slots, dtype=np.int64)) for key, slots in groups]
        t1 = time.perf_counter()
        tree, slots = step_tree(drafted, backend, target)
        context = [
            (slot, self.active[slot][1].request.prompt[start:end]) for slot, start, end in chunks
        ]
        try:
            output = target.forward_tree(tree, slots, context=context, layers=self.layers)
        except Exception as exc:
            # a bad draft or tree fails here first: name the plugin that made it
            for group in drafted:
                step_checks.check_group(self.plan, group.draft, group.tree, cause=exc)
            raise
        step_checks.check_chunk_outputs(
            f"the {backend.name!r} target {type(target).__name__}", output.context, context
        )
        self._forwarded = (chunks, output.context)  # committed: never run again (_run_isolated)
        verdicts, row = [], 0
        for group in drafted:
            rows = len(group.slots)
            own = (
                output
                if len(drafted) == 1
                else group_output(output, row, row + rows, group.tree.size)
            )
            verdicts.append(self._verify(group, own))
            row += rows
        t2 = time.perf_counter()
        self._committing = True  # from here on a failed step cannot be run again (_run_isolated)
        if len(drafted) == 1:
            target.commit(tree, verdicts[0].verdict)
        elif drafted:
            merged = merge_verdicts(verdicts)
            on_target = lambda a: backend.from_numpy(a, target)  # noqa: E731
            target.commit(
                tree,
                Verdict(
                    path=on_target(merged.path),
                    num_accepted=on_target(merged.num_accepted),
                    bonus_tokens=on_target(merged.bonus_tokens),
                ),
            )
        decoded = [self._accept(group, checked) for group, checked in zip(drafted, verdicts)]
        self._forwarded = None
        admitted = self._advance_chunks(
            chunks, output.context, failures
        )  # after commit: ending frees the slot
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
            decoded[0] = attrs.evolve(
                decoded[0], time_draft=t1 - t0, time_verify=t2 - t1, time_other=t3 - t2
            )
        elif admitted:
            admitted[0] = attrs.evolve(admitted[0], time_prefill=t3 - t0)
        return admitted, decoded

    def _verify(self, group: Group, output: TargetOutput) -> Checked:
        """Verify ``group`` on its rows of the output; the verdict copied to the host and
        checked."""
        plan, backend, target = self.plan, self.plan.backend, self.plan.target

        uniforms = verify_uniforms(group.states, verify_uniform_shape(group.draft))
        verdict = plan.verifier.verify(
            group.tree,
            group.draft,
            output,
            group.sampling,
            None if uniforms is None else backend.from_numpy(uniforms, target),
        )
        path = backend.to_numpy(verdict.path)  # the step's one wait for the device
        num_accepted, bonus = (
            backend.to_numpy(verdict.num_accepted),
            backend.to_numpy(verdict.bonus_tokens),
        )
        beams, tokens, parents, num_nodes = step_checks.check_group(
            self.plan, group.draft, group.tree
        )
        step_checks.check_verdict(
            plan.source("verifier"),
            path,
            num_accepted,
            bonus,
            parents,
            num_nodes,
            int(target.vocab_size),
        )
        return Checked(
            output=output,
            verdict=verdict,
            path=path,
            num_accepted=num_accepted,
            bonus=bonus,
            beams=beams,
            tokens=tokens,
            num_nodes=num_nodes,
        )

    def _accept(self, group: Group, checked: Checked) -> StepResult:
        """Emit what ``group``'s rows accepted; hidden states of their new roots; finished requests
        leave."""
        backend, target = self.plan.backend, self.plan.target
        path, num_accepted, bonus, tokens = (
            checked.path,
            checked.num_accepted,
            checked.bonus,
            checked.tokens,
        )
        beams, num_nodes = checked.beams, checked.num_nodes
        on_target = lambda array: backend.from_numpy(array, target)  # noqa: E731
        # tokens of the distinct beams, before deduplication into the tree
        drafted = (
            drafted_tokens(beams, group.draft.beam_lengths) if beams is not None else num_nodes - 1
        )
        drafted = np.where(
            num_nodes < group.full_nodes, num_nodes - 1, drafted
        )  # cut to a budget: what was verified
        self.speculation.observe_rows(
            group.ids, group.budgets, num_nodes, group.full_nodes, path, num_accepted
        )
        rows = np.arange(len(group.slots))
        self._hidden[group.where] = checked.output.hidden[
            on_target(rows), on_target(path[rows, num_accepted])
        ]
        new_tokens = [
            state.emit(
                [int(t) for t in tokens[b, path[b, 1 : num_accepted[b] + 1]]] + [int(bonus[b])]
            )
            for b, state in enumerate(group.states)
        ]
        if self.caps.stateful:
            observe_accepted(self.plan, group, checked)
        for state in group.states:
            if state.done:
                self._finish(state.slot, state.finish_reason)
        return StepResult(
            step=self.steps,
            requests=group.ids,
            new_tokens=new_tokens,
            num_accepted=num_accepted,
            num_drafted=np.asarray(drafted, dtype=np.int64),
            num_verified=num_nodes.astype(np.int64),
        )

    def _advance_chunks(
        self, chunks, outputs: Sequence[PromptOutput], failures=None
    ) -> list[StepResult]:
        """Move the prefilled requests' cursors; those whose prompt is in begin with a stateful
        drafter (the states at their last position) and emit their first token."""
        ids, tokens = [], []
        for (slot, _, end), output in zip(chunks, outputs, strict=True):
            request_id, state = self.active[slot]
            if end < len(state.request.prompt):
                self._cursor[slot] = end
                continue
            del self._cursor[slot]
            if self.caps.stateful:
                try:
                    self.plan.drafter.begin(
                        slot,
                        np.asarray(state.request.prompt, dtype=np.int64),
                        last_position(output),
                    )
                except Exception as error:
                    if failures is None:
                        raise
                    self._drop(request_id, error, failures)
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
        while not decoder.idle:
            for result in decoder.step():
                yield full_batch(result, len(prompts))
    except Exception:
        reason = "error"
        raise
    finally:
        if decoder is not None:
            decoder.close(reason)
        lease.release(plan.target)
