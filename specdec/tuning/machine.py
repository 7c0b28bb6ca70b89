"""What the machine is, and how much of it a measurement had.

``cpu_flags`` and ``cpu_description`` name the CPU (its model and a digest of its instruction-set
flags: two machines with one name but other instruction sets, AVX-512 BF16 or only AVX2, are told
apart), for the keys under which speed measurements are cached and for the backends' device
descriptions. ``machine_share`` and ``CpuClock`` say what share of the cores a timed block computed
on: a measurement below ``QUIET_SHARE`` shared the cores with other work, and every measured
choice (the dtype, the cost curve, the planner, the benchmarks) treats it as such.
"""

from __future__ import annotations

import functools
import hashlib
import os
import platform
import time
from pathlib import Path

__all__ = ["QUIET_SHARE", "CpuClock", "cpu_description", "cpu_flags", "machine_share"]

# a measurement whose process got less of the cores' time than this shared them with other work
QUIET_SHARE = 0.85


@functools.lru_cache(maxsize=1)
def _cpuinfo() -> tuple[str, frozenset]:
    """(model name, instruction-set flags) of the CPU, from /proc/cpuinfo where there is one."""
    model, flags = "", frozenset()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            key = key.strip()
            if key in ("model name", "Model", "cpu model") and not model:
                model = value.strip()
            elif key in ("flags", "Features") and not flags:
                flags = frozenset(value.split())
    except OSError:
        pass
    return model or platform.processor() or platform.machine(), flags


def cpu_flags() -> frozenset:
    """The CPU's instruction-set flags (empty where the system does not list them)."""
    return _cpuinfo()[1]


def cpu_description() -> str:
    """The CPU's model name and a digest of its flags: two machines with the same name but other
    instruction sets (AVX-512 BF16 or only AVX2) are told apart."""
    model, flags = _cpuinfo()
    digest = (
        hashlib.sha256(" ".join(sorted(flags)).encode()).hexdigest()[:12] if flags else "no flags"
    )
    return f"{model} [flags {digest}]"


def machine_share(wall: float, cpu: float) -> float:
    """The share of this machine's cores the process computed on over ``wall`` seconds in which it
    used ``cpu`` seconds of CPU time: about 1 where a measurement had the cores to itself (0.99
    for SmolLM2-135M's forwards on 2 cores), 0.63 beside one busy process, 0.50 beside two. A
    measurement below ``QUIET_SHARE`` shared the cores with other work: its timings have the
    wrong proportions, not only the wrong scale. (A device whose work is not CPU time, a GPU,
    reads as busy.)"""
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cores = os.cpu_count() or 1
    return cpu / max(wall * cores, 1e-9)


class CpuClock:
    """The wall and CPU seconds of the process inside ``with clock:`` blocks, and the share of
    the machine's cores they amount to (``machine_share``)."""

    def __init__(self):
        self.wall = self.cpu = 0.0

    def __enter__(self) -> "CpuClock":
        self._start = (time.perf_counter(), time.process_time())
        return self

    def __exit__(self, *exc) -> None:
        wall, cpu = self._start
        self.wall += time.perf_counter() - wall
        self.cpu += time.process_time() - cpu

    @property
    def share(self) -> float:
        return machine_share(self.wall, self.cpu)
