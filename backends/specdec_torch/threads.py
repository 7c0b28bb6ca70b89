"""Torch's CPU threads fitted to the cores that other work leaves free.

PyTorch computes on as many OpenMP threads as the machine has cores. Where another process keeps
a core busy, every parallel region (thousands per forward) waits for the worker that the kernel
has set aside for that process: on a 2-core machine with one core busy elsewhere, SmolLM2-135M
decoded plainly at 1.1 tokens/s on two threads and at 19-20 on one, 18x apart, and nothing
said why. So before the torch backend first computes, unless ``OMP_NUM_THREADS`` chose the
count, ``fit_threads`` measures how many cores other processes keep busy
(``specdec.tuning.machine.steady_busy_cores``, a fraction of a second, twice where the first
probe finds a core busy, so that a passing burst does not count) and, where fewer are free than
torch would use, gives torch the free ones (at least one) and says so in one line on stderr.
A count the user chose is kept, but where other work leaves fewer cores free than it asks, one
line says what that costs (a user pinned 2 threads beside a busy core: every call 4x slower, and
nothing said why). The count is part of the device description, so measured speeds are cached per
count.
"""

from __future__ import annotations

import os
import sys

import torch

from specdec.tuning.machine import cores, free_cores, steady_busy_cores

__all__ = ["VARIABLE", "fit_threads"]

VARIABLE = "OMP_NUM_THREADS"  # a count the user chose: left as it is
_fitted = False


def fit_threads(measure=steady_busy_cores) -> int | None:
    """Once per process: torch's thread count lowered to the free cores when other processes
    keep some busy (module docstring). Returns the new count, or None where it was left."""
    global _fitted
    if _fitted:
        return None
    _fitted = True
    threads, chosen = torch.get_num_threads(), os.environ.get(VARIABLE, "").strip()
    if chosen and threads <= 1:
        return None  # one thread waits on no other: nothing to warn of
    busy = measure()
    if busy is None:
        return None
    free = free_cores(busy, cores())
    if free >= threads:
        return None
    if chosen:
        print(
            f"specdec: {busy:.1f} of {cores()} cores busy elsewhere, and {VARIABLE}={chosen} "
            f"asks for {threads} threads: each waits on the busy cores (several times slower; "
            f"{VARIABLE}={free} or unset fits them)",
            file=sys.stderr,
            flush=True,
        )
        return None
    torch.set_num_threads(free)
    print(
        f"specdec: {busy:.1f} of {cores()} cores busy elsewhere: torch on {free} "
        f"thread{'s' if free > 1 else ''}, not {threads} ({VARIABLE}=N to choose)",
        file=sys.stderr,
        flush=True,
    )
    return free
