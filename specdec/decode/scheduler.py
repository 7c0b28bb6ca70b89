"""``Scheduler``: what one decode step runs, chosen from the ``SlotTable`` and the speculation
policy (``specdec.decode.budget``), handed to the decoder as a frozen ``StepWork``.

A step carries prompt tokens within a budget (prompts that finish within it first, then chunks
of longer ones, ``specdec.decode.prefill``; a waiting request takes a free slot with its first
chunk) and one draft tree per group of decoding requests that share sampling settings and
whether they draft this step; each request's tree is cut to the budget the policy gives it.
Changing admission (priorities, preemption) means changing this file.
"""

from __future__ import annotations

import itertools

import attrs
import numpy as np

from specdec.decode.budget import Speculation
from specdec.decode.prefill import choose_chunks
from specdec.decode.slot_table import SlotTable
from specdec.errors import InvalidInputError

__all__ = ["Scheduler", "StepWork", "check_prefill_setting"]


@attrs.frozen
class StepWork:
    """One step's work: ``chunks`` (slot, start, end) of prompts going in; ``groups``
    ((sampling, drafts), slots) of decoding requests; ``budgets``: request id -> tree nodes
    (``specdec.decode.budget.StepBudgets.budgets``; 0 does not draft)."""

    chunks: tuple = ()
    groups: tuple = ()
    budgets: dict = attrs.field(factory=dict)

    @property
    def empty(self) -> bool:
        return not self.chunks and not self.groups


def check_prefill_setting(max_prefill_tokens) -> None:
    if max_prefill_tokens not in ("auto", None) and max_prefill_tokens < 1:
        raise InvalidInputError(
            f"max_prefill_tokens must be >= 1, None or 'auto', got {max_prefill_tokens}"
        )


class Scheduler:
    """Chooses each step's work over ``table`` with the ``speculation`` policy;
    ``prefill_budget``: the prompt tokens the last step with prompts to put in could carry.
    ``step_kind``: the drafter's ``step_kind(history) -> int`` (``specdec.protocols.StepKinds``),
    which sorts each request's step before it drafts, or None."""

    def __init__(self, table: SlotTable, speculation: Speculation, step_kind=None):
        self.table, self.speculation, self.step_kind = table, speculation, step_kind
        self.prefill_budget: int | None = None

    def prompt_budget(self, max_prefill_tokens) -> int | None:
        """Prompt tokens this step may carry (None: no bound), from the setting (an int, None or
        "auto": what keeps the decoding requests' step within its limit)."""
        table = self.table
        decoding = [table.active[slot][0] for slot in table.decoding()]
        self.prefill_budget = self.speculation.prefill_tokens(
            decoding, max_prefill_tokens, queued=table.queued_prompts()
        )
        return self.prefill_budget

    def chunks(self, budget: int | None) -> tuple:
        """This step's prompt chunks while ``budget`` lasts; a waiting request that gets its first
        chunk is seated."""
        table = self.table
        cursor = list(table.cursor.items())
        waiting = list(itertools.islice(table.waiting, len(table.free)))
        chunks = []
        for kind, index, take in choose_chunks(
            [len(table.active[s][1].request.prompt) - start for s, start in cursor],
            [len(request.prompt) for _, request in waiting],
            float("inf") if budget is None else budget,
        ):
            if kind == "prefilling":
                slot, start = cursor[index]
            else:
                (request_id, request), start = waiting[index], 0
                table.waiting.remove(waiting[index])
                slot = table.seat(request_id, request, prefilling=True).slot
            chunks.append((slot, start, start + take))
        return tuple(chunks)

    def whole_prompts(self, budget: int | None):
        """Waiting requests to admit whole (a drafter whose ``begin`` needs every prompt
        position), out of the queue: the first always, then while ``budget`` lasts."""
        table, taken, tokens = self.table, [], 0
        while table.waiting and len(taken) < len(table.free):
            request = table.waiting[0][1]
            if budget is not None and taken and tokens + len(request.prompt) > budget:
                break
            taken.append(table.waiting.popleft())
            tokens += len(request.prompt)
        return taken

    def work(self, chunks: tuple = ()) -> StepWork:
        """The step's work: ``chunks`` and the decoding requests grouped, with their budgets."""
        table = self.table
        decoding = table.decoding()
        ids, chunk_tokens = [table.active[s][0] for s in decoding], sum(e - s for _, s, e in chunks)
        if self.step_kind is None:  # (a policy's own step_budgets may not take kinds)
            budgets = self.speculation.step_budgets(ids, chunk_tokens).budgets
        else:
            kinds = {table.active[s][0]: self._kind(table.active[s][1]) for s in decoding}
            budgets = self.speculation.step_budgets(ids, chunk_tokens, kinds=kinds).budgets
        groups: dict = {}  # (sampling, drafts) -> slots
        for slot in decoding:
            request_id, state = table.active[slot]
            key = (state.request.sampling, budgets[request_id] != 0)
            groups.setdefault(key, []).append(slot)
        return StepWork(chunks=chunks, groups=tuple(groups.items()), budgets=budgets)

    def _kind(self, state) -> int:
        """The drafter's kind of ``state``'s coming step: a small non-negative integer."""
        kind = self.step_kind(state.history)
        if isinstance(kind, bool) or not isinstance(kind, (int, np.integer)) or kind < 0:
            owner = getattr(self.step_kind, "__self__", self.step_kind)
            raise InvalidInputError(
                f"{type(owner).__name__}.step_kind must return a non-negative integer (the kind "
                f"of a request's coming step), got {kind!r}"
            )
        return int(kind)
