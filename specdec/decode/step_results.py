"""The records of a decode step (``StepResult``) as the decoder makes and joins them: a step with no
rows (``empty_step``), the rows of several groups' steps in one (``join_steps``), one row per
request of a batch (``full_batch``), the first tokens of prompts prefilled (``admissions``,
``join_admissions``), and how many of a row's accepted tokens its output kept
(``accepted_kept``)."""

from __future__ import annotations

from typing import Sequence

import attrs
import numpy as np

from specdec.types import StepResult

__all__ = [
    "accepted_kept",
    "admissions",
    "empty_step",
    "full_batch",
    "join_admissions",
    "join_steps",
]


def accepted_kept(accepted: int, kept: int) -> int:
    """Of a row's ``accepted`` drafted tokens (``StepResult.num_accepted``), those its output
    kept when the step emitted ``kept`` tokens: all but the step's own one, fewer where the
    request's end (a stop token, its length) cut the step short. So a request's new tokens are
    1 + its decode steps + its accepted tokens, in ``GenerationStats`` as in ``Completion``."""
    return max(0, min(int(accepted), int(kept) - 1))


def empty_step(step: int) -> StepResult:
    """A decode step whose every row failed (``Decoder.step`` with ``failures``)."""
    zeros = np.zeros(0, dtype=np.int64)
    return StepResult(
        step=step,
        requests=(),
        new_tokens=[],
        num_accepted=zeros,
        num_drafted=zeros,
        num_verified=zeros,
    )


def join_steps(step: int, parts: Sequence[StepResult]) -> StepResult:
    """One StepResult of the rows of ``parts`` (decode steps of the same step) in order, their
    plain steps' reasons too (a step of two groups, one drafting and one plain, once dropped them:
    a request's reasons then summed short of its plain steps)."""
    if not parts:
        return empty_step(step)
    if len(parts) == 1:
        return parts[0]
    join = lambda name: np.concatenate([getattr(p, name) for p in parts])  # noqa: E731
    return StepResult(
        step=step,
        requests=tuple(r for p in parts for r in p.requests),
        new_tokens=[t for p in parts for t in p.new_tokens],
        num_accepted=join("num_accepted"),
        num_drafted=join("num_drafted"),
        num_verified=join("num_verified"),
        time_draft=sum(p.time_draft for p in parts),
        time_verify=sum(p.time_verify for p in parts),
        time_other=sum(p.time_other for p in parts),
        plain_reasons=tuple(
            why for p in parts for why in (p.plain_reasons or (None,) * len(p.requests))
        ),
    )


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
        result,
        requests=tuple(range(batch_size)),
        new_tokens=tokens,
        num_accepted=spread(result.num_accepted),
        num_drafted=spread(result.num_drafted),
        num_verified=spread(result.num_verified),
        prefilled=None if result.prefilled is None else spread(result.prefilled, bool),
    )


def admissions(step: int, ids: list[int], tokens: list[list[int]], seconds: float) -> StepResult:
    """The StepResult of requests whose prompts were prefilled: their first tokens."""
    zeros = np.zeros(len(ids), dtype=np.int64)
    return StepResult(
        step=step,
        requests=tuple(ids),
        new_tokens=tokens,
        num_accepted=zeros,
        num_drafted=zeros,
        num_verified=zeros + 1,
        time_prefill=seconds,
        prefilled=np.ones(len(ids), dtype=bool),
    )


def join_admissions(parts: list[StepResult]) -> StepResult:
    return admissions(
        parts[0].step,
        [r for p in parts for r in p.requests],
        [t for p in parts for t in p.new_tokens],
        sum(p.time_prefill for p in parts),
    )
