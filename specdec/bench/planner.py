"""Pick a beam configuration from measurements on this machine.

Prediction (greedy decoding): speedup(W, L) = tau(W, L) * t_plain / t_step(W, L), with
  tau(W, L)   tokens per step, estimated from one recorded run at the widest, longest beams:
              for every step, the accepted length that the first W beams cut to length L would
              have had against the target's own tokens of that step (exact for that step; the
              trajectory of a real (W, L) run differs, so this is an estimate),
  t_step(W, L) the measured median time of one decode step (draft + verify + other) with those
              beams on this machine, t_plain the same for plain decoding (one token per step).
Both sides are decode-phase costs (the prefill is excluded), each shape timed just after the
plain step it is divided by, and ``measure`` reports measured speedups on the same footing
(each shape and plain decoding take the prompts in turn, ``specdec.bench.side_by_side``). A
prediction above the tokens per step it rests on is impossible (a drafting step costs at least
a plain one) and is listed last, flagged. With ``lookup`` (the default, as in ``generate``), every
configuration also carries the prompt-lookup beam: it is recorded as the last beam of each step
and counted, at its own length, beside the first W beams cut to L.

``keep`` saves a recommendation in the user cache (``specdec.tuning.plans``), where
``generate`` finds it when the caller names no beams, only when it can be trusted
(``specdec.bench.trust``): measured on a quiet machine, a prediction no higher than the tokens
per step it rests on, and, where it was checked by decoding, a measured speedup near it.
"""

from __future__ import annotations

from typing import Sequence

import attrs
import numpy as np

import specdec
from specdec.progress import progress as progress_bar
from specdec.capabilities import drafter_caps
from specdec.drafting.none import PassLifecycle
from specdec.generation.components import (
    add_lookup,
    load_drafter,
    lookup_by_default,
    planned_options,
)
from specdec.generation.encoding import encode_prompts
from specdec.generation.resolve import resolve
from specdec.plugins.registry import default_registry
from specdec.bench.side_by_side import PLAIN, decode_once, side_by_side
from specdec.bench.trust import Measured, behind, impossible, leads, reasons_not_to_keep
from specdec.tuning.plans import save_drafter_plan


@attrs.frozen(kw_only=True)
class Current:
    """What ``generate`` uses for the drafter now (its checkpoint's beams, or a plan kept
    before) and its measured speedup over plain decoding, decoded as the candidates are."""

    beam_width: int
    beam_length: int
    lookup: bool
    speedup: float

    def same_as(self, row: "PlanRow", lookup: bool) -> bool:
        """Whether ``row`` (decoded with the lookup beam when ``lookup``) is this setting."""
        return (row.beam_width, row.beam_length, bool(lookup)) == (
            self.beam_width,
            self.beam_length,
            bool(self.lookup),
        )

    def describe(self) -> str:
        lookup = ", with the prompt-lookup beam" if self.lookup else ""
        return f"beam_width={self.beam_width} beam_length={self.beam_length}{lookup}"


@attrs.frozen(kw_only=True)
class PlanRow:
    beam_width: int
    beam_length: int
    tokens_per_step: float
    tree_size: float
    verify_ms: float
    draft_ms: float
    predicted_speedup: float
    measured_speedup: float | None = None
    busy: bool = False  # timed (or decoded) while other work took the cores (specdec.bench.trust)
    plain_ms: float = float("nan")  # the plain step every prediction divides by (``plan``)

    @property
    def impossible(self) -> bool:
        """A predicted speedup above the tokens per step it rests on (``specdec.bench.trust``)."""
        return impossible(self.predicted_speedup, self.tokens_per_step)


class RecordingDrafter(PassLifecycle):
    """Wraps a drafter and keeps every step's beams and beam lengths on the host
    (the planner's recorder)."""

    def __init__(self, inner, backend):
        self.inner, self.backend, self.beams = inner, backend, []
        self.caps = drafter_caps(inner)

    def propose(self, context):
        draft = self.inner.propose(context)
        self.beams.append((self.backend.to_numpy(draft.beams), draft.beam_lengths))
        return draft


def _beams_of(
    beams: np.ndarray, width: int, length: int, lookup: bool, lengths: np.ndarray | None
) -> list:
    """The first ``width`` beams of a recorded step (W, L) cut to ``length`` tokens, plus its last
    (the lookup beam, at its own length) with ``lookup``; ``lengths`` (W,): the recorded beams'
    lengths (None: all L)."""
    lengths = np.full(len(beams), beams.shape[1]) if lengths is None else np.asarray(lengths)
    chosen = [beams[i, : min(length, int(lengths[i]))] for i in range(width)]
    return chosen + [beams[-1, : int(lengths[-1])]] if lookup else chosen


def accepted_length(
    beams: np.ndarray,
    emitted: Sequence[int],
    width: int,
    length: int,
    lookup: bool = False,
    lengths: np.ndarray | None = None,
) -> int:
    """Longest match of the beams (``_beams_of``), roots dropped, against the step's emitted
    tokens."""
    best = 0
    for beam in _beams_of(beams, width, length, lookup, lengths):
        n = 0
        while n < len(beam) - 1 and n < len(emitted) and beam[n + 1] == emitted[n]:
            n += 1
        best = max(best, n)
    return min(best, len(emitted) - 1)


def tree_size(
    beams: np.ndarray,
    width: int,
    length: int,
    lookup: bool = False,
    lengths: np.ndarray | None = None,
) -> int:
    """Nodes of the prefix tree of the beams (``_beams_of``)."""
    return len(
        {
            tuple(beam[: k + 1])
            for beam in _beams_of(beams, width, length, lookup, lengths)
            for k in range(len(beam))
        }
    )


TIMING_ROUNDS = 3  # rounds of each shape's steps, after an untimed one
ROUND_STEPS = 4  # decode steps of each shape a round


def step_seconds(
    target, drafter, prompt, *, backend: str, steps: int = ROUND_STEPS
) -> list[tuple[float, float, float]]:
    """Seconds of (draft, verify, other) of each of the first ``steps`` decode steps of
    ``drafter`` on ``prompt``, every step drafting (the policy of ``speculation="auto"`` would
    leave some plain)."""
    always = {} if drafter == "none" else {"speculation": "always"}
    records = list(
        specdec.stream(
            target,
            prompt,
            drafter=drafter,
            backend=backend,
            max_new_tokens=steps + 1,
            stop_at_eos=False,
            **always,
        )
    )[1:]
    return [(r.time_draft, r.time_verify, r.time_other) for r in records]


def plan(
    model,
    drafter: str,
    prompts: Sequence,
    *,
    backend: str = "torch",
    dtype: str | None = None,
    widths: Sequence[int] = (1, 2, 4, 8),
    lengths: Sequence[int] = (2, 3, 4, 5, 6),
    max_new_tokens: int = 64,
    lookup: bool = True,
    clock: Measured | None = None,
    progress: bool = False,
) -> list[PlanRow]:
    """Predicted speedup of every (W, L), best first (an impossible prediction, above its tokens
    per step, last), from one recorded run at the widest, longest beams (with the prompt-lookup
    beam when ``lookup``), timed inside ``clock``."""
    clock = clock if clock is not None else Measured()
    registry = default_registry()
    backend_obj = registry.get("backend", backend).factory()
    target = specdec.load(model, backend=backend, dtype=dtype)
    template = getattr(target, "chat_template", None)
    ids = [
        encode_prompts(p, target.tokenizer, target.vocab_size, chat_template=template)[0][0]
        for p in prompts
    ]

    named = resolve("drafter", drafter, registry, backend_obj.name)

    def drafter_with(width: int, length: int):
        one = load_drafter(
            named, target, backend_obj, registry, dict(beam_width=width, beam_length=length)
        )
        return add_lookup(one, True, backend_obj, target) if lookup else one

    wide, long = max(widths), max(lengths)
    recorder = RecordingDrafter(drafter_with(wide, long), backend_obj)
    accepted = {(w, l): [] for w in widths for l in lengths}
    sizes = {(w, l): [] for w in widths for l in lengths}
    recording = progress_bar(
        ids, desc="plan: recording the beams", unit="prompt", enabled=progress, announce=True
    )
    with clock:
        _record(
            target,
            recording,
            recorder,
            widths,
            lengths,
            accepted,
            sizes,
            backend,
            max_new_tokens,
            lookup,
        )
    # Each shape's steps in rounds, every shape once a round (the order reversed every other
    # round), beside a plain step timed just before it; a first round, untimed, warms up. Timed
    # one shape after another, 12 steps each, the first shape paid the first forwards at its
    # tree sizes and a virtual machine's drift moved the rest: a 3-node tree timed 31.7 ms beside
    # a 3.4-node one at 18.6 ms in one plan, and the best predicted shape decoded the worst.
    shapes = list(accepted)
    drafters = {shape: drafter_with(*shape) for shape in shapes}
    clocks = {shape: Measured() for shape in shapes}  # a burst of other work spoils a few only
    steps = {shape: [] for shape in shapes}  # (draft, verify, other) seconds of each step timed
    plain_steps = {shape: [] for shape in shapes}
    bar = progress_bar(
        total=len(shapes) * (TIMING_ROUNDS + 1), unit="timing", enabled=progress, announce=True,
        desc=f"plan: timing {len(shapes)} beam shapes in {TIMING_ROUNDS + 1} rounds",
    )  # fmt: skip
    for round_ in range(TIMING_ROUNDS + 1):
        for shape in shapes if round_ % 2 else shapes[::-1]:
            with clock, clocks[shape]:
                plain_times = step_seconds(target, "none", ids[0], backend=backend)
                times = step_seconds(target, drafters[shape], ids[0], backend=backend)
            bar.update(1)
            if round_:
                plain_steps[shape] += [sum(t) for t in plain_times]
                steps[shape] += times
    bar.close()
    timed = []  # (shape, tokens per step, its step's three times, the plain step, busy)
    for shape, values in accepted.items():
        tau = 1.0 + float(np.mean(values)) if values else 1.0
        times = tuple(float(np.median([t[i] for t in steps[shape]])) for i in range(3))
        plain_step = float(np.median(plain_steps[shape]))
        timed.append((shape, tau, times, plain_step, not clocks[shape].quiet))
    # One plain step for every prediction: the median of those timed beside the shapes (the
    # quiet ones, where there are any). Each shape's own plain timing moved its prediction by
    # up to half again on a quiet machine (41-63 ms for one and the same step).
    plain = float(np.median([p for *_, p, busy in timed if not busy] or [p for *_, p, _ in timed]))
    rows = [
        PlanRow(
            beam_width=w,
            beam_length=l,
            tokens_per_step=tau,
            tree_size=float(np.mean(sizes[(w, l)])),
            verify_ms=verify_s * 1e3,
            draft_ms=draft_s * 1e3,
            predicted_speedup=tau * plain / (draft_s + verify_s + other_s),
            busy=busy,
            plain_ms=plain * 1e3,
        )
        for (w, l), tau, (draft_s, verify_s, other_s), _, busy in timed
    ]
    rows.sort(key=lambda r: (r.impossible, -r.predicted_speedup))
    return rows


def _record(target, ids, recorder, widths, lengths, accepted, sizes, backend, tokens, lookup):
    """Decode every prompt with the widest, longest beams, recording each step's beams, and
    what each (W, L) would have accepted and verified there."""
    for prompt in ids:
        recorder.beams.clear()
        steps = list(
            specdec.stream(
                target,
                prompt,
                drafter=recorder,
                backend=backend,
                max_new_tokens=tokens,
                speculation="always",  # a recorded step for every decode step
            )
        )
        if len(recorder.beams) != len(steps) - 1:
            raise RuntimeError(
                f"the planner recorded {len(recorder.beams)} drafts over {len(steps) - 1} decode "
                "steps; each step must draft for its beams to be compared with its tokens"
            )
        for step, (beams, beam_lengths) in zip(steps[1:], recorder.beams):
            row_lengths = None if beam_lengths is None else beam_lengths[0]
            for w in widths:
                for l in lengths:
                    accepted[(w, l)].append(
                        accepted_length(beams[0], step.new_tokens[0], w, l, lookup, row_lengths)
                    )
                    sizes[(w, l)].append(tree_size(beams[0], w, l, lookup, row_lengths))


def keep(
    model,
    drafter: str,
    row: PlanRow,
    clock: Measured,
    *,
    backend: str,
    dtype,
    lookup: bool,
    prompts: int,
    current: "Current | None" = None,
) -> list[str]:
    """Save ``row`` for ``generate`` unless it cannot be trusted; returns why not ([] when
    saved). ``current``: what generate used before, measured beside it; a row that measured
    no faster is not kept (re-planning never replaces a setting with a slower one)."""
    measured = row.measured_speedup
    if current is not None and current.same_as(row, lookup):
        return [f"it is what generate uses now ({current.describe()})"]
    reasons = reasons_not_to_keep(
        clock,
        measured if measured is not None else row.predicted_speedup,
        row.tokens_per_step,
        predicted=row.predicted_speedup if measured is not None else None,
        busy=row.busy,
        prompts=prompts,
    )
    if measured is None and row.impossible:
        reasons = reasons or ["its prediction is above its tokens per step"]
    if current is not None and (measured is None or not leads(measured, current.speedup)):
        figure, how = (
            ("was not decoded", f"so not shown faster than the {current.speedup:.2f}x")
            if measured is None
            else (f"measured {measured:.2f}x", behind(measured, current.speedup))
        )
        reasons.append(f"it {figure}, {how} of what generate uses now ({current.describe()})")
    if reasons:
        return reasons
    backend_obj = default_registry().get("backend", backend).factory()
    target = specdec.load(model, backend=backend, dtype=dtype)
    save_drafter_plan(
        backend_obj,
        target,
        drafter,
        options={"beam_width": row.beam_width, "beam_length": row.beam_length},
        details={
            "predicted_speedup": round(row.predicted_speedup, 3),
            "measured_speedup": None if measured is None else round(measured, 3),
            "lookup": lookup,
            "tokens_per_step": round(row.tokens_per_step, 3),
            "prompts": prompts,
        },
    )
    return []


def measure(
    model,
    drafter: str,
    prompts: Sequence,
    rows: Sequence[PlanRow],
    *,
    backend: str,
    dtype: str | None,
    max_new_tokens: int = 64,
    lookup: bool = True,
    clock: Measured | None = None,
    progress: bool = False,
) -> list[PlanRow]:
    """Run the real decoder for ``rows``: measured speedup = decode-phase tokens/s
    (prefill excluded, as in the prediction) over that of plain decoding, the two taking the
    same prompts in turn on the same target (``_beside_plain``), inside ``clock``."""
    target = specdec.load(model, backend=backend, dtype=dtype)
    clock = clock if clock is not None else Measured()
    if rows:  # untimed, a whole prompt: a first decode pays what a first call pays (the
        # first forwards at each tree size and position), which counted against the first row
        first = rows[0]
        decode_once(
            target, prompts[0], drafter,
            dict(beam_width=first.beam_width, beam_length=first.beam_length, lookup=lookup),
            backend=backend, tokens=max_new_tokens, stop_at_eos=True,
        )  # fmt: skip
    checked = []
    best = progress_bar(
        rows, desc="plan: decoding the best shapes", unit="shape", enabled=progress, announce=True
    )
    for row in best:
        options = dict(beam_width=row.beam_width, beam_length=row.beam_length, lookup=lookup)
        speedup, busy = _beside_plain(
            target, prompts, drafter, options, backend, max_new_tokens, clock
        )
        checked.append(attrs.evolve(row, measured_speedup=speedup, busy=row.busy or busy))
    return checked


def _beside_plain(target, prompts, drafter, options, backend, tokens, clock) -> tuple[float, bool]:
    """(decode-phase tokens/s over plain decoding's, busy) of ``drafter`` with ``options``, each
    prompt decoded by both in turn (``specdec.bench.side_by_side``)."""
    decoded = side_by_side(
        target, prompts, {"plain": PLAIN, "setting": (drafter, options)}, backend=backend,
        tokens=tokens, clock=clock,
    )  # fmt: skip
    plain, setting = decoded["plain"], decoded["setting"]
    return setting.rate / plain.rate, setting.busy or plain.busy


def measure_current(
    model,
    drafter: str,
    prompts: Sequence,
    *,
    backend: str,
    dtype: str | None,
    max_new_tokens: int = 64,
    clock: Measured | None = None,
    now: Current | None = None,
) -> Current:
    """What ``generate`` uses for ``drafter`` when no beams are given (the checkpoint's, or a
    plan kept before; ``now``: ``current_beams`` already taken), decoded as ``measure`` decodes
    a candidate, beside plain decoding."""
    target = specdec.load(model, backend=backend, dtype=dtype)
    now = current_beams(target, drafter, backend=backend) if now is None else now
    clock = clock if clock is not None else Measured()
    speedup, _ = _beside_plain(target, prompts, drafter, {}, backend, max_new_tokens, clock)
    return attrs.evolve(now, speedup=speedup)


def current_beams(target, drafter: str, *, backend: str) -> Current:
    """What ``generate`` uses for ``drafter`` on ``target`` when no beams are given (the
    checkpoint's, or a plan kept before), not decoded (speedup 0)."""
    registry = default_registry()
    backend_obj = registry.get("backend", backend).factory()
    named = resolve("drafter", drafter, registry, backend_obj.name)
    options, planned = planned_options(backend_obj, target, named, {})
    built = load_drafter(named, target, backend_obj, registry, options)
    return Current(
        beam_width=int(getattr(built, "beam_width", 1)),
        beam_length=int(getattr(built, "beam_length", 1)),
        lookup=lookup_by_default(named, built, None, planned),
        speedup=0.0,
    )
