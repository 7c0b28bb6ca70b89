"""Choosing between two exact formulations of one operation by timing them on the first call.

The CPU kernels that torch dispatches to differ by CPU, library, dtype and shape, so which of two
equal formulations is faster is measured here, never assumed (``specdec_torch.products`` for
LM-head products, ``specdec_torch.layers.attend`` for grouped-query attention).
"""

from __future__ import annotations

import time
from typing import Any, Callable

import numpy as np
import torch

__all__ = ["second_is_faster"]

ROUNDS = 5
MARGIN = 0.9  # the second formulation must take under 90% of the first's time to be chosen


def second_is_faster(first: Callable[[], Any], second: Callable[[], Any], *, rounds: int = ROUNDS,
                     margin: float = MARGIN) -> bool:
    """Whether ``second()`` beats ``first()`` by the margin: both warmed up once, then timed in
    ``rounds`` interleaved rounds, medians compared. CPU only (a GPU timing would need a sync)."""
    times: dict[bool, list[float]] = {False: [], True: []}
    with torch.inference_mode():
        first(), second()
        for _ in range(rounds):
            for which, run in ((False, first), (True, second)):
                start = time.perf_counter()
                run()
                times[which].append(time.perf_counter() - start)
    return float(np.median(times[True])) < margin * float(np.median(times[False]))
