"""Choosing between exact formulations of one operation by timing them on the first call.

The CPU kernels that torch dispatches to differ by CPU, library, dtype and shape, so which of
several equal formulations is fastest is measured here, never assumed (``specdec_torch.products``
for LM-head products, ``specdec_torch.layers.attend`` for grouped-query attention).
"""

from __future__ import annotations

import time
from typing import Any, Callable

import torch

__all__ = ["fastest", "second_is_faster"]

ROUNDS = 5
MARGIN = 0.9  # the second formulation must take under 90% of the first's time to be chosen


def fastest(
    candidates: dict[str, Callable[[], Any]], *, rounds: int = ROUNDS, margin: float = MARGIN
) -> str:
    """The name of the fastest of ``candidates`` (name -> formulation; the first is the default):
    each warmed up once, then timed in ``rounds`` interleaved rounds, and judged by its fastest
    round (other work only ever slows a round, so the fastest says what a formulation costs where
    a median of rounds half of which ran beside other work does not; ``specdec_torch.forms`` judges
    the same way). Another than the first is chosen only when its fastest round is under
    ``margin`` times the first's, and it is the fastest such one. CPU only (a GPU timing would need
    a sync)."""
    names = list(candidates)
    times: dict[str, list[float]] = {name: [] for name in names}
    with torch.inference_mode():
        for run in candidates.values():
            run()
        for round_ in range(rounds):
            for name in names if round_ % 2 == 0 else names[::-1]:
                start = time.perf_counter()
                candidates[name]()
                times[name].append(time.perf_counter() - start)
    best_round = {name: min(t) for name, t in times.items()}
    default = names[0]
    best = min(names[1:], key=best_round.__getitem__, default=default)
    return best if best_round[best] < margin * best_round[default] else default


def second_is_faster(
    first: Callable[[], Any],
    second: Callable[[], Any],
    *,
    rounds: int = ROUNDS,
    margin: float = MARGIN,
) -> bool:
    """Whether ``second()`` beats ``first()`` by the margin (``fastest`` of the two)."""
    return fastest({"first": first, "second": second}, rounds=rounds, margin=margin) == "second"
