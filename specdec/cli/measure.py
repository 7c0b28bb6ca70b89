"""``specdec bench`` and ``specdec tune``, and the parsers of those and ``specdec plan`` (its code:
``specdec.cli.plan``): measurements on this machine."""

from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path

from specdec.bench import load_prompt_set, parse_method, run_bench
from specdec.bench.report import (
    auto_behind_notes,
    impossible_mark,
    markdown,
    plain_notes,
    settings_note,
    spread_notes,
    summarize,
    write_outputs,
)
from specdec.bench.trust import (
    FEW_PROMPTS,
    LEAD,
    QUIET_LINE,
    SLOW_PLAIN,
    Measured,
    busy_note,
    leads,
    thread_notes,
    torch_threads,
)
from specdec.cli.common import positive
from specdec.cli.plan import cmd_plan, more_prompts
from specdec.errors import InvalidInputError, require
from specdec.generation.components import resolve_drafter
from specdec.generation.loading import load_backend
from specdec.models.bundled import resolve_model
from specdec.plugins.registry import default_registry, installed_distributions
from specdec.tuning.dtype import architecture_key, dtype_cache_file, load_fastest
from specdec.tuning.exactness import configure
from specdec.tuning.exactness import describe as describe_exactness


def cmd_bench(args) -> int:
    """Run a benchmark grid and write bench.json, bench.md and plots to --out."""
    require("matplotlib", extra="bench", feature="specdec bench (its plots)")  # before any run
    prompts = load_prompt_set(args.prompts, per_category=args.per_category, limit=args.limit)
    methods = [parse_method(m) for m in args.methods]
    grid = [(item.partition(":")[0], item.partition(":")[2] or None) for item in args.backends]
    for backend, _ in grid:  # each method's drafter and options checked before any model loads
        for method in methods:
            if not method.is_peer:
                resolve_drafter(method.drafter, backend, dict(method.generate_options))
    _bench_out(Path(args.out))  # an unwritable --out fails before the runs, not after
    clock = Measured()
    with clock:
        records = run_bench(
            args.model,
            prompts,
            methods,
            grid=grid,
            temperatures=args.temperatures,
            max_new_tokens=args.max_new_tokens,
            repeats=args.repeats,
            warmup=args.warmup,
            seed=args.seed,
        )
    busy = busy_note(clock, sum(r.busy for r in records), len(records))
    notes = [busy or QUIET_LINE]
    summary = summarize(records)  # once: the notes read it, and the files and table show it
    notes += settings_note(records) + plain_notes(summary) + auto_behind_notes(summary)
    notes += thread_notes()
    notes += few_runs_note(len(prompts), args)
    notes += category_note([p.category for p in prompts], args.repeats)
    notes += auto_repeat_note(summary, args.repeats)
    notes += spread_notes(summary) + ties_note(summary) + impossible_note(summary)
    meta = dict(
        command=" ".join(sys.argv),
        versions=installed_distributions(),
        model=str(args.model),
        prompts=args.prompts,
        per_category=args.per_category,
        max_new_tokens=args.max_new_tokens,
        busy=busy,
        quiet_runs=sum(not r.busy for r in records),
        runs=len(records),
        notes=notes,
        threads=torch_threads(),
    )
    write_outputs(records, Path(args.out), meta=meta, summary=summary)
    print(markdown(summary, categories=args.categories))
    print("\n".join(notes))
    print(f"wrote {args.out}/bench.json, bench.md, speedup.png, accepted.png", file=sys.stderr)
    return 0


def few_runs_note(prompts: int, args) -> list[str]:
    """The note when bench measured too few runs to tell methods apart, with what to change:
    more prompts, and more repeats where it took fewer than 3 (it said "--repeats 3" to a run
    of --repeats 3)."""
    if prompts * args.repeats >= FEW_PROMPTS:
        return []
    repeats = ", or --repeats 3" if args.repeats < 3 else ""
    return [
        f"note: {prompts} prompt(s) x {args.repeats} repeat(s): one run's noise can move a "
        f"method's figure by tens of percent; measure on more ({more_prompts(args)}{repeats}) "
        "before you rely on a difference"
    ]


def ties_note(rows) -> list[str]:
    """The note naming methods whose totals lie within ``LEAD`` (5%) of the next one's: a lead
    that small is within what one run's noise moves a figure, so their order is not a finding
    (a reader took redrafter's 1.25x over lookup's 1.24x for one). Methods are compared within
    one backend, dtype and temperature, which a grid of several names ("redrafter 1.18x and
    redrafter 1.18x" compared float32 with bfloat16)."""
    totals = [
        r
        for r in rows
        if r["category"] == "all"
        and r["method"] != "plain"
        and r.get("speedup") == r.get("speedup")
    ]
    ties = []
    settings = list(dict.fromkeys((r["backend"], r["dtype"], r["temperature"]) for r in totals))
    for setting in settings:
        ranked = sorted(
            (r for r in totals if (r["backend"], r["dtype"], r["temperature"]) == setting),
            key=lambda r: -r["speedup"],
        )
        # where the grid has several backends, dtypes or temperatures, each pair says which
        where = f" ({setting[0]} {setting[1]}, T={setting[2]:g})" if len(settings) > 1 else ""
        ties += [
            f"{a['method']} {a['speedup']:.2f}x and {b['method']} {b['speedup']:.2f}x{where}"
            for a, b in zip(ranked, ranked[1:])
            # on the figures as printed: 1.0502 apart read as 1.15x and 1.10x, untied
            if b["speedup"] > 0 and not leads(round(a["speedup"], 2), round(b["speedup"], 2))
        ]
    if not ties:
        return []
    return [
        f"note: within {LEAD - 1:.0%} of each other: {'; '.join(ties)}; read each pair as tied "
        "unless more prompts and --repeats keep its order"
    ]


AUTO_MADE_CHOICES = (0.05, 0.95)  # a share of plain steps between these: auto chose per step


def auto_repeat_note(rows, repeats: int) -> list[str]:
    """The note where methods under auto rest on one repeat: which steps auto drafts rests on
    what it has learnt so far, so its figure moves from run to run more than a method drafting
    every step (docs/bench.md, "Auto's own spread"); ``--repeats 3`` shows how far."""
    if repeats > 1:
        return []
    low, high = AUTO_MADE_CHOICES
    auto = [
        r["method"]
        for r in rows
        if r["category"] == "all"
        and r["method"] != "plain"
        and "speculation=" not in r["method"]
        and low <= r.get("plain_step_share", 0.0) <= high
    ]
    if not auto:
        return []
    return [
        f"note: {', '.join(dict.fromkeys(auto))} decoded under auto on one repeat: which steps "
        "auto drafts rests on what it has learnt so far, so its figure moves from run to run "
        "(docs/bench.md, \"Auto's own spread\"); --repeats 3 shows how far (a method is left "
        "out where auto drafted in nearly all of its steps, or nearly none: there its figure rests "
        "little on which steps auto drafts)"
    ]


def impossible_note(rows) -> list[str]:
    """The note when rows stand above their tokens per step (marked in bench.md and the plot, not
    in the terminal's total table): their plain decoding was slowed, and a total over the same
    runs is lifted by it too (a medusa total of 1.07x at 1.02 tokens a step)."""
    flagged = [r for r in rows if r["method"] != "plain" and impossible_mark(r)]
    if not flagged:
        return []
    where = sorted({f"{r['category']}: {r['method']}" for r in flagged})
    shown = ", ".join(where[:4]) + (f" and {len(where) - 4} more" if len(where) > 4 else "")
    return [
        f"note: {len(where)} row(s) measured above their tokens/step ({shown}; marked "
        f"impossible in bench.md): plain decoding's runs there ran slow ({SLOW_PLAIN}), and the "
        "totals over the same runs are lifted by them too; --repeats 3 pools more runs"
    ]


def category_note(categories: list, repeats: int) -> list[str]:
    """The note when bench.md's rows per category rest on few runs each (``--per-category 1``:
    one prompt each, a "roleplay 1.69x" beside a "humanities 0.95x" with no word)."""
    counts = Counter(categories)
    fewest = min(counts.values(), default=0) * repeats
    if len(counts) < 2 or fewest >= FEW_PROMPTS:
        return []
    return [
        f"note: a row per category rests on as few as {fewest} run(s) (bench.md has them): read "
        "those as examples, the total row as the figure"
    ]


def _bench_out(out: Path) -> None:
    """That bench can write its outputs into ``--out``, or an error that names ``--out`` and why.
    The folders the check makes are removed again: ``write_outputs`` makes them after the runs,
    so a run refused or stopped before then leaves no empty folder behind."""
    if out.exists() and not out.is_dir():
        raise InvalidInputError(f"--out {str(out)!r} is a file: give a folder for bench's outputs")
    made = [folder for folder in (out, *out.parents) if not folder.exists()]
    try:
        out.mkdir(parents=True, exist_ok=True)
        probe = out / ".specdec-bench-write-check"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as exc:
        raise InvalidInputError(
            f"--out {str(out)!r} cannot be written ({exc.strerror or exc}): give a folder you "
            "can write"
        ) from None
    finally:
        for folder in made:  # innermost first; only the ones this check made, and only empty
            try:
                folder.rmdir()
            except OSError:
                break


def cmd_tune(args) -> int:
    """Measure every dtype the backend offers for this model here, print the table, keep the
    fastest."""
    backend = load_backend(args.backend, default_registry())
    if not hasattr(backend, "dtype_candidates"):
        print(f"backend {backend.name!r} computes in one dtype: nothing to tune")
        return 0
    target, choice = load_fastest(
        backend, resolve_model(args.model), device=args.device, remeasure=True
    )
    print(f"device: {choice.device or backend.name}")
    if choice.timings:
        sizes = list(next(iter(choice.timings.values())))
        print("| dtype | " + " | ".join(f"{k}-token forward ms" for k in sizes) + " |")
        print("|---|" + "---|" * len(sizes))
        for dtype, timings in choice.timings.items():
            print(f"| {dtype} | " + " | ".join(f"{timings[k]:.1f}" for k in sizes) + " |")
    print(f"fastest: {choice.dtype} (used when dtype is not given)")
    configure(target, None, backend=backend.name)
    check = getattr(target.exactness, "check", None)
    print(
        describe_exactness(target)
        + (f" (checked: {', '.join(check.checked)})" if check and check.checked else "")
    )
    forms = getattr(target, "product_forms", None)  # a backend's kernel forms, where it has them
    if forms is not None and not getattr(target, "exact", False):
        print(f"layer products: {forms}")

    arch = architecture_key(resolve_model(args.model))
    if arch is not None and choice.timings:
        print(f"kept in {dtype_cache_file(backend, args.device, arch)}", file=sys.stderr)
    return 0


def add_parsers(sub) -> None:
    bench = sub.add_parser(
        "bench",
        help="measure methods side by side on a prompt set",
        description="Measure methods side by side (interleaved) and write bench.json, bench.md "
        "and plots. Table columns: tok/s (new tokens per second over the whole answer, "
        "the prompt's forward included, repeats pooled); speedup vs plain (the ratio to our "
        "plain decoding's tok/s in the same grid row); tokens/step (emitted per target "
        "forward, bonus counted: plain is 1.00); verified/step (tree nodes the target "
        "verified per step); no-draft steps (steps a row decoded plainly: auto declined, or "
        "the drafter proposed nothing); tree reduction (nodes saved by merging the beams' "
        "shared prefixes); draft / verify / other (where a step's time went); identical to "
        "plain (tokens equal to plain decoding's, greedy); vs peer's plain (a peer's speedup over "
        "its own library's plain decoding); exact (our target's exact mode); T (temperature); "
        "peak RSS MB (the process's peak memory so far; one note instead where every row's is "
        "the same). A method also takes exact=true|false "
        "(ours) and dtype= (peers), beside the drafter's own options.",
    )
    bench.add_argument(
        "--model", required=True, help="a bundled name (smollm2-135m), folder or .gguf"
    )
    bench.add_argument(
        "--prompts",
        default="mt-bench",
        help="mt-bench | humaneval | a JSONL file (default mt-bench)",
    )
    bench.add_argument(
        "--per-category", type=positive, default=None, help="first N prompts of each category"
    )
    bench.add_argument(
        "--limit",
        type=positive,
        default=None,
        help="then the first N prompts (e.g. 2 for a quick run)",
    )
    bench.add_argument(
        "--methods",
        nargs="+",
        default=["plain", "redrafter", "medusa"],
        help="plain; any installed drafter by name with its options (redrafter[:w=4,l=5,"
        "lookup=true], medusa[:choices=cpu16], eagle[:total_tokens=8], draft_model:draft=M, "
        "lookup[:k=10]) and checkpoints (eagle3:drafter=runs/e3,total_tokens=16), "
        "third-party drafters too (`specdec plugins` lists them); peers: hf, hf-pld[:n=10], "
        "hf-assisted:draft=M, mlx-lm, mlx-lm-draft:draft=M (docs/bench.md); default: plain "
        "redrafter medusa",
    )
    bench.add_argument(
        "--backends",
        nargs="+",
        default=["torch"],
        help="backend[:dtype] ... (no dtype: the one measured fastest here, as generate; "
        "default torch)",
    )
    bench.add_argument(
        "--temperatures", nargs="+", type=float, default=[0.0], help="default 0 (greedy)"
    )
    bench.add_argument(
        "--max-new-tokens", type=positive, default=128, help="per prompt (default 128)"
    )
    bench.add_argument(
        "--repeats",
        type=positive,
        default=3,
        help="interleaved passes; the table pools them (default 3)",
    )
    bench.add_argument(
        "--warmup", type=int, default=1, help="untimed runs per method first (default 1)"
    )
    bench.add_argument("--seed", type=int, default=0, help="default 0")
    bench.add_argument("--categories", action="store_true", help="print per-category rows too")
    bench.add_argument(
        "--out",
        default="bench-out",
        help="folder for bench.md, bench.json, plots (default bench-out)",
    )
    bench.set_defaults(func=cmd_bench, on_compute_thread=True)
    planner = sub.add_parser(
        "plan",
        help="choose a drafter's beams (ReDrafter) or tree (EAGLE, EAGLE-3) for this machine",
    )
    planner.add_argument(
        "--model", required=True, help="a bundled name (smollm2-135m), folder or .gguf"
    )
    planner.add_argument(
        "--drafter",
        default="redrafter",
        help="redrafter or eagle (the heads shipped for the model), or a checkpoint folder of "
        "redrafter, eagle or eagle3 (none ships for eagle3)",
    )
    planner.add_argument("--backend", default="torch", help="the backend it plans for")
    planner.add_argument(
        "--dtype", default=None, help="default: the fastest measured here, as generate"
    )
    planner.add_argument(
        "--prompts",
        default="mt-bench",
        help="mt-bench | humaneval | a JSONL file as bench takes (plan on prompts like your own)",
    )
    planner.add_argument(
        "--per-category", type=positive, default=1, help="first N prompts of each category"
    )
    planner.add_argument(
        "--limit", type=positive, default=None, help="then the first N prompts (a quick plan)"
    )
    planner.add_argument(
        "--widths", nargs="+", type=positive, default=[1, 2, 4, 8], help="beam widths W to try"
    )
    planner.add_argument(
        "--lengths", nargs="+", type=positive, default=[2, 3, 4, 5, 6], help="beam lengths L to try"
    )
    planner.add_argument(
        "--max-new-tokens", type=positive, default=64, help="tokens decoded per prompt and setting"
    )
    planner.add_argument(
        "--measure-top", type=int, default=3, help="run the best N for real and compare"
    )
    planner.add_argument(
        "--no-lookup",
        action="store_true",
        help="plan without the prompt-lookup beam (a tree drafter: else tried on and off)",
    )
    planner.add_argument(
        "--no-save",
        action="store_true",
        help="do not keep the recommendation (by default generate uses it when the call names "
        "no beams or tree settings; one measured while other work shared the machine, or on "
        "fewer than 8 prompts, is never kept; `specdec cache` lists the plans kept)",
    )
    planner.set_defaults(func=cmd_plan, on_compute_thread=True)
    tune = sub.add_parser(
        "tune", help="measure which dtype runs a model fastest on this machine (cached)"
    )
    tune.add_argument("--model", default="smollm2-135m")
    tune.add_argument("--backend", default=None)
    tune.add_argument("--device", default=None)
    tune.set_defaults(func=cmd_tune, on_compute_thread=True)
