"""Command line:
``specdec demo | generate | bench | plan | tune | train | cache | serve | plugins``."""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import warnings
from pathlib import Path

import specdec
from specdec import compute
from specdec.bench import load_prompt_set, parse_method, run_bench
from specdec.bench.planner import keep, measure, plan
from specdec.bench.trust import Measured, busy_line, impossible
from specdec.bench import tree_planner
from specdec.bench.tree_planner import plan_tree
from specdec.bench.prompts import PROMPT_SETS
from specdec.bench.report import markdown, write_outputs
from specdec.cli.cache import add_parser as add_cache_parser
from specdec.cli.export import add_parser as add_export_parsers
from specdec.cli.options import DRAFTER_HELP, drafter_options
from specdec.cli.serve import add_parser as add_serve_parser
from specdec.cli.teacher import add_parser as add_teacher_parser
from specdec.drafting.lookup import DEFAULT_DRAFT_LENGTH
from specdec.errors import InvalidInputError, SpecdecError, TrainingInterrupted, require
from specdec.generation.components import planned_options, resolve_drafter
from specdec.generation.loading import load_backend
from specdec.generation.resolve import resolve
from specdec.models.bundled import resolve_model
from specdec.models.files import parse_json
from specdec.plugins.loading import DISABLE_ENV, PluginWarning
from specdec.plugins.registry import default_registry, installed_distributions
from specdec.testing import make_random_drafter, make_random_model
from specdec.training.selfinstruct import check_mix
from specdec.tuning.dtype import architecture_key, dtype_cache_file, load_fastest
from specdec.tuning.exactness import configure, describe as describe_exactness


def _add_generation_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--backend", default=None, help="numpy | torch | mlx | any installed backend"
    )
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--temperature", type=float, default=0.0)
    parser.add_argument("--top-k", type=int, default=None)
    parser.add_argument("--top-p", type=float, default=None)
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument(
        "--dtype", default=None, help="default: the fastest measured on this machine (specdec tune)"
    )
    parser.add_argument("--device", default=None)
    _add_exact_arg(parser)
    parser.add_argument("--beam-width", type=int, default=None)
    parser.add_argument("--beam-length", type=int, default=None)
    parser.add_argument("--verifier", default=None)
    parser.add_argument(
        "--lookup",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="add a prompt-lookup beam (n-gram copy from the text so far) to the drafter's beams "
        "(default: on beside ReDrafter)",
    )
    parser.add_argument(
        "--lookup-length",
        type=int,
        default=None,
        metavar="N",
        help="tokens the prompt-lookup beam drafts, whatever the beam length (default 10; with "
        "--drafter lookup, the length of prompt lookup alone)",
    )


def _add_exact_arg(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--exact",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="exact mode: rows computed so that speculative output is bit-identical to plain "
        "decoding at any dtype (default: on where this machine's check holds; --exact "
        "insists, --no-exact turns it off)",
    )


def _common(args) -> dict:
    return dict(
        backend=args.backend,
        max_new_tokens=args.max_new_tokens,
        temperature=args.temperature,
        top_k=args.top_k,
        top_p=args.top_p,
        seed=args.seed,
        dtype=args.dtype,
        device=args.device,
        exact=args.exact,
    )


def _report(label: str, result, baseline_tps: float | None = None) -> str:
    stats = result.stats
    speed = f", {stats.tokens_per_second / baseline_tps:.2f}x plain" if baseline_tps else ""
    return (
        f"{label:>10}: {stats.new_tokens} tokens, {stats.tokens_per_step:.2f} tokens/step (bonus "
        f"token counted), {stats.tokens_per_second:.1f} tokens/s{speed}"
    )


def text_argument(value: str, flag: str) -> str:
    """A text option as given on the command line, after checking it was UTF-8: Python decodes
    other bytes of argv to lone surrogates (surrogateescape), which no tokenizer encodes."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        raw = value[: exc.start].encode("utf-8", "surrogateescape")
        byte = value[exc.start].encode("utf-8", "surrogateescape")
        raise InvalidInputError(
            f"{flag} is not UTF-8 text: byte 0x{byte.hex()} at byte {len(raw)} is not UTF-8; "
            "give the text in UTF-8 (a UTF-8 terminal or locale)"
        ) from None
    return value


def cmd_generate(args) -> int:
    if args.prompt is not None:
        prompt = text_argument(args.prompt, "--prompt")
    else:
        prompt = parse_json(
            args.prompt_ids,
            what=f"--prompt-ids {args.prompt_ids!r:.40}",
            fix="give a JSON list of token ids such as '[1, 2, 3]'",
            error=InvalidInputError,
        )
    if args.chat:
        if args.prompt is None:
            raise InvalidInputError(
                "--chat wraps a text prompt in the model's chat template; give --prompt TEXT, "
                "not --prompt-ids"
            )
        prompt = [{"role": "user", "content": args.prompt}]
    drafter, options = drafter_options(args)
    result = specdec.generate(args.model, prompt, drafter=drafter, **_common(args), **options)
    print(result.text if result.text is not None else result.tokens)
    print(_report(str(args.drafter), result), file=sys.stderr)
    return 0


def _demo_models(args, tmp: Path):
    """(model, {label: (drafter, options)}) for the demo: the bundled model and its shipped
    drafters, or with --random a small random model and untrained drafters. The first entry is
    the default path: ``generate``'s own defaults (ReDrafter with its prompt-lookup beam)."""
    if args.random:
        model = make_random_model(
            tmp / "model",
            vocab_size=512,
            hidden_size=64,
            num_layers=2,
            num_heads=4,
            num_kv_heads=2,
            seed=0,
            with_tokenizer=True,
        )
        redrafter = make_random_drafter(tmp / "redrafter", model, kind="redrafter", seed=1)
        medusa = make_random_drafter(tmp / "medusa", model, kind="medusa", seed=2)
    else:
        model, redrafter, medusa = args.model, "redrafter", "medusa"
    return model, {
        "default": (redrafter, {}),
        "redrafter": (redrafter, {"lookup": False}),
        "medusa": (medusa, {}),
    }


def _same_prefix(a: list, b: list) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def _describe_default(target, drafter, backend, registry) -> str:
    """How the default path drafts here: the beams and where they come from."""
    backend_obj = load_backend(backend, registry)
    named = resolve_drafter(drafter, backend_obj.name, {}, registry)
    if planned_options(backend_obj, target, named, {})[0]:
        where = "chosen by `specdec plan` on this machine"
    else:
        where = "the checkpoint's default; `specdec plan` chooses for this machine"
    plan = specdec.decode_plan(target, named, backend_obj, registry=registry)
    inner = getattr(plan.drafter, "inner", None) or plan.drafter
    lookup = (
        f" + a prompt-lookup beam of {plan.drafter.draft_length} tokens"
        if inner is not plan.drafter
        else ""
    )
    return f"ReDrafter W={inner.beam_width} L={inner.beam_length} ({where}){lookup}"


DEMO_PROMPTS = (
    "Explain in a few sentences why the sky is blue.",
    "Add type hints and a docstring to this Python function, and return the whole function:\n\n"
    "def moving_average(values, window):\n"
    "    result = []\n"
    "    for i in range(len(values) - window + 1):\n"
    "        result.append(sum(values[i:i + window]) / window)\n"
    "    return result",
)


def cmd_demo(args) -> int:
    """Answer chat prompts with the default path, each drafter and plain decoding, side by side:
    an open question (the text is new: little to draft) and an edit of code given in the prompt
    (the answer repeats it: much to draft), each reported, then both together."""
    args.prompt = [text_argument(p, "--prompt") for p in args.prompt or DEMO_PROMPTS]
    with tempfile.TemporaryDirectory() as tmp:
        model, drafters = _demo_models(args, Path(tmp))
        registry = default_registry()
        backend = args.backend or ("numpy" if args.random else None)
        backend = load_backend(backend, registry).name
        target = specdec.load(model, backend=backend, dtype=args.dtype, exact=args.exact)
        choice = getattr(target, "dtype_choice", None)
        methods = {"plain": ("none", {}), **drafters}

        def run(text, drafter, options, max_new_tokens=args.max_new_tokens):
            return specdec.generate(
                target,
                [{"role": "user", "content": text}],
                drafter=drafter,
                backend=backend,
                max_new_tokens=max_new_tokens,
                **options,
            )

        for drafter, options in methods.values():  # warm-up: first calls pay one-off costs
            run(args.prompt[0], drafter, options, max_new_tokens=4)
        label = (
            "random untrained drafters: expect no acceptance" if args.random else "shipped drafters"
        )
        print(f"model {model}, backend {backend}; {label}")
        print(f"dtype: {choice.describe() if choice else args.dtype}")
        print(describe_exactness(target))
        print(
            "default drafting: "
            f"{_describe_default(target, drafters['default'][0], backend, registry)}"
        )
        exact = bool(getattr(target, "exact", False)) or str(getattr(target, "dtype", "")).endswith(
            "float64"
        )
        status, totals = (
            0,
            {name: [0, 0.0] for name in methods},
        )  # new tokens, seconds (prefill included)
        clock = Measured()
        for text in args.prompt:
            runs: dict[str, list] = {}
            for _ in range(
                args.repeats
            ):  # plain and speculative decoding interleaved; the median is reported
                for name, (drafter, options) in methods.items():
                    with clock:
                        runs.setdefault(name, []).append(run(text, drafter, options))
            results = {name: _median(found) for name, found in runs.items()}
            plain = results["plain"]
            print(f"\nuser: {text}\nassistant: {results['default'].text}\n")
            for name, result in results.items():
                totals[name][0] += result.stats.new_tokens
                totals[name][1] += result.stats.time_total
                if name == "plain":
                    print(_report(name, result))
                    continue
                same = _same_prefix(result.tokens, plain.tokens)
                if result.tokens == plain.tokens:
                    note = f"identical to plain decoding: {same} of {len(plain.tokens)} tokens"
                elif exact:
                    note = f"DIFFERS from plain decoding after {same} of {len(plain.tokens)} tokens"
                    status = 1
                else:
                    note = (
                        f"identical to plain decoding: {same} of {len(plain.tokens)} tokens (exact "
                        "mode is off: tree and one-token forwards round differently)"
                    )
                print(_report(name, result, plain.stats.tokens_per_second) + f"; {note}")
        if len(args.prompt) > 1:
            rate = {name: tokens / seconds for name, (tokens, seconds) in totals.items()}
            print(
                f"\nall {len(args.prompt)} prompts: "
                + ", ".join(
                    f"{name} {rate[name]:.1f} tokens/s"
                    + ("" if name == "plain" else f" ({rate[name] / rate['plain']:.2f}x)")
                    for name in methods
                )
            )
        print(
            "(default: generate()'s defaults, ReDrafter with a prompt-lookup beam; redrafter: "
            "lookup=False)"
        )
        if busy_line(clock):
            print(busy_line(clock))
    return int(status)


def _median(results):
    """The run with the median decoding speed."""
    return sorted(results, key=lambda r: r.stats.tokens_per_second)[len(results) // 2]


def cmd_bench(args) -> int:
    """Run a benchmark grid and write bench.json, bench.md and plots to --out."""
    require("matplotlib", extra="bench", feature="specdec bench (its plots)")  # before any run
    Path(args.out).mkdir(
        parents=True, exist_ok=True
    )  # an unwritable --out fails before the runs, not after
    prompts = load_prompt_set(args.prompts, per_category=args.per_category)
    methods = [parse_method(m) for m in args.methods]
    clock = Measured()
    grid = [(item.partition(":")[0], item.partition(":")[2] or None) for item in args.backends]
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
    meta = dict(
        command=" ".join(sys.argv),
        versions=installed_distributions(),
        model=str(args.model),
        prompts=args.prompts,
        per_category=args.per_category,
        max_new_tokens=args.max_new_tokens,
        busy=busy_line(clock),
    )
    out = write_outputs(records, Path(args.out), meta=meta)
    print(markdown(out["summary"], categories=args.categories))
    if meta["busy"]:
        print(meta["busy"])
    print(f"wrote {args.out}/bench.json, bench.md, speedup.png, accepted.png", file=sys.stderr)
    return 0


def cmd_plan(args) -> int:
    """Predict the speedup of every beam configuration, recommend one, and check the best few;
    or, for a tree drafter, decode with its tree settings and recommend the fastest."""
    prompts = [p.prompt for p in load_prompt_set(args.prompts, per_category=args.per_category)]
    registry = default_registry()
    named = resolve("drafter", args.drafter, registry, args.backend)
    if named.spec is not None and named.spec.tree_options:
        return _plan_tree(args, prompts)
    lookup = not args.no_lookup
    clock = Measured()
    options = dict(backend=args.backend, dtype=args.dtype, max_new_tokens=args.max_new_tokens)
    rows = plan(
        args.model,
        args.drafter,
        prompts,
        widths=args.widths,
        lengths=args.lengths,
        lookup=lookup,
        clock=clock,
        progress=True,
        **options,
    )
    plausible = [r for r in rows if not r.impossible][: args.measure_top]
    checked = (
        measure(
            args.model,
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
    measured = {(r.beam_width, r.beam_length): r.measured_speedup for r in checked}
    print(
        "| W | L | tokens/step (est.) | tree size | draft ms | verify ms | predicted speedup | "
        "measured |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        m = measured.get((r.beam_width, r.beam_length))
        flag = " (impossible: above its tokens/step)" if r.impossible else ""
        print(
            f"| {r.beam_width} | {r.beam_length} | {r.tokens_per_step:.2f} | {r.tree_size:.1f} | "
            f"{r.draft_ms:.1f} | {r.verify_ms:.1f} | {r.predicted_speedup:.2f}x{flag} | "
            f"{'-' if m is None else f'{m:.2f}x'} |"
        )
    best = max(checked, key=lambda r: r.measured_speedup) if checked else rows[0]
    figure = (
        f"measured {best.measured_speedup:.2f}x, predicted {best.predicted_speedup:.2f}x"
        if best.measured_speedup is not None
        else f"predicted {best.predicted_speedup:.2f}x"
    )
    print(
        f"recommended: beam_width={best.beam_width} beam_length={best.beam_length} ({figure} over "
        "plain decoding, decode phase"
        f"{f', with the prompt-lookup beam of {DEFAULT_DRAFT_LENGTH} tokens' if lookup else ''})"
    )
    line = busy_line(clock)
    if line:
        print(line)
    if not args.no_save:
        reasons = keep(
            args.model,
            args.drafter,
            best,
            clock,
            backend=args.backend,
            dtype=args.dtype,
            lookup=lookup,
            prompts=len(prompts),
        )
        print(
            "saved: generate uses it for this drafter on this machine when no beams are given"
            if not reasons
            else f"not saved: {'; '.join(reasons)} (generate keeps what it used before)",
            file=sys.stderr,
        )
    if args.prompts in PROMPT_SETS:
        print(
            f"planned on the {args.prompts} prompts; the best beams depend on the text: for "
            "another kind of use (code, say) plan with --prompts FILE.jsonl of prompts like your "
            "own",
            file=sys.stderr,
        )
    return 0


def _plan_tree(args, prompts) -> int:
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
    )
    print("| settings | lookup | tokens/step | nodes/step | measured speedup |")
    print("|---|---|---|---|---|")
    for r in rows:
        settings = " ".join(f"{k}={v}" for k, v in sorted(r.options.items())) or "its defaults"
        flag = (
            " (impossible: above its tokens/step)"
            if impossible(r.speedup, r.tokens_per_step)
            else ""
        )
        print(
            f"| {settings} | {'yes' if r.lookup else 'no'} | {r.tokens_per_step:.2f} | "
            f"{r.nodes_per_step:.1f} | {r.speedup:.2f}x{flag} |"
        )
    best = rows[0]
    settings = " ".join(f"{k}={v}" for k, v in sorted(best.options.items())) or "its defaults"
    print(
        f"recommended: {settings}, lookup {'on' if best.lookup else 'off'} (measured "
        f"{best.speedup:.2f}x over plain decoding, decode phase, {len(rows)} settings decoded)"
    )
    line = busy_line(clock)
    if line:
        print(line)
    if not args.no_save:
        # the tree planner's own verdict (it saved, or not, by the same rule)
        reasons = tree_planner.reasons_not_to_keep(clock, best.speedup, best.tokens_per_step)
        print(
            "saved: generate uses it for this drafter on this machine when no tree settings "
            "are given"
            if not reasons
            else f"not saved: {'; '.join(reasons)} (generate keeps what it used before)",
            file=sys.stderr,
        )
    return 0


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

    arch = architecture_key(resolve_model(args.model))
    if arch is not None and choice.timings:
        print(f"kept in {dtype_cache_file(backend, args.device, arch)}", file=sys.stderr)
    return 0


def cmd_plugins(args) -> int:
    rows = default_registry().describe()
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    for kind in ("backend", "drafter", "tree_builder", "verifier"):
        print(f"{kind.replace('_', ' ')}s:")
        for row in (r for r in rows if r["kind"] == kind):
            backend = "" if row["backend"] is None else f" [{row['backend']}]"
            flag = "" if row["lossless"] is None else (" lossless" if row["lossless"] else " LOSSY")
            conflict = "  CONFLICT: registered by another plugin too" if row["conflict"] else ""
            missing = f"  NOT INSTALLED: {row['install']}" if row.get("install") else ""
            print(
                f"  {row['name']}{backend}{flag}  ({row['package']}, plugin "
                f"{row['plugin']}){conflict}{missing}"
            )
    for kind in ("broken", "disabled"):
        listed = [r for r in rows if r["kind"] == kind]
        if listed:
            print(f"{kind} plugins:")
        for row in listed:
            why = "" if kind == "disabled" else f": {row['error']}"
            print(f"  {row['name']}  ({row['package']}){why}")
    return 0


def _parse_mix(text: str | None):
    """``--prompt-mix``: None (the default mix), or (kind, share) pairs."""
    if text is None:
        return None
    if text.strip() == "corpus":
        return ()
    pairs = []
    for item in text.split(","):
        kind, _, share = item.partition("=")
        try:
            pairs.append((kind.strip(), float(share)))
        except ValueError:
            raise InvalidInputError(
                f"--prompt-mix takes kind=share pairs, e.g. corpus=0.3,general=0.5,plain=0.2; "
                f"got {text!r}"
            ) from None
    try:
        check_mix(pairs)
    except InvalidInputError as exc:
        raise InvalidInputError(f"--prompt-mix {text!r}: {exc}") from None
    return tuple(pairs)


def cmd_train(args) -> int:
    """Distil a drafter for a model (``specdec.training``); prints held-out tokens per step."""
    if args.backend != "torch":
        raise InvalidInputError(
            f"training runs on the torch backend only, got --backend {args.backend!r}"
        )
    if args.steps is None and args.minutes is None:
        raise InvalidInputError("give a training budget: --minutes N or --steps N")
    require("torch", extra="train", feature="specdec train")
    require("transformers", extra="train", feature="specdec train")
    decoding = {
        "--prompts": args.prompts,
        "--heldout-prompts": args.heldout_prompts,
        "--prompt-text-prompts": args.prompt_text_prompts,
        "--prompt-mix": args.prompt_mix,
        "--max-new-tokens": args.max_new_tokens,
    }
    given = [flag for flag, value in decoding.items() if value is not None]
    if args.data and given:
        raise InvalidInputError(
            f"--data learns from the sequences given, and {', '.join(given)} set(s) how prompts "
            "are decoded instead: give one or the other"
        )
    if not args.data and (args.heldout_sequences is not None or args.max_positions is not None):
        raise InvalidInputError(
            "--heldout-sequences and --max-positions apply to --data FILE (sequences to learn from)"
        )
    options = dict(
        steps=args.steps,
        minutes=args.minutes,
        prompts=640 if args.prompts is None else args.prompts,
        heldout_prompts=64 if args.heldout_prompts is None else args.heldout_prompts,
        max_new_tokens=128 if args.max_new_tokens is None else args.max_new_tokens,
        batch_size=args.batch_size,
        lr=args.lr,
        teacher_dtype=args.teacher_dtype,
        teacher_batch_size=args.teacher_batch_size,
        prompt_mix=_parse_mix(args.prompt_mix),
        weight_decay=args.weight_decay,
        seed=args.seed,
        resume=args.resume,
        overwrite=args.overwrite,
        allow_changes=args.allow_changes,
        threads=args.threads,
        save_dtype=args.save_dtype,
        bf16=args.bf16,
        negatives=args.negatives or None,
        prompt_text_prompts=(
            0
            if args.data
            else 1024
            if args.prompt_text_prompts is None
            else args.prompt_text_prompts
        ),
        **(
            {
                "data": args.data,
                "heldout_sequences": 64
                if args.heldout_sequences is None
                else args.heldout_sequences,
                "max_positions": args.max_positions,
            }
            if args.data
            else {}
        ),
        shortlist=(args.spec.default_shortlist if args.shortlist is None else args.shortlist),
        keep_init_shortlist=args.shortlist is None,
        init=args.init,
        progress=not args.quiet,
    )
    options.update({option.dest: getattr(args, option.dest) for option in args.spec.train_options})
    report = args.spec.train(args.model, args.out, **options)
    for row in report["history"]:
        print(
            f"step {row['step']:>6}  {row['minutes']:7.2f} min  loss {row['loss']:.3f}  held-out "
            f"{row['tokens_per_step']:.2f} tokens/step (bonus token counted)"
        )
    print(f"saved {args.drafter} drafter to {args.out}", file=sys.stderr)
    return 0


def _add_train_parser(train: argparse.ArgumentParser, spec) -> None:
    """The options of ``specdec train NAME``: the common ones, then the drafter spec's own."""
    train.add_argument(
        "--model", required=True, help="a bundled name (smollm2-135m) or a model folder"
    )
    train.add_argument("--backend", default="torch", help="torch (the only training backend)")
    train.add_argument(
        "--out", required=True, help="checkpoint folder (config.json, model.safetensors, state)"
    )
    train.add_argument("--minutes", type=float, default=None, help="training-time budget")
    train.add_argument("--steps", type=int, default=None, help="optimiser-step budget")
    train.add_argument(
        "--resume",
        action="store_true",
        help="continue the run saved in --out (trainer_state.safetensors)",
    )
    train.add_argument(
        "--overwrite",
        action="store_true",
        help="start again in a non-empty --out, replacing the run (or the files) there",
    )
    train.add_argument(
        "--allow-changes",
        action="store_true",
        help="with --resume: accept settings that differ from the saved run's (both are recorded)",
    )
    train.add_argument(
        "--data",
        action="append",
        default=None,
        metavar="FILE",
        help="learn from these sequences instead of decoding prompts (repeatable): .npz token "
        "sequences (tokens, prompt_lengths, response_lengths; what `specdec teacher` writes) or "
        ".jsonl chats ({\"messages\": [...]} per line, e.g. a service's logs); one "
        "teacher-forced forward per sequence, answer positions only, cached with resume",
    )
    train.add_argument(
        "--heldout-sequences",
        type=int,
        default=None,
        help="with --data: sequences held out for evaluation (default 64)",
    )
    train.add_argument(
        "--max-positions",
        type=int,
        default=None,
        help="with --data: train on the first sequences up to this many answer positions "
        "(default: all)",
    )
    train.add_argument(
        "--prompts",
        type=int,
        default=None,
        help="training prompts decoded for the teacher data (default 640)",
    )
    train.add_argument(
        "--heldout-prompts",
        type=int,
        default=None,
        help="held-out prompts (same prompt mix, documents and topics no training prompt uses; "
        "default 64)",
    )
    train.add_argument(
        "--prompt-text-prompts",
        type=int,
        default=None,
        help="more prompts whose prompt text (teacher-forced) and first 16 tokens are training "
        "data (default 1024)",
    )
    train.add_argument(
        "--max-new-tokens",
        type=int,
        default=None,
        help="teacher continuation length (default 128)",
    )
    train.add_argument("--batch-size", type=int, default=64, help="positions per optimiser step")
    train.add_argument(
        "--teacher-dtype",
        default=None,
        help="dtype the target decodes the teacher data in (default: the fastest on this machine)",
    )
    train.add_argument(
        "--teacher-batch-size",
        type=int,
        default=64,
        help="prompts the teacher decodes at once (request slots, batched in flight)",
    )
    train.add_argument(
        "--prompt-mix",
        default=None,
        help="shares of the decoded prompts as KIND=SHARE pairs (kinds corpus, self_instruct, "
        "general, plain; kinds left out get none, shares are normalised), e.g. "
        "corpus=0.3,self_instruct=0.15,general=0.35,plain=0.2 (the default) or general=1; "
        "'corpus' alone for the corpus's chat requests",
    )
    train.add_argument("--lr", type=float, default=1e-3)
    train.add_argument(
        "--weight-decay", type=float, default=0.0, help="AdamW decoupled weight decay"
    )
    train.add_argument("--seed", type=int, default=0)
    train.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    train.add_argument("--save-dtype", default="float32", choices=("float32", "float16"))
    train.add_argument("--bf16", action="store_true", help="bfloat16 autocast for the drafter")
    train.add_argument(
        "--negatives",
        type=int,
        default=4096,
        help="sampled-softmax loss: label tokens plus N sampled tokens instead of all (0: all)",
    )
    train.add_argument(
        "--shortlist",
        type=int,
        default=None,
        help="draft only the N token ids with the most teacher mass (0: all; default "
        f"{spec.default_shortlist})"
        if spec.takes_shortlist
        else argparse.SUPPRESS,  # still parsed: training refuses it, naming the drafter's option
    )
    train.add_argument(
        "--init",
        default=None,
        help="start from this checkpoint's weights (and its shortlist, unless --shortlist is "
        "given), e.g. the shipped drafter"
        if spec.takes_shortlist
        else "start from this checkpoint's weights, e.g. the shipped drafter",
    )
    train.add_argument("--quiet", action="store_true", help="no progress bars")
    for option in spec.train_options:
        train.add_argument(option.flag, type=option.type, default=option.default, help=option.help)
    train.set_defaults(func=cmd_train, spec=spec)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="specdec", description="Speculative decoding with pluggable backends."
    )
    parser.add_argument("--debug", action="store_true", help="show the full traceback of an error")
    parser.add_argument(
        "--disable-plugin",
        action="append",
        default=[],
        metavar="NAME",
        help="do not load this installed plugin (entry-point or distribution name); repeatable, "
        "added to SPECDEC_DISABLE_PLUGINS",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser(
        "demo", help="answer a prompt with each drafter and with plain decoding, side by side"
    )
    demo.add_argument("--model", default="smollm2-135m")
    demo.add_argument("--backend", default=None, help="default: torch when installed, else numpy")
    demo.add_argument("--dtype", default=None)
    _add_exact_arg(demo)
    demo.add_argument(
        "--prompt",
        action="append",
        default=None,
        help="a chat prompt (repeatable); default: an open question and a code edit",
    )
    demo.add_argument("--max-new-tokens", type=int, default=128)
    demo.add_argument(
        "--random", action="store_true", help="a small random model and untrained drafters instead"
    )
    demo.add_argument(
        "--repeats", type=int, default=3, help="interleaved runs of each method; medians reported"
    )
    demo.set_defaults(func=cmd_demo)
    gen = sub.add_parser("generate", help="generate from a model folder")
    gen.add_argument("--model", required=True)
    group = gen.add_mutually_exclusive_group(required=True)
    group.add_argument(
        "--prompt", help="text the model continues as it is (with --chat: one user turn)"
    )
    group.add_argument("--prompt-ids", help="JSON list of token ids")
    gen.add_argument(
        "--chat",
        action="store_true",
        help="send --prompt as a user turn of the model's chat template (as the demo and bench do)",
    )
    gen.add_argument(
        "--drafter", default="redrafter", metavar="NAME[:key=value,...]", help=DRAFTER_HELP
    )
    _add_generation_args(gen)
    gen.set_defaults(func=cmd_generate)
    bench = sub.add_parser("bench", help="measure methods side by side on a prompt set")
    bench.add_argument(
        "--model", required=True, help="a bundled name (smollm2-135m), folder or .gguf"
    )
    bench.add_argument("--prompts", default="mt-bench", help="mt-bench | humaneval | a JSONL file")
    bench.add_argument(
        "--per-category", type=int, default=None, help="first N prompts of each category"
    )
    bench.add_argument(
        "--methods",
        nargs="+",
        default=["plain", "redrafter", "medusa"],
        help="plain; any installed drafter by name with its options (redrafter[:w=4,l=5,"
        "lookup=true], medusa[:choices=cpu16], eagle[:total_tokens=8], draft_model:draft=M, "
        "lookup[:k=10]) and checkpoints (eagle3:drafter=runs/e3,total_tokens=16), "
        "third-party drafters too (`specdec plugins` lists them); peers: hf, hf-pld[:n=10], "
        "hf-assisted:draft=M, mlx-lm, mlx-lm-draft:draft=M (docs: benchmarks/README.md)",
    )
    bench.add_argument(
        "--backends",
        nargs="+",
        default=["torch"],
        help="backend[:dtype] ... (no dtype: the one measured fastest here, as generate)",
    )
    bench.add_argument("--temperatures", nargs="+", type=float, default=[0.0])
    bench.add_argument("--max-new-tokens", type=int, default=128)
    bench.add_argument("--repeats", type=int, default=3)
    bench.add_argument("--warmup", type=int, default=1)
    bench.add_argument("--seed", type=int, default=0)
    bench.add_argument("--categories", action="store_true", help="print per-category rows too")
    bench.add_argument("--out", default="bench-out")
    bench.set_defaults(func=cmd_bench)
    planner = sub.add_parser(
        "plan",
        help="choose a drafter's beams (ReDrafter) or tree (EAGLE, EAGLE-3) for this machine",
    )
    planner.add_argument("--model", required=True)
    planner.add_argument(
        "--drafter",
        default="redrafter",
        help="redrafter, eagle, eagle3 (the shipped ones) or a checkpoint folder",
    )
    planner.add_argument("--backend", default="torch")
    planner.add_argument("--dtype", default=None)
    planner.add_argument("--prompts", default="mt-bench")
    planner.add_argument("--per-category", type=int, default=1)
    planner.add_argument("--widths", nargs="+", type=int, default=[1, 2, 4, 8])
    planner.add_argument("--lengths", nargs="+", type=int, default=[2, 3, 4, 5, 6])
    planner.add_argument("--max-new-tokens", type=int, default=64)
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
        help="do not keep the recommendation (by default generate uses it when no beams are given)",
    )
    planner.set_defaults(func=cmd_plan)
    tune = sub.add_parser(
        "tune", help="measure which dtype runs a model fastest on this machine (cached)"
    )
    tune.add_argument("--model", default="smollm2-135m")
    tune.add_argument("--backend", default=None)
    tune.add_argument("--device", default=None)
    tune.set_defaults(func=cmd_tune)
    trainable = [spec for spec in default_registry().drafter_specs() if spec.train is not None]
    train_sub = sub.add_parser(
        "train", help="distil a drafter from a model (needs specdec[train])"
    ).add_subparsers(
        dest="drafter",
        required=True,
        metavar="DRAFTER",
        help=", ".join(spec.name for spec in trainable),
    )
    for spec in trainable:
        _add_train_parser(
            train_sub.add_parser(spec.name, help=f"distil a {spec.name} drafter"), spec
        )
    add_cache_parser(sub)
    add_export_parsers(sub)
    add_serve_parser(sub)
    add_teacher_parser(sub)
    plugins = sub.add_parser(
        "plugins", help="list installed backends, drafters, tree builders and verifiers"
    )
    plugins.add_argument("--json", action="store_true")
    plugins.set_defaults(func=cmd_plugins)
    return parser


def main(argv=None) -> int:
    """Run a command; every expected failure is one line on stderr and a non-zero exit
    (``--debug`` re-raises it with its traceback)."""
    _show_plugin_warnings()
    early = argparse.ArgumentParser(add_help=False)  # plugins are loaded while the parser is built
    early.add_argument("--disable-plugin", action="append", default=[])
    early.add_argument("--debug", action="store_true")
    known = early.parse_known_args(argv)[0]
    _disable_plugins(known.disable_plugin)
    try:
        parser = build_parser()
    except SpecdecError as exc:  # two plugins for one drafter spec
        if known.debug:
            raise
        print(f"specdec: error: {one_line(exc)}", file=sys.stderr)
        return 2
    args = parser.parse_args(argv)
    try:
        if args.func in (
            cmd_demo,
            cmd_generate,
            cmd_bench,
            cmd_plan,
            cmd_tune,
        ):  # one OpenMP team: specdec.compute
            return compute.run(args.func, args)
        return args.func(args)
    except BrokenPipeError:  # `specdec plugins | head`: the reader left, which is not an error
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except TrainingInterrupted as exc:
        if args.debug:
            raise
        print(f"specdec: {exc}", file=sys.stderr)
        return 130
    except KeyboardInterrupt:
        if args.debug:
            raise
        print("specdec: interrupted", file=sys.stderr)
        return 130
    except (SpecdecError, OSError, MemoryError) as exc:
        if args.debug:
            raise
        print(f"specdec: error: {one_line(exc)} (--debug shows the traceback)", file=sys.stderr)
        return 2


def _disable_plugins(names: list[str]) -> None:
    """--disable-plugin: added to SPECDEC_DISABLE_PLUGINS, so that child processes agree."""
    if names:
        os.environ[DISABLE_ENV] = ",".join(filter(None, [os.environ.get(DISABLE_ENV, ""), *names]))
        default_registry.cache_clear()


def _show_plugin_warnings() -> None:
    """A skipped plugin is reported as one line on stderr, like every other message of the CLI."""
    shown = warnings.showwarning

    def show(message, category, filename, lineno, file=None, line=None):
        if issubclass(category, PluginWarning):
            print(f"specdec: warning: {message}", file=sys.stderr)
        else:
            shown(message, category, filename, lineno, file, line)

    warnings.showwarning = show


def one_line(exc: BaseException) -> str:
    """The error's message on one line; an OSError names its file and what went wrong."""
    if isinstance(exc, OSError) and not isinstance(exc, SpecdecError) and exc.strerror:
        where = f"{exc.filename}: " if exc.filename else ""
        return f"{where}{exc.strerror}"
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text


if __name__ == "__main__":
    sys.exit(main())
