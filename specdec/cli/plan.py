"""``specdec plan``: choose a drafter's beams (ReDrafter) or tree settings (EAGLE, EAGLE-3)
for this machine, say what the figures are and what to do next, and keep a choice for
``generate`` only where it can be trusted (``specdec.bench.planner``, ``tree_planner``)."""

from __future__ import annotations

import sys

import attrs

import specdec
from specdec.bench import load_prompt_set, tree_planner
from specdec.bench.planner import current_beams, keep, measure, measure_current, plan
from specdec.bench.prompts import PROMPT_SETS, UNCATEGORISED
from specdec.bench.tree_planner import plan_tree
from specdec.bench.trust import (
    FEW_PROMPTS,
    LEAD,
    QUIET_LINE,
    Measured,
    behind,
    busy_line,
    impossible,
    leads,
    thread_notes,
)
from specdec.drafting.lookup import DEFAULT_DRAFT_LENGTH
from specdec.errors import InvalidInputError
from specdec.generation.resolve import resolve
from specdec.plugins.registry import default_registry


def cmd_plan(args) -> int:
    """Predict the speedup of every beam configuration, recommend one, and check the best few;
    or, for a tree drafter, decode with its tree settings and recommend the fastest."""
    loaded = load_prompt_set(args.prompts, per_category=args.per_category, limit=args.limit)
    prompts = [p.prompt for p in loaded]
    # which kinds of text a few-prompt plan saw (two prompts are two categories)
    kinds = [c for c in dict.fromkeys(p.category for p in loaded) if c != UNCATEGORISED]
    registry = default_registry()
    named = resolve("drafter", args.drafter, registry, args.backend)
    if named.spec is not None and named.spec.tree_options:
        return _plan_tree(args, prompts, kinds)
    if named.spec is None or not named.spec.beam_options:
        specs = [registry.drafter_spec(n) for n in registry.names("drafter_spec")]
        plannable = sorted(s.name for s in specs if s.beam_options or s.tree_options)
        raise InvalidInputError(
            f"specdec plan chooses a drafter's beams or its tree settings, and drafter "
            f"{args.drafter!r} has neither, so there is nothing to plan; give one of "
            f"{', '.join(plannable)} or a checkpoint folder of one (a plugin's drafter is "
            "planned when its spec sets beam_options or tree_options)"
        )
    lookup = not args.no_lookup
    clock = Measured()
    options = dict(backend=args.backend, dtype=args.dtype, max_new_tokens=args.max_new_tokens)
    target = specdec.load(args.model, backend=args.backend, dtype=args.dtype)  # once for all
    rows = plan(
        target,
        args.drafter,
        prompts,
        widths=args.widths,
        lengths=args.lengths,
        lookup=lookup,
        clock=clock,
        progress=True,
        **options,
    )
    # the best shapes timed quiet; where every one was timed busy, the best anyway: decoded
    # beside plain decoding, a figure that other work slows on both sides (never kept)
    possible = [r for r in rows if not r.impossible]
    plausible = ([r for r in possible if not r.busy] or possible)[: args.measure_top]
    checked = (
        measure(
            target,
            args.drafter,
            prompts,
            plausible,
            lookup=lookup,
            clock=clock,
            progress=True,
            **options,
        )
        if args.measure_top and plausible
        else []
    )
    now = current_beams(target, args.drafter, backend=args.backend)
    current = None
    if checked:  # generate's setting decoded beside them: once, reused where it was a candidate
        decoded = next((r for r in checked if now.same_as(r, lookup)), None)
        if decoded is None:  # one more than the best shapes' count said
            print("plan: decoding generate's setting now, beside them", file=sys.stderr, flush=True)
        current = (
            attrs.evolve(now, speedup=decoded.measured_speedup)
            if decoded is not None
            else measure_current(target, args.drafter, prompts, clock=clock, now=now, **options)
        )
        now = current
    measured = {(r.beam_width, r.beam_length): r.measured_speedup for r in checked}
    if current is not None:  # generate's shape, decoded beside them: its row shows the figure
        measured.setdefault((current.beam_width, current.beam_length), current.speedup)
    print(
        f"plain step: {rows[0].plain_ms:.1f} ms (the median of the plain steps timed beside the "
        "shapes); predicted speedup = tokens/step x plain step / the shape's step"
    )
    trusted = [r for r in checked if not r.busy] or checked  # a busy decode: left out if others
    best = (
        max(trusted, key=lambda r: r.measured_speedup)
        if trusted
        else next((r for r in rows if not r.busy and not r.impossible), rows[0])
    )
    figure = (
        f"measured {best.measured_speedup:.2f}x, predicted {best.predicted_speedup:.2f}x"
        if best.measured_speedup is not None
        else f"predicted {best.predicted_speedup:.2f}x"
    )
    shape = f"beam_width={best.beam_width} beam_length={best.beam_length}"
    with_lookup = (
        f", with the prompt-lookup beam of {DEFAULT_DRAFT_LENGTH} tokens" if lookup else ""
    )
    speedup = best.measured_speedup if best.measured_speedup is not None else best.predicted_speedup
    # no other shape decoded far enough ahead of generate's setting (trust.leads): keep it
    keep_now = (
        current is not None
        and not now.same_as(best, lookup)
        and not best.busy
        and best.measured_speedup is not None
        and not leads(best.measured_speedup, current.speedup)
    )
    if keep_now:
        speedup = current.speedup
    label = _recommended(best.busy, speedup)
    print(
        "| W | L | tokens/step (est.) | tree size | draft ms | verify ms | "
        "predicted speedup | measured |"
    )
    print("|---|---|---|---|---|---|---|---|")
    # a shape timed quiet but decoded while other work took the cores: its figure's own mark
    decoded_busy = {(r.beam_width, r.beam_length) for r in checked if r.busy}
    timed_busy = _busy_mark(rows, "timed")
    for r in rows:
        m = measured.get((r.beam_width, r.beam_length))
        # the prediction's own mark: a row decoded is judged (and may be chosen) by its measure
        flag = " (prediction impossible: above its tokens/step)" if r.impossible else ""
        flag += timed_busy if r.busy else ""
        flag += " (generate's now)" if now.same_as(r, lookup) else ""
        # the row the choice line names: the measured figure chose it, not the table's order
        chose = (
            now.same_as(r, lookup)
            if keep_now
            else (r.beam_width, r.beam_length)
            == (
                best.beam_width,
                best.beam_length,
            )
        )
        flag += " (chosen)" if chose and label == "recommended" else ""
        late = (r.beam_width, r.beam_length) in decoded_busy and not r.busy
        print(
            f"| {r.beam_width} | {r.beam_length} | {r.tokens_per_step:.2f} | {r.tree_size:.1f} | "
            f"{r.draft_ms:.1f} | {r.verify_ms:.1f} | "
            f"{r.predicted_speedup:.2f}x{flag} | "
            f"{'-' if m is None else f'{m:.2f}x'}"
            f"{' (busy: decoded while other work took the cores)' if late else ''} |"
        )
    print(BEAM_MODE_LINE)
    _prediction_note(rows, measured)
    if current is not None and now.same_as(best, lookup):
        print(f"{label}: {shape} ({figure}{with_lookup}): generate's setting now")
    elif keep_now:
        print(
            f"{label}: keep generate's setting now, {current.describe()} (measured "
            f"{current.speedup:.2f}x); the best other shape decoded: {shape} ({figure}"
            f"{with_lookup}), {behind(best.measured_speedup, current.speedup)}"
        )
    else:
        print(f"{label}: {shape} ({figure} over plain decoding, decode phase{with_lookup})")
        if current is not None:
            print(
                f"generate's setting now: {current.describe()} (measured "
                f"{current.speedup:.2f}x, decoded the same way)"
            )
    if speedup < 1.0:
        print(NOTHING_PAYS)
    if args.measure_top and not plausible:
        print(
            "note: no shape was decoded (--measure-top), so the measured column is empty: each "
            "was predicted above its tokens/step (its timing was spoilt: plan again)"
        )
    # a shape timed busy and then decoded is one shape, not two
    spoilt = len({(r.beam_width, r.beam_length) for r in (*rows, *checked) if r.busy})
    _machine_notes(clock, some_busy=bool(spoilt))
    if spoilt and any(not r.busy for r in rows):
        shapes = (
            "1 shape above (marked busy) was"
            if spoilt == 1
            else (f"{spoilt} shapes above (marked busy) were")
        )
        print(
            f"note: {shapes} timed while other work took the cores, though the plan as a whole "
            "was quiet: a shape timed busy was not decoded, and was left out of the choice, "
            "however high its prediction; plan again on a quiet machine"
        )
    elif spoilt:
        print(EVERY_ROW_BUSY.format(rows="shape above", what="timed"))
    chosen = {"beam_width": best.beam_width, "beam_length": best.beam_length}
    # nothing to name per call or check: what generate uses already, or slower than plain
    is_now = keep_now or (current is not None and now.same_as(best, lookup)) or speedup < 1.0
    saved = False
    if args.no_save:
        print(
            "not saved (--no-save)"
            + ("" if is_now else _by_hand(args.drafter, chosen, anyway=False))
        )
    else:
        reasons = keep(
            target,
            args.drafter,
            best,
            clock,
            backend=args.backend,
            dtype=args.dtype,
            lookup=lookup,
            prompts=len(prompts),
            current=current,
        )
        already = current is not None and current.same_as(best, lookup)
        print(
            "saved: generate uses it for this drafter on this machine when no beams are given"
            if not reasons
            else f"nothing to save: {reasons[0]}"
            if already
            else f"not saved: {'; '.join(reasons)} (generate keeps what it used before)"
            + ("" if is_now else _by_hand(args.drafter, chosen))
        )
        saved = not reasons
    _afterword(args, prompts, None if is_now else chosen, saved=saved, kinds=kinds)
    return 0


AUTO = (
    "generate's default, \"auto\", drafts only in the steps where that is predicted to pay, so "
    "it often runs above that figure (it drafts where the text is predictable and decodes the "
    "rest plainly), and at worst a few percent below 1.00x (it drafts a step now and then to "
    "find out); auto also cuts trees to what pays, so a lead between two settings measured here "
    "can shrink or vanish under auto (bench decodes settings as generate runs them)"
)
MODE_LINE = (
    "every setting above was decoded with speculation=\"always\" (each step drafting), so its "
    f"figure is what its trees give; {AUTO}"
)
BEAM_MODE_LINE = (
    "the predicted column assumes drafting every step, and the measured one was decoded with "
    f"speculation=\"always\" (each step drafting), so a figure is what its beams give; {AUTO}"
)


def more_prompts(args) -> str:
    """How to take more prompts, by what kept them few: --limit, the set's own size, or the
    prompts per category."""
    if args.limit is not None:
        return f"drop --limit {args.limit}"
    if args.prompts not in PROMPT_SETS:
        return f"add prompts to {args.prompts}"
    return f"--per-category {(args.per_category or 1) + 1}"


OFF = 0.15  # decoded figures this far from their predictions get a note on reading the table


def _prediction_note(rows, measured: dict) -> None:
    """A note when a decoded shape's figure is far from its prediction: the prediction ranks
    the shapes, the decoded figure is the one to go by."""
    ratios = [
        measured[(r.beam_width, r.beam_length)] / r.predicted_speedup
        for r in rows
        if measured.get((r.beam_width, r.beam_length)) and r.predicted_speedup > 0
    ]
    if ratios and max(abs(x - 1.0) for x in ratios) > OFF:
        print(
            f"note: the shapes decoded measured {min(ratios):.2f}-{max(ratios):.2f} times their "
            "predictions: a prediction times 12 steps of the first prompt and estimates tokens "
            "per step from the widest beams' recording, so it ranks the shapes; the measured "
            "column, decoded over every prompt, is the figure to go by"
        )


def _afterword(
    args, prompts, chosen: dict | None, *, saved: bool = False, kinds: list = ()
) -> None:
    """What every plan says after its choice (``chosen``: its settings; None: what generate uses
    already, nothing to check; ``saved``: generate now decodes with it when none is named): how
    to check it, and what its prompts were (``kinds``: their categories)."""
    if len(prompts) < FEW_PROMPTS:
        of = f" ({', '.join(kinds)})" if kinds else ""
        print(
            f"note: planned on {len(prompts)} prompt(s){of}: one run's noise can move a "
            f"setting's figure by tens of percent, so nothing is kept; plan on more "
            f"({more_prompts(args)}) to keep a choice"
            if args.no_save
            else f"note: planned on {len(prompts)} prompt(s){of}; to keep a choice, plan on "
            f"more ({more_prompts(args)})"  # the "not saved" line said why: said once
        )
    same = chosen is not None and [
        f"--model {args.model}",
        f"--prompts {args.prompts}",
        f"--per-category {args.per_category}" if args.per_category is not None else "",
        f"--limit {args.limit}" if args.limit is not None else "",
        f"--backends {args.backend}",
        f"--max-new-tokens {args.max_new_tokens}",
    ]
    if same:  # once saved, the drafter's name alone decodes with the choice
        methods = f"plain {args.drafter}" + (
            "" if saved else f" {args.drafter}:{_per_call(chosen)}"
        )
        print(
            "check a choice as generate runs it, on the same prompts: specdec bench "
            f"{' '.join(filter(None, same))} --methods {methods} (docs/bench.md)"
        )
    if args.prompts in PROMPT_SETS:
        print(
            f"planned on the {args.prompts} prompts; the best settings depend on the text: for "
            "another kind of use (code, say) plan with --prompts FILE.jsonl of prompts like your "
            "own",
            file=sys.stderr,
        )


def _machine_notes(clock, some_busy: bool = False) -> None:
    """The lines on the machine the plan ran on: whether other work shared it (``busy_line``,
    else ``QUIET_LINE``, unless ``some_busy`` rows were timed in a burst: "quiet during the
    timed runs" beside "1 of the shapes above (marked busy)" read as a contradiction), and
    torch's threads where fewer than the cores (``thread_notes``)."""
    line = busy_line(clock) or (None if some_busy else QUIET_LINE)
    if line:
        print(line)
    for note in thread_notes():
        print(note)


def _busy_mark(rows, what: str) -> str:
    """The mark of a row ``what`` ("timed", "decoded") while other work took the cores: in
    words, or "(busy)" alone where every row has it (the note under the table says it once)."""
    if rows and all(r.busy for r in rows):
        return " (busy)"
    return f" (busy: {what} while other work took the cores)"


def _recommended(busy: bool, speedup: float | None = None) -> str:
    """The recommendation's label: a choice timed beside other work is only the best guess, a
    choice slower than plain decoding only the fastest found (``speedup``: its figure)."""
    slower = speedup is not None and speedup < 1.0
    if busy:
        return "best guess (timed while other work took the cores)" + (
            ", and slower than plain decoding" if slower else ""
        )
    if slower:
        return "fastest found, but slower than plain decoding"
    if speedup is not None and not leads(speedup, 1.0):  # a 1.02x "recommended" was noise
        return f"fastest found, but within {LEAD - 1:.0%} of plain decoding"
    return "recommended"


EVERY_ROW_BUSY = (
    "note: every {rows} was {what} while other work took the cores (marked busy): its figures "
    "are that work's noise as much as its own; plan again on a quiet machine"
)
NOTHING_PAYS = (
    "note: no setting here beat plain decoding; generate's auto speculation decodes plainly "
    "where drafting does not pay (speculation=\"never\" turns drafting off)"
)


def _plan_tree(args, prompts, kinds: list) -> int:
    clock = Measured()
    rows = plan_tree(
        args.model,
        args.drafter,
        prompts,
        backend=args.backend,
        dtype=args.dtype,
        max_new_tokens=args.max_new_tokens,
        lookup=False if args.no_lookup else None,
        save=not args.no_save,
        clock=clock,
        progress=True,
    )
    print("| settings | lookup | tokens/step | nodes/step | measured speedup |")
    print("|---|---|---|---|---|")
    seen: dict[tuple, str] = {}  # a row's counts -> the first (fastest) row with them
    busy = _busy_mark(rows, "decoded")
    for r in rows:
        settings = " ".join(f"{k}={v}" for k, v in sorted(r.options.items()))
        if r.current:
            settings = "generate's setting now (none named)"
        flag = (
            " (impossible: above its tokens/step)"
            if impossible(r.speedup, r.tokens_per_step)
            else ""
        ) + (busy if r.busy else "")
        # rows with the same trees (TreePlanRow.same_trees), keyed by what they decoded
        counts = (r.tokens_per_step, r.nodes_per_step)
        if counts in seen:
            flag += f" (the same tokens and nodes per step as {seen[counts]})"
        lookup = "as now" if r.lookup is None else "yes" if r.lookup else "no"
        # named with its lookup: two rows can share the settings and differ by it alone
        seen.setdefault(counts, settings if r.lookup is None else f"{settings}, lookup {lookup}")
        print(
            f"| {settings} | {lookup} | {r.tokens_per_step:.2f} | "
            f"{r.nodes_per_step:.1f} | {r.speedup:.2f}x{flag} |"
        )
    print(MODE_LINE)
    if all(r.busy for r in rows):
        print(EVERY_ROW_BUSY.format(rows="setting above", what="decoded"))
    best = next(r for r in rows if not r.current)
    settings = " ".join(f"{k}={v}" for k, v in sorted(best.options.items())) or "its defaults"
    print(
        f"{_recommended(best.busy, best.speedup)}: {settings}, lookup "
        f"{'on' if best.lookup else 'off'} (measured {best.speedup:.2f}x over plain decoding, "
        f"decode phase, {len(rows)} distinct settings decoded)"
    )
    if best.speedup < 1.0:
        print(NOTHING_PAYS)
    now = next((r for r in rows if r.current), None)
    same = now is not None and best.same_trees(now)
    if same:  # its lead over generate's setting is noise: the same trees, timed twice
        print(
            "note: it decoded the same tokens and nodes per step as generate's setting now, so "
            "the same trees: keep generate's setting (their speeds differ by noise alone)"
        )
    _machine_notes(clock)
    chosen = {**best.options, "lookup": bool(best.lookup)}
    slower = best.speedup < 1.0 or same  # nothing to name per call or check
    saved = False
    if args.no_save:
        print(
            "not saved (--no-save)"
            + ("" if slower else _by_hand(args.drafter, chosen, anyway=False))
        )
    else:
        # the rule plan_tree saved by
        reasons = tree_planner.why_not_kept(rows, clock, prompts=len(prompts))
        saved = not reasons
        print(
            "saved: generate uses it for this drafter on this machine when no tree settings "
            "are given"
            if not reasons
            else f"not saved: {'; '.join(reasons)} (generate keeps what it used before)"
            + ("" if slower else _by_hand(args.drafter, chosen))
        )
    _afterword(args, prompts, None if slower else chosen, saved=saved, kinds=kinds)
    return 0


def _per_call(options: dict) -> str:
    """A choice's settings as a method's options: w=2,l=5 or depth=2,total_tokens=4,..."""
    short = {"beam_width": "w", "beam_length": "l"}
    return ",".join(f"{short.get(k, k)}={str(v).lower()}" for k, v in options.items())


def _by_hand(drafter: str, options: dict, *, anyway: bool = True) -> str:
    """How to decode with a choice the planner did not keep: the settings named per call."""
    cli = _per_call(options)
    python = ", ".join(f"{k}={v!r}" for k, v in options.items())
    return (
        f"; to decode with it{' anyway' if anyway else ''}, name it per call: --drafter "
        f"{drafter}:{cli} (generate(..., {python}))"
    )
