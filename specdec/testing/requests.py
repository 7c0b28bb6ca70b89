"""Decoding schedules of requests for tests: requests arriving and being cancelled at chosen steps
of one ``specdec.decode.loop.Decoder``, so that each can be compared with decoding it alone."""

from __future__ import annotations

from typing import Any, Sequence

from specdec.decode.loop import Decoder
from specdec.decode.plan import DecodePlan
from specdec.decode.requests import Request
from specdec.generation.components import decode_plan


def decoding_plan(target, drafter: Any, backend: str = "numpy", **options) -> DecodePlan:
    """A plan over ``target`` whose verifier (``exact``, greedy at temperature 0) serves greedy and
    sampled requests alike; ``options`` go to ``specdec.generate``'s options
    (drafter options...)."""
    return decode_plan(target, drafter, backend, **{"verifier": "exact", **options})


def run_schedule(
    plan: DecodePlan,
    schedule: Sequence[tuple[int, Request, int | None]],
    *,
    max_steps: int = 500,
    max_prefill_tokens: int | None = None,
    failures: list | None = None,
) -> dict[int, list[int]]:
    """Decode ``schedule``, a list of (arrival step, Request, cancel step or None): each request is
    submitted at its arrival step and cancelled at its cancel step (if it arrived by then), with
    ``max_prefill_tokens`` prompt tokens per step (``Decoder.step``). Returns
    the tokens of every request that was not cancelled, by its index in the schedule. The decoder
    is closed at the end, every slot freed. ``failures``: None raises what a step raises; a list
    gets ``(schedule index, exception)`` of each request the decoder dropped (``Decoder.step``),
    which is then left out of the result like a cancelled one."""
    decoder = Decoder(plan)
    ids, tokens, step, failed = {}, {}, 0, []
    try:
        while step == 0 or not decoder.idle or any(arrival >= step for arrival, _, _ in schedule):
            for index, (arrival, request, _) in enumerate(schedule):
                if arrival == step:
                    ids[decoder.submit(request)] = index
            for index, (_, _, cancel) in enumerate(schedule):
                if cancel == step and index in ids.values():
                    decoder.cancel(next(r for r, i in ids.items() if i == index))
                    tokens[index] = None
            for result in decoder.step(
                max_prefill_tokens=max_prefill_tokens, failures=None if failures is None else failed
            ):
                for request_id, new in zip(result.requests, result.new_tokens, strict=True):
                    if tokens.get(ids[request_id], []) is not None:
                        tokens.setdefault(ids[request_id], []).extend(new)
            for request_id, error in failed:
                failures.append((ids[request_id], error))
                tokens[ids[request_id]] = None
            failed.clear()
            step += 1
            assert step < max_steps, (
                f"the decoder did not finish {len(schedule)} requests in {max_steps} steps"
            )
    finally:
        decoder.close()
    return {index: t for index, t in tokens.items() if t is not None}
