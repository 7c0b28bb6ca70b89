"""When a measured figure can be trusted, and the one line that says when it cannot.

Timings taken while other work shared the cores have the wrong proportions, not only the wrong
scale: a plain step slowed by a neighbour's burst and a drafting step timed in a quiet moment
made the beam planner predict 6.5x at 1.25 tokens per step. The engine's cost curve already
refuses such measurements (``specdec.tuning.machine.machine_share``: the share of the machine's
cores the process computed on, measured again below ``QUIET_SHARE``); the planners, ``specdec
bench`` and the demo use the same rule here:

- ``Measured`` (``specdec.tuning.machine``) is a ``CpuClock`` over the whole measurement that
  also reads, on Linux, what the whole machine computed meanwhile, so the share of the cores
  that *other* work took is known: a process that uses fewer threads than there are cores (the
  NumPy reference, ``OMP_NUM_THREADS=1``) is not mistaken for a busy machine. ``busy_line`` is
  the line printed with a table when other work took more than ``1 - QUIET_SHARE`` of the cores
  (elsewhere: when the process computed on less than ``QUIET_SHARE`` of them);
- ``impossible`` flags a speedup above the tokens per step it rests on (a drafting step costs at
  least a plain one: its forward carries at least the plain token, and drafting comes on top),
  beyond ``SLACK`` for timing noise;
- ``far_from`` flags a measured speedup far from its prediction (``FAR``): the prediction's
  inputs did not hold when it was checked;
- ``leads`` says whether a new choice measured far enough ahead of what ``generate`` uses now to
  replace it (``LEAD``): the planners decoded the very same trees twice in one plan 6-10% apart,
  so a lead of a percent or two is noise, and replacing a setting on it only churns the default.

A choice is kept for ``generate`` only when none of these apply (``reasons_not_to_keep``).
"""

from __future__ import annotations

import os
import sys

from specdec.tuning.machine import QUIET_SHARE, CpuClock, Measured, cores

FEW_PROMPTS = 8  # below this many prompts, one run's noise can move a setting by tens of percent

__all__ = [
    "FAR",
    "LEAD",
    "QUIET_LINE",
    "SLACK",
    "SLOW_PLAIN",
    "Measured",
    "behind",
    "busy_line",
    "busy_note",
    "far_from",
    "impossible",
    "leads",
    "reasons_not_to_keep",
    "thread_notes",
    "torch_threads",
]

SLACK = 1.05  # a speedup up to 5% above tokens/step is timing noise, not an impossibility
LEAD = 1.05  # a new choice replaces generate's setting only when it measured 5% faster or more
FAR = 1.5  # a measured speedup this many times below (or above) its prediction is far from it


def leads(measured: float, now: float) -> bool:
    """Whether a choice that ``measured`` this speedup is far enough ahead of the ``now`` of
    generate's setting, measured beside it, to replace it (``LEAD``)."""
    return measured >= now * LEAD


def behind(measured: float, now: float) -> str:
    """Why a choice that ``measured`` this speedup does not replace one that measured ``now``."""
    if measured <= now:
        return f"no faster than the {now:.2f}x"
    return (
        f"within {LEAD - 1:.0%} of the {now:.2f}x (a lead that small is one plan's noise: the "
        "same trees decoded twice measure farther apart)"
    )


# (the timed runs: a line at load about other work covers the measurements made then, not these)
# why plain decoding's run can run slow on a machine the quiet note calls quiet (the demo's and
# bench's notes on rows marked impossible)
SLOW_PLAIN = "other work, or a virtual machine's host, which the quiet note cannot see"

QUIET_LINE = (
    'note: no other work took the cores during the timed runs (docs/bench.md, "A busy machine")'
)


def busy_line(clock: CpuClock, runs_spoilt: bool = True) -> str | None:
    """The line that goes with figures measured on a busy machine, or None when it was quiet.
    ``runs_spoilt`` False: the timed runs, each on its own clock, were all quiet, so the other
    work fell outside them (loading, warm-up) and the figures stand, which the line says."""
    quiet = clock.quiet if isinstance(clock, Measured) else clock.share >= QUIET_SHARE
    if clock.wall <= 0 or quiet:
        return None
    others = clock.others if isinstance(clock, Measured) else None
    what = (
        f"other processes computed on {others:.0%} of the cores"
        if others is not None
        else f"this process computed on {clock.share:.0%} of the cores"
    )
    if not runs_spoilt:
        return (
            f"note: other work shared the machine while the command ran ({what}), but none of "
            "the timed runs was slowed (each has its own clock): it fell outside them (loading, "
            "warm-up), and the figures stand"
        )
    return (
        f"note: measured while other work shared the machine ({what}): speeds and ratios are "
        "unreliable; measure again on a quiet machine"
    )


def busy_note(clock: CpuClock, spoilt: int, runs: int) -> str | None:
    """The note on other work for a command of ``runs`` timed runs, each on its own clock, of
    which ``spoilt`` were slowed: the command's (``busy_line``), or, where its share of the cores
    was fine but bursts slowed some runs, how many, so the note never calls quiet a run whose
    rows say busy; None when every run was quiet."""
    line = busy_line(clock, runs_spoilt=bool(spoilt))
    if line is None and spoilt:
        return (
            f"note: other work slowed {spoilt} of {runs} timed runs (each run has its own clock; "
            "their methods say busy): those methods' figures are unreliable; measure again on a "
            "quiet machine"
        )
    return line


def torch_threads() -> int | None:
    """The threads torch computed on in this process (None where torch was not loaded)."""
    torch = sys.modules.get("torch")
    return None if torch is None else int(torch.get_num_threads())


def thread_notes() -> list[str]:
    """A note where torch computed on fewer threads than the machine has cores: it chose them at
    its start from the cores other work left free, and figures taken on another count (a run
    on a quiet machine) do not compare, nor share the tuning cache's measurements."""
    threads, total = torch_threads(), cores()
    if threads is None or threads >= total:
        return []
    chosen = os.environ.get("OMP_NUM_THREADS", "").strip()
    how = (
        f"as OMP_NUM_THREADS={chosen} asks"
        if chosen
        else "chosen at its start from the cores other work left free "
        f"(OMP_NUM_THREADS={threads} pins it so for every run)"
    )
    return [
        f"note: torch computed on {threads} thread(s) of {total} cores, {how}: runs on another "
        "thread count do not compare with these, and measure this machine anew"
    ]


def impossible(speedup: float, tokens_per_step: float) -> bool:
    """Whether ``speedup`` is more than the ``tokens_per_step`` it rests on allows."""
    return speedup > SLACK * max(tokens_per_step, 1.0)


def far_from(measured: float, predicted: float) -> bool:
    """Whether a measured speedup is far (``FAR``) from its prediction."""
    if measured <= 0 or predicted <= 0:
        return True
    return max(measured / predicted, predicted / measured) > FAR


def reasons_not_to_keep(
    clock: CpuClock,
    speedup: float,
    tokens_per_step: float,
    predicted: float | None = None,
    *,
    busy: bool = False,
    prompts: int | None = None,
) -> list[str]:
    """Why a choice measured under ``clock`` must not be kept for ``generate`` ([] to keep).
    ``busy``: the choice's own measurement (one row of a plan, on its own clock) was taken while
    other work took the cores, though the whole run's share was fine. ``prompts``: how many it
    was measured on; fewer than ``FEW_PROMPTS`` keep nothing (a plan on two prompts kept beams
    that measured 1.26x against generate's 1.22x: one run's noise)."""
    reasons = []
    if prompts is not None and prompts < FEW_PROMPTS:
        reasons.append(
            f"it was measured on {prompts} prompt(s), fewer than {FEW_PROMPTS}, where one run's "
            "noise moves a setting by tens of percent"
        )
    if busy_line(clock) is not None:
        reasons.append("other work shared the machine while it was measured")
    elif busy:
        reasons.append("it was timed while other work took the cores")
    if impossible(predicted if predicted is not None else speedup, tokens_per_step):
        what = "predicted" if predicted is not None else "measured"
        value = predicted if predicted is not None else speedup
        reasons.append(
            f"its {what} {value:.2f}x is above its {tokens_per_step:.2f} tokens per step, "
            "which no drafting step allows"
        )
    if predicted is not None and speedup > 0 and far_from(speedup, predicted):
        reasons.append(f"measured {speedup:.2f}x, far from the predicted {predicted:.2f}x")
    if 0 < speedup < 1.0:
        reasons.append(f"its {speedup:.2f}x is slower than plain decoding")
    return reasons
