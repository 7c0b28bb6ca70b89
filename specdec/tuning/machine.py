"""What the machine is, and how much of it a measurement had.

``cpu_flags`` and ``cpu_description`` name the CPU (its model and a digest of its instruction-set
flags: two machines with one name but other instruction sets, AVX-512 BF16 or only AVX2, are told
apart), for the keys under which speed measurements are cached and for the backends' device
descriptions. ``machine_share`` and ``CpuClock`` say what share of the cores a timed block computed
on: a measurement below ``QUIET_SHARE`` shared the cores with other work, and every measured
choice (the dtype, the cost curve, the planner, the benchmarks) treats it as such.
``machine_busy_seconds`` reads what the whole machine computed (Linux); ``Measured``, a
``CpuClock`` that reads it too, says what share of the cores other work took meanwhile, and
``busy_cores`` how many cores other work keeps busy now: what a backend's thread count should
leave alone.
"""

from __future__ import annotations

import functools
import hashlib
import os
import platform
import time
from pathlib import Path

__all__ = [
    "QUIET_SHARE",
    "CpuClock",
    "Measured",
    "busy_cores",
    "steady_busy_cores",
    "cores",
    "cpu_description",
    "cpu_flags",
    "machine_busy_seconds",
    "free_cores",
    "free_share",
    "machine_share",
    "others_share",
]

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


def cpu_class(flags: frozenset | None = None) -> str:
    """The CPU's instruction sets as the docs' figures name their machines ("AVX-512 BF16 and
    AMX", "AVX2 only"), "" where the system lists no flags (``flags``: these, not this CPU's)."""
    flags = cpu_flags() if flags is None else flags
    if not flags:
        return ""
    if "avx512_bf16" in flags:
        return "AVX-512 BF16 and AMX" if "amx_bf16" in flags else "AVX-512 BF16, no AMX"
    if "avx512f" in flags:
        return "AVX-512 without BF16"
    return "AVX2 only" if "avx2" in flags else "no AVX2"


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
    return cpu / max(wall * cores(), 1e-9)


def free_share(wall: float, cpu: float, machine: float | None) -> float:
    """The share of the machine's cores that other work left to a block of ``wall`` seconds in
    which this process used ``cpu`` seconds of CPU time and the whole machine ``machine`` (every
    process's, ``machine_busy_seconds``): 1 less the share the other processes computed on.
    Where the system does not say (``machine`` None), the block's own share (``machine_share``).

    A measurement is judged by this, not by its own share: a block that runs one thread (a small
    model's forwards are Python more than arithmetic) computes on half of two cores of an idle
    machine, and by its own share read as taken beside other work at every start."""
    others = others_share(wall, cpu, machine)
    return machine_share(wall, cpu) if others is None else 1.0 - others


def others_share(wall: float, cpu: float, machine: float | None) -> float | None:
    """The share of the cores the other processes computed on over a block (``free_share``'s
    arguments); None where the system does not say or the block took no time."""
    if machine is None or wall <= 0:
        return None
    return max(machine - cpu, 0.0) / (wall * cores())


def cores() -> int:
    """The cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def machine_busy_seconds() -> float | None:
    """CPU seconds the whole machine has computed since boot (``/proc/stat``), or None."""
    try:
        with open("/proc/stat") as handle:
            fields = [int(v) for v in handle.readline().split()[1:]]
    except (OSError, ValueError, IndexError):
        return None
    # every state but idle and iowait (user, nice, system, irq, softirq, steal)
    busy = sum(fields[:8]) - fields[3] - (fields[4] if len(fields) > 4 else 0)
    return busy / os.sysconf("SC_CLK_TCK")


def busy_cores(seconds: float = 0.3) -> float | None:
    """How many cores other processes computed on over the next ``seconds`` (``Measured``), or
    None where the system does not say."""
    clock = Measured()
    with clock:
        time.sleep(seconds)
    others = clock.others
    return None if others is None else others * cores()


def free_cores(busy: float, total: int) -> int:
    """The cores of ``total`` that other processes leave free when they keep ``busy`` cores busy
    (at least one): the thread count a backend's math library should compute on."""
    return max(total - int(round(busy)), 1)


def steady_busy_cores(seconds: float = 0.3) -> float | None:
    """``busy_cores``, probed again where the first probe found a core or more busy, the lesser
    kept: a burst of other work (a package install's tail) that one probe caught set torch to one
    thread for a whole run on a machine then idle."""
    first = busy_cores(seconds)
    if first is None or first < 0.5:
        _STEADY[:] = [first] if first is not None else []
        return first
    second = busy_cores(seconds)
    reading = first if second is None else min(first, second)
    _STEADY[:] = [reading]
    return reading


_STEADY: list[float] = []  # this process's last steady_busy_cores reading


def forget_steady_reading() -> None:
    """Act as a new start for ``steady_reading`` (``specdec.tuning.store.forget_this_process``)."""
    _STEADY.clear()


def steady_reading() -> float | None:
    """The busy cores this process's last ``steady_busy_cores`` found (the torch backend fits
    its threads by it as it loads), None before any."""
    return _STEADY[0] if _STEADY else None


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


class Measured(CpuClock):
    """A ``CpuClock`` that also knows what share of the cores other work took meanwhile."""

    def __init__(self):
        super().__init__()
        self.machine: float | None = 0.0

    def __enter__(self) -> "Measured":
        self._machine = machine_busy_seconds()
        return super().__enter__()

    def __exit__(self, *exc) -> None:
        super().__exit__(*exc)
        end = machine_busy_seconds()
        if end is None or self._machine is None or self.machine is None:
            self.machine = None
        else:
            self.machine += end - self._machine

    @property
    def others(self) -> float | None:
        """The share of the cores other processes computed on (None where the system does not
        say)."""
        return others_share(self.wall, self.cpu, self.machine)

    @property
    def free(self) -> float:
        """The share of the cores other work left this process (``free_share``)."""
        return free_share(self.wall, self.cpu, self.machine)

    @property
    def quiet(self) -> bool:
        if self.wall <= 0:
            return True
        others = self.others
        return self.share >= QUIET_SHARE if others is None else others <= 1 - QUIET_SHARE
