"""The backend-agnostic decode loop over request slots: admit -> draft -> build tree -> verify
forward -> accept -> commit -> release.

A ``Decoder`` holds requests waiting for a slot and the requests being decoded, one per target
slot. Each ``step()`` admits waiting requests into free slots (their prompt's forward gives
their first token), then runs one speculative step over every active request: one target
forward per group of requests that share sampling settings. A request that ends frees its slot
in that step. ``decode_steps`` runs a fixed list of prompts through a Decoder (``generate``);
``specdec.Engine`` feeds one from other threads.

What the drafter, tree builder and verifier return is checked each step (``specdec.step_checks``),
and an error names the plugin that returned it. Each request draws its randomness from its own
generator on the host (``specdec.requests``), so its tokens do not depend on the batch.
"""

from __future__ import annotations

import heapq
import itertools
import time
from collections import deque
from typing import Iterator, Sequence

import attrs
import numpy as np

from specdec import lease, step_checks
from specdec.capabilities import drafter_caps, verifier_caps
from specdec.errors import InvalidInputError, PluginOutputError
from specdec.protocols import Backend, Drafter, TargetModel, TreeBuilder, Verifier
from specdec.reference.sampling import sample_from, target_probs
from specdec.requests import Request, RequestState, batch_seeds
from specdec.types import Accepted, Draft, DraftContext, SamplingConfig, StepResult


@attrs.frozen(kw_only=True)
class DecodePlan:
    """Everything a generation needs besides its requests; ``sampling``, ``max_new_tokens`` and
    ``eos_token_ids`` are the settings of requests made from bare prompts (``decode_steps``)."""

    backend: Backend
    target: TargetModel
    drafter: Drafter
    tree_builder: TreeBuilder
    verifier: Verifier
    sampling: SamplingConfig = attrs.field(factory=SamplingConfig)
    max_new_tokens: int = 128
    eos_token_ids: tuple[int, ...] = ()
    sources: dict[str, str] = attrs.field(factory=dict)  # "drafter" -> "drafter 'x' (plugin p, dist 1.0)"

    def source(self, kind: str) -> str:
        """Who made the ``kind`` component, for errors about what it returned."""
        return self.sources.get(kind) or f"{kind.replace('_', ' ')} {type(getattr(self, kind)).__name__}"

    def requests(self, prompts: Sequence[Sequence[int]], seed=None) -> list[Request]:
        """One Request per prompt with the plan's settings (seeds as ``specdec.requests.batch_seeds``)."""
        seeds = batch_seeds(seed, len(prompts)) if not self.sampling.greedy else [None] * len(prompts)
        return [Request(prompt=p, sampling=self.sampling, seed=s, max_new_tokens=self.max_new_tokens,
                        stop_token_ids=self.eos_token_ids) for p, s in zip(prompts, seeds)]


def verify_uniform_shape(draft: Draft) -> tuple[int, int]:
    """(D+1, W+1) of the verifier's uniforms for this draft (see ``specdec.protocols.Verifier``)."""
    if draft.beams is not None:
        return int(draft.beams.shape[2]), int(draft.beams.shape[1]) + 1
    return int(draft.head_tokens.shape[1]) + 1, 1


def distinct_beams(beams: np.ndarray) -> np.ndarray:
    """(B,) the number of different beams in each row of ``beams`` (B, W, L); a drafter that
    repeats a beam (a lookup beam without a match) drafted it once."""
    same = (beams[:, :, None, :] == beams[:, None, :, :]).all(axis=-1)  # (B, W, W): beam i equals beam j
    repeats = np.tril(same, k=-1).any(axis=-1)  # (B, W): beam i equals an earlier beam
    return (beams.shape[1] - repeats.sum(axis=-1)).astype(np.int64)


def _draw(states: list[RequestState], shape: tuple[int, ...]) -> np.ndarray | None:
    draws = [state.draw(shape) for state in states]
    return None if draws[0] is None else np.stack(draws)


class Decoder:
    """Decodes requests over the target's slots; ``submit`` and ``cancel`` between ``step`` calls."""

    def __init__(self, plan: DecodePlan):
        self.plan = plan
        self.caps = drafter_caps(plan.drafter, plan.source("drafter"))
        self.needs_draft_probs = verifier_caps(plan.verifier, plan.source("verifier")).needs_draft_probs
        self.layers = self.caps.hidden_layers if self.caps.stateful else ()
        self.waiting: deque[tuple[int, Request]] = deque()
        self.active: dict[int, tuple[int, RequestState]] = {}  # slot -> (request id, state)
        self._free = list(range(int(plan.target.num_slots)))
        self._ids = itertools.count()
        self._hidden = None  # (num_slots, H) backend array: each slot's hidden state at its root
        self._committing = False
        self.steps = 0

    @property
    def idle(self) -> bool:
        return not self.waiting and not self.active

    def submit(self, request: Request) -> int:
        """Queue ``request``; returns its id (0, 1, ... in submission order)."""
        longest = len(request.prompt) + request.max_new_tokens
        if longest > self.plan.target.capacity:
            raise InvalidInputError(
                f"a prompt of {len(request.prompt)} tokens plus max_new_tokens={request.max_new_tokens} needs "
                f"{longest} positions; the target's slots hold {self.plan.target.capacity} (load it with a "
                "larger capacity, or ask for fewer tokens)")
        request_id = next(self._ids)
        self.waiting.append((request_id, request))
        return request_id

    def cancel(self, request_id: int) -> bool:
        """Drop a waiting or active request (its slot is freed now); False when it is not here."""
        for item in self.waiting:
            if item[0] == request_id:
                self.waiting.remove(item)
                return True
        for slot, (rid, _) in list(self.active.items()):
            if rid == request_id:
                self._finish(slot)
                return True
        return False

    def close(self) -> None:
        """Cancel everything: free every slot."""
        self.waiting.clear()
        for slot in list(self.active):
            self._finish(slot)

    def _finish(self, slot: int) -> None:
        self.active.pop(slot)
        if self.caps.stateful:
            self.plan.drafter.end(slot)
        self.plan.target.release(slot)
        heapq.heappush(self._free, slot)

    def step(self, *, max_prefill_tokens: int | None = None, failures: list | None = None,
             on_admit=None) -> list[StepResult]:
        """Admit what fits, then one decode step of every active request; the results of both
        (each with ``requests``, the request id of each row).

        max_prefill_tokens: admit waiting requests, in order, only while their prompts total at
        most this many tokens (the first always: a longer prompt is admitted alone, in one
        forward); None admits every request that finds a free slot.
        failures: None raises what admitting or decoding raises. A list keeps the other requests
        going: a request whose admission raises, or whose rows' forward raises, is dropped (its
        slot freed) and ``(request id, exception)`` appended. A group of rows whose step raises
        before its commit is run again one row at a time from the same state and random numbers
        (not with stateful drafters), so the error stays with the requests that raise it.
        on_admit: called with the admissions' StepResult before the decode step runs (their first
        tokens need not wait for it).
        """
        results = []
        if self.waiting and self._free:
            results.append(self._admit(max_prefill_tokens, failures))
            if on_admit is not None:
                on_admit(results[-1])
        if self.active:
            self.steps += 1
            results.append(self._decode(failures))
        return results

    def _drop(self, request_id: int, error: Exception, failures: list) -> None:
        """Record ``error`` for ``request_id`` and free its slot if it holds one."""
        failures.append((request_id, error))
        slot = next((s for s, (rid, _) in self.active.items() if rid == request_id), None)
        if slot is None:
            return
        self.active.pop(slot)
        for release in ((self.plan.drafter.end,) if self.caps.stateful else ()) + (self.plan.target.release,):
            try:
                release(slot)
            except Exception:  # noqa: BLE001 - the request failed already; its error is the one reported
                pass
        heapq.heappush(self._free, slot)

    def _admit(self, max_prefill_tokens: int | None = None, failures: list | None = None) -> StepResult:
        start = time.perf_counter()
        ids, tokens, prefilled = [], [], 0
        while self.waiting and self._free:
            request_id, request = self.waiting[0]
            if max_prefill_tokens is not None and prefilled and prefilled + len(request.prompt) > max_prefill_tokens:
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
        zeros = np.zeros(len(ids), dtype=np.int64)
        return StepResult(step=self.steps, requests=tuple(ids), new_tokens=tokens, num_accepted=zeros,
                          num_drafted=zeros, num_verified=zeros + 1, time_prefill=time.perf_counter() - start,
                          prefilled=np.ones(len(ids), dtype=bool))

    def _admit_one(self, request_id: int, request: Request) -> list[int]:
        """Prefill ``request`` into a free slot; its first token (none kept if it ends there)."""
        plan, backend, target = self.plan, self.plan.backend, self.plan.target
        slot = heapq.heappop(self._free)
        state = RequestState(request, slot)
        try:
            output = target.admit(slot, request.prompt, layers=self.layers)
        except Exception:
            heapq.heappush(self._free, slot)
            raise
        self.active[slot] = (request_id, state)
        logits = backend.to_numpy(output.logits)[None]  # (1, V)
        first = (np.argmax(logits, axis=-1) if state.generator is None else
                 sample_from(target_probs(logits, request.sampling), np.array([state.draw(())])))
        last = backend.from_numpy(np.array([len(request.prompt) - 1]), target)
        if self._hidden is None:
            self._hidden = output.hidden[backend.from_numpy(np.zeros(target.num_slots, dtype=np.int64), target)]
        self._hidden[backend.from_numpy(np.array([slot]), target)] = output.hidden[last]
        if self.caps.stateful:
            plan.drafter.begin(slot, np.asarray(request.prompt, dtype=np.int64), output)
        kept = state.emit([int(first[0])])
        if state.done:
            self._finish(slot)
        return kept

    def _decode(self, failures: list | None = None) -> StepResult:
        groups: dict[SamplingConfig, list[int]] = {}
        for slot in sorted(self.active):
            groups.setdefault(self.active[slot][1].request.sampling, []).append(slot)
        parts = []
        for sampling, slots in groups.items():
            if failures is None:
                parts.append(self._decode_group(sampling, np.array(slots, dtype=np.int64)))
            else:
                parts.extend(self._decode_isolated(sampling, slots, failures))
        if not parts:
            parts = [_empty_step(self.steps)]
        join = lambda name: np.concatenate([getattr(p, name) for p in parts])  # noqa: E731
        return StepResult(
            step=self.steps, requests=tuple(r for p in parts for r in p.requests),
            new_tokens=[t for p in parts for t in p.new_tokens], num_accepted=join("num_accepted"),
            num_drafted=join("num_drafted"), num_verified=join("num_verified"),
            time_draft=sum(p.time_draft for p in parts), time_verify=sum(p.time_verify for p in parts),
            time_other=sum(p.time_other for p in parts),
        )

    def _decode_isolated(self, sampling: SamplingConfig, slots: list[int], failures: list) -> list[StepResult]:
        """``_decode_group`` that drops the requests it fails for (see ``step``)."""
        states = [self.active[s][1] for s in slots]
        saved = [None if s.generator is None else s.generator.bit_generator.state for s in states]
        self._committing = False
        try:
            return [self._decode_group(sampling, np.array(slots, dtype=np.int64))]
        except Exception as error:
            if len(slots) == 1 or self._committing or self.caps.stateful:
                for slot in slots:
                    if slot in self.active:
                        self._drop(self.active[slot][0], error, failures)
                return []
        parts = []
        for slot, state, generator_state in zip(slots, states, saved):
            if generator_state is not None:
                state.generator.bit_generator.state = generator_state
            parts.extend(self._decode_isolated(sampling, [slot], failures))
        return parts

    def _check(self, draft: Draft, tree, cause: Exception | None = None):
        """Host copies (beams or None, tree tokens, parents, num_nodes), after checking them."""
        plan, host, vocab = self.plan, self.plan.backend.to_numpy, int(self.plan.target.vocab_size)
        beams = None if draft.beams is None else host(draft.beams)
        tree_arrays = host(tree.tokens), host(tree.parents), host(tree.num_nodes)
        try:
            step_checks.check_draft(plan.source("drafter"), host(draft.root_tokens), beams,
                                    None if draft.head_tokens is None else host(draft.head_tokens), vocab)
            step_checks.check_tree(plan.source("tree_builder"), *tree_arrays, vocab)
        except PluginOutputError as error:
            raise error from cause
        return (beams, *tree_arrays)

    def _decode_group(self, sampling: SamplingConfig, slots: np.ndarray) -> StepResult:
        plan, backend, target = self.plan, self.plan.backend, self.plan.target
        on_target = lambda array: backend.from_numpy(array, target)  # noqa: E731
        ids = [self.active[s][0] for s in slots]
        states = [self.active[s][1] for s in slots]
        where = on_target(slots)
        t0 = time.perf_counter()
        sample_shape = self.caps.sample_shape
        context = DraftContext(
            root_tokens=on_target(np.array([s.root for s in states], dtype=np.int64)), hidden=self._hidden[where],
            sampling=sampling, num_generated=np.array([s.emitted for s in states], dtype=np.int64),
            uniforms=_draw(states, sample_shape) if sample_shape else None, want_draft_probs=self.needs_draft_probs,
            history=tuple(s.history for s in states), slots=slots,
        )
        draft = plan.drafter.propose(context)
        tree = plan.tree_builder.build(draft)
        t1 = time.perf_counter()
        try:
            output = target.forward_tree(tree, slots, layers=self.layers)
        except Exception as exc:  # a bad draft or tree fails here first: name the plugin that made it
            self._check(draft, tree, cause=exc)
            raise
        uniforms = _draw(states, verify_uniform_shape(draft))
        verdict = plan.verifier.verify(tree, draft, output, sampling, None if uniforms is None else on_target(uniforms))
        path = backend.to_numpy(verdict.path)  # the step's one wait for the device
        num_accepted, bonus = backend.to_numpy(verdict.num_accepted), backend.to_numpy(verdict.bonus_tokens)
        beams, tokens, parents, num_nodes = self._check(draft, tree)
        step_checks.check_verdict(plan.source("verifier"), path, num_accepted, bonus, parents, num_nodes,
                                  int(target.vocab_size))
        t2 = time.perf_counter()
        self._committing = True  # from here on a failed group cannot be run again (_decode_isolated)
        target.commit(tree, verdict)
        # tokens of the distinct beams, before deduplication into the tree
        drafted = distinct_beams(beams) * (beams.shape[2] - 1) if beams is not None else num_nodes - 1
        rows = np.arange(len(slots))
        self._hidden[where] = output.hidden[on_target(rows), on_target(path[rows, num_accepted])]
        new_tokens = [state.emit([int(t) for t in tokens[b, path[b, 1 : num_accepted[b] + 1]]] + [int(bonus[b])])
                      for b, state in enumerate(states)]
        if self.caps.stateful:
            self._observe(slots, states, output, path, num_accepted, bonus, tokens)
        for state in states:
            if state.done:
                self._finish(state.slot)
        return StepResult(
            step=self.steps, requests=tuple(ids), new_tokens=new_tokens, num_accepted=num_accepted,
            num_drafted=np.asarray(drafted, dtype=np.int64), num_verified=num_nodes.astype(np.int64),
            time_draft=t1 - t0, time_verify=t2 - t1, time_other=time.perf_counter() - t2,
        )

    def _observe(self, slots, states, output, path, num_accepted, bonus, tokens) -> None:
        """Tell a stateful drafter what this step committed: tokens and hidden states on the path."""
        backend, target = self.plan.backend, self.plan.target
        rows = np.arange(len(slots))[:, None]
        nodes = np.where(path >= 0, path, 0)  # (B, A)
        index = backend.from_numpy(rows, target), backend.from_numpy(nodes, target)
        self.plan.drafter.observe(Accepted(
            slots=slots, tokens=np.where(path >= 0, tokens[rows, nodes], -1), num_accepted=num_accepted,
            bonus_tokens=bonus, hidden=output.hidden[index],
            layers={i: value[index] for i, value in output.layers.items()},
            finished=np.array([s.done for s in states]),
        ))


def decode_steps(plan: DecodePlan, prompts: Sequence[Sequence[int]], *, seed=None) -> Iterator[StepResult]:
    """Yield one StepResult per target forward (admissions and decode steps) until every prompt
    is done; row b of every result is prompt b (finished or waiting rows: no tokens, zero counts).

    The target is leased for the whole generation (``specdec.lease``): a second generation on
    it while this one runs raises TargetBusyError at its first step, before touching the cache.
    """
    lease.acquire(plan.target)
    decoder = None
    try:
        decoder = Decoder(plan)
        for request in plan.requests(prompts, seed):
            decoder.submit(request)
        while not decoder.idle:
            for result in decoder.step():
                yield full_batch(result, len(prompts))
    finally:
        if decoder is not None:
            decoder.close()
        lease.release(plan.target)


def _empty_step(step: int) -> StepResult:
    """A decode step whose every row failed (``Decoder.step`` with ``failures``)."""
    zeros = np.zeros(0, dtype=np.int64)
    return StepResult(step=step, requests=(), new_tokens=[], num_accepted=zeros, num_drafted=zeros,
                      num_verified=zeros)


def full_batch(result: StepResult, batch_size: int) -> StepResult:
    """``result`` with one row per request 0 .. batch_size - 1."""
    rows = np.asarray(result.requests, dtype=np.int64)
    tokens: list[list[int]] = [[] for _ in range(batch_size)]
    for row, new in zip(rows, result.new_tokens):
        tokens[row] = new

    def spread(values, dtype=np.int64):
        out = np.zeros(batch_size, dtype=dtype)
        out[rows] = values
        return out

    return attrs.evolve(
        result, requests=tuple(range(batch_size)), new_tokens=tokens, num_accepted=spread(result.num_accepted),
        num_drafted=spread(result.num_drafted), num_verified=spread(result.num_verified),
        prefilled=None if result.prefilled is None else spread(result.prefilled, bool),
    )
