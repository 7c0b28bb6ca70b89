"""``specdec generate`` and ``specdec demo``."""

from __future__ import annotations

import importlib.util

import re
import sys
import tempfile
from collections import Counter
from pathlib import Path

import specdec
from specdec.bench.report import busy_mark, impossible_mark, plain_notes
from specdec.bench.trust import QUIET_LINE, SLOW_PLAIN, Measured, busy_note
from specdec.cli.common import (
    add_exact_arg,
    add_generation_args,
    generation_kwargs,
    numpy_fallback_note,
    report_line,
    text_argument,
)
from specdec.cli.options import DRAFTER_HELP, drafter_options
from specdec.errors import InvalidInputError, install_command
from specdec.generation.api import begin, collect
from specdec.generation.loading import load_backend
from specdec.models.files import parse_json
from specdec.plugins.registry import default_registry
from specdec.testing import make_random_drafter, make_random_model
from specdec.tuning.exactness import describe as describe_exactness
from specdec.tuning.machine import cores, cpu_class


def cmd_generate(args) -> int:
    if args.prompt is not None:
        prompt = text_argument(args.prompt, "--prompt")
    elif re.fullmatch(r"\s*\d+(\s*,\s*\d+)*\s*", args.prompt_ids):  # 1,2,3
        prompt = [int(t) for t in args.prompt_ids.split(",")]
    else:
        prompt = parse_json(
            args.prompt_ids,
            what=f"--prompt-ids {args.prompt_ids!r:.40}",
            fix="give token ids as 1,2,3 or a JSON list such as '[1, 2, 3]'",
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
    fallback = numpy_fallback_note(args.backend)
    if fallback:
        print(fallback, file=sys.stderr, flush=True)
    settings = generation_kwargs(args)
    steps, size, batched, tokenizer, plan = begin(
        args.model,
        prompt,
        drafter,
        settings.pop("backend"),
        registry=None,
        options=options,
        **settings,
    )
    print(_setup_line(plan, drafter), file=sys.stderr, flush=True)
    result = collect(steps, size, batched=batched, tokenizer=tokenizer)
    print(result.text if result.text is not None else result.tokens)
    print(report_line(str(args.drafter), result), file=sys.stderr)
    if str(args.drafter) != "none":  # what speculation (auto by default) chose
        print(f"{'':>10}  {result.stats.describe_speculation()}", file=sys.stderr)
    ended_at_once = result.stats.new_tokens <= 1 < args.max_new_tokens
    if ended_at_once and not args.chat and args.prompt is not None:
        print(
            "note: the model ended at once; an instruct model answers a chat: add --chat to wrap "
            "the prompt in its chat template",
            file=sys.stderr,
        )
    return 0


def _demo_models(args, tmp: Path):
    """(model, {label: (drafter, options)}) for the demo: the bundled model and its shipped
    drafters (ReDrafter, EAGLE, Medusa) and prompt lookup (with the model's answer store), or with
    --random a small random model and untrained drafters. The first entry is
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
        eagle = make_random_drafter(tmp / "eagle", model, kind="eagle", seed=3)
    else:
        model, redrafter, medusa, eagle = args.model, "redrafter", "medusa", "eagle"
    return model, {
        "default": (redrafter, {}),
        "redrafter:lookup=false": (redrafter, {"lookup": False}),
        "eagle": (eagle, {}),
        "medusa": (medusa, {}),
        "lookup": ("lookup", {}),
    }


def _same_prefix(a: list, b: list) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


DTYPE_SOURCES = {
    "measured": "measured fastest here",
    "cached": "measured fastest here earlier",
    "only candidate": "the backend's only one here",
    "$SPECDEC_DTYPE": "from $SPECDEC_DTYPE",
}


def _setup_line(plan, drafter) -> str:
    """What ``specdec generate`` decodes with: the dtype and why, exact mode, and the drafter
    with its beams, saying when a plan ``specdec plan`` kept chose them."""
    target = plan.target
    choice = getattr(target, "dtype_choice", None)
    if choice is None or choice.source == "the backend's default":
        dtype = f"the {plan.backend.name} backend's own dtype"
    else:
        dtype = f"dtype {choice.dtype} ({DTYPE_SOURCES.get(choice.source, choice.source)})"
    line = f"specdec: {dtype}; {describe_exactness(target)}"
    if drafter == "none":
        return line
    return f"{line}\nspecdec: {plan.describe_drafter()}" + (
        "; its settings chosen by `specdec plan` here (`specdec cache` lists it)"
        if plan.planned
        else ""
    )


def _describe_default(target, drafter, backend, registry) -> str:
    """How the default path drafts here: the beams and where they come from."""
    plan = specdec.decode_plan(target, drafter, load_backend(backend, registry), registry=registry)
    if plan.planned:
        where = "chosen by `specdec plan` on this machine"
    else:
        where = "the checkpoint's default; `specdec plan` chooses for this machine"
    inner = getattr(plan.drafter, "inner", None) or plan.drafter
    lookup = (
        f" + a prompt-lookup beam of {plan.drafter.draft_length} tokens"
        + (" (with the answer store)" if plan.drafter.store is not None else " (no answer store)")
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
        width = max(map(len, methods))  # the labels, right-aligned

        def run(text, drafter, options, max_new_tokens=args.max_new_tokens):
            return specdec.generate(
                target,
                [{"role": "user", "content": text}],
                drafter=drafter,
                backend=backend,
                max_new_tokens=max_new_tokens,
                **options,
            )

        label = (
            "random untrained drafters: expect no acceptance" if args.random else "shipped drafters"
        )
        print(f"model {model}, backend {backend}; {label}")
        cpu = cpu_class()
        if cpu:  # the README's figures name their machines so
            print(f"cpu: {cores()} cores, {cpu}")
        print(f"dtype: {choice.describe() if choice else args.dtype}")
        print(describe_exactness(target))
        print(
            "default drafting: "
            f"{_describe_default(target, drafters['default'][0], backend, registry)}",
            flush=True,
        )
        for drafter, options in methods.values():  # warm-up: first calls pay one-off costs
            run(args.prompt[0], drafter, options, max_new_tokens=4)
        exact = bool(getattr(target, "exact", False)) or str(getattr(target, "dtype", "")).endswith(
            "float64"
        )
        # new tokens, seconds (prefill included)
        status, totals, spoilt = 0, {name: [0, 0.0] for name in methods}, 0
        hinted = False  # a note said why a method decoded plainly: the bench command follows
        impossible_in: set[str] = set()  # methods with a row above its tokens/step
        clock = Measured()
        for number, text in enumerate(args.prompt, 1):
            print(
                f"prompt {number} of {len(args.prompt)}: {len(methods)} methods, "
                f"{args.repeats} run{'s' if args.repeats > 1 else ''} each, interleaved ...",
                file=sys.stderr,
                flush=True,
            )
            runs: dict[str, list] = {}
            slowed = dict.fromkeys(methods, 0)  # runs that other work slowed (each its own clock)
            # plain and speculative decoding interleaved; the median is reported
            for _ in range(args.repeats):
                for name, (drafter, options) in methods.items():
                    with clock, Measured() as own:
                        runs.setdefault(name, []).append(run(text, drafter, options))
                    slowed[name] += not own.quiet
            results = {name: _median(found) for name, found in runs.items()}
            plain = results["plain"]
            steps = {name: Counter() for name in methods}  # decode steps, plain ones by reason
            print(f"\nuser: {text}\nassistant: {results['default'].text}\n", flush=True)
            for name, result in results.items():
                totals[name][0] += result.stats.new_tokens
                totals[name][1] += result.stats.time_total
                steps[name].update(result.stats.plain_reasons)
                steps[name]["decode steps"] += result.stats.decode_row_steps
                flags = _flags(result, plain, slowed[name], args.repeats)
                spoilt += slowed[name]
                if "impossible" in flags:
                    impossible_in.add(name)
                if name == "plain":
                    print(report_line(name.rjust(width), result, counted=False) + flags)
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
                line = report_line(
                    name.rjust(width), result, plain.stats.tokens_per_second, counted=False
                )
                stats = result.stats  # what speculation="auto" chose for this answer
                drafted = f"drafted in {stats.drafting_row_steps} of {stats.decode_row_steps} steps"
                print(f"{line}{flags}; {drafted}; {note}", flush=True)
            # why a method decoded this prompt's steps plainly, under its own lines (over both
            # prompts, a method fastest on one read as losing: its plain steps were the other's)
            for line in _plain_notes(steps, backend):
                print(line)
                hinted = True
        if len(args.prompt) > 1:
            rate = {name: tokens / seconds for name, (tokens, seconds) in totals.items()}
            print(
                f"\nall {len(args.prompt)} prompts: "
                + ", ".join(
                    f"{name} {rate[name]:.1f} tokens/s"
                    + ("" if name == "plain" else f" ({rate[name] / rate['plain']:.2f}x")
                    + (", lifted by a row marked impossible" if name in impossible_in else "")
                    + ("" if name == "plain" else ")")
                    for name in methods
                )
            )
        if impossible_in:
            print(IMPOSSIBLE_NOTE + ("" if args.repeats > 1 else REPEATS_HINT))
        print(
            "(default: generate()'s defaults, ReDrafter with a prompt-lookup beam; "
            "redrafter:lookup=false: the same without it; lookup: prompt lookup alone, continued "
            "from the model's answer store where one ships; tokens/step counts the bonus token)"
        )
        note = busy_note(clock, spoilt, len(args.prompt) * len(methods) * args.repeats)
        print(note or QUIET_LINE)  # as bench and plan say it: silence read as "not checked"
        if hinted and not args.random:
            print(_bench_hint(backend, args.model, args.max_new_tokens))
    return int(status)


IMPOSSIBLE_NOTE = (
    "note: a row marked impossible ran faster than its tokens/step allow (a drafting step costs "
    f"at least a plain one): plain decoding's run of that prompt ran slow ({SLOW_PLAIN}), and "
    "the totals over it are lifted too"
)
REPEATS_HINT = "; --repeats 3 (the default) reports each method's median run"


def _plain_notes(steps: dict, backend: str) -> list[str]:
    """bench's note for each method that decoded most of a prompt's steps plainly, and why (the
    demo's lines said "drafted in 7 of 80 steps", and nothing of why)."""
    rows = []
    for name, counts in steps.items():
        total = counts.pop("decode steps", 0)
        if name == "plain" or not total:
            continue
        rows.append(
            dict(
                method=name,
                backend=backend,
                temperature=0.0,
                category="all",
                plain_reasons=dict(counts),
                plain_step_share=sum(counts.values()) / total,
            )
        )
    return plain_notes(rows, hint=False)  # the demo's labels are not bench's methods


def _bench_hint(backend: str, model: str, tokens: int) -> str:
    """The bench command that shows what drafting every step gives on ``model``, over a prompt
    of each MT-Bench category (the first four prompts were all of one, the least predictable:
    writing), with answers as long as the demo's (a run shape compares only with its own); the
    bench extra's install line where bench cannot run yet."""
    missing = importlib.util.find_spec("matplotlib") is None
    needs = f"; bench needs the bench extra: {install_command('bench')}" if missing else ""
    return (
        "note: two prompts say little; over a prompt of each kind, and what drafting every step "
        f"gives on this machine: specdec bench --model {model} --per-category 1 --max-new-tokens "
        f"{tokens} --repeats 1 --methods plain redrafter redrafter:speculation=always --backends "
        f"{backend} (docs/bench.md{needs})"
    )


def _flags(result, plain, slowed: int, repeats: int) -> str:
    """A method's marks, bench's table's own (``specdec.bench.report``): runs that other work
    slowed, and a speedup above the tokens per step it rests on (a drafting step costs at least
    a plain one: plain decoding was slowed)."""
    stats = result.stats
    row = dict(
        busy_runs=slowed,
        runs=repeats,
        speedup=stats.tokens_per_second / max(plain.stats.tokens_per_second, 1e-9),
        tokens_per_step=stats.tokens_per_step,
    )
    return busy_mark(row) + impossible_mark(row)


def _median(results):
    """The run with the median decoding speed."""
    return sorted(results, key=lambda r: r.stats.tokens_per_second)[len(results) // 2]


def add_parsers(sub) -> None:
    demo = sub.add_parser(
        "demo",
        help="answer two chat prompts (or your own) with each drafter and with plain decoding, "
        "side by side",
    )
    demo.add_argument(
        "--model",
        default="smollm2-135m",
        help="a bundled name, folder or .gguf (default %(default)s)",
    )
    demo.add_argument(
        "--backend",
        default=None,
        help="default: torch when installed, else numpy; with --random numpy, the reference "
        "(the small model decodes as fast there)",
    )
    demo.add_argument("--dtype", default=None, help="default: the fastest measured on this machine")
    add_exact_arg(demo)
    demo.add_argument(
        "--prompt",
        action="append",
        default=None,
        help="a chat prompt (repeatable); default: an open question and a code edit",
    )
    demo.add_argument(
        "--max-new-tokens", type=int, default=128, help="per prompt (default %(default)s)"
    )
    demo.add_argument(
        "--random", action="store_true", help="a small random model and untrained drafters instead"
    )
    demo.add_argument(
        "--repeats",
        type=int,
        default=3,
        help="interleaved runs of each method; medians reported (default %(default)s)",
    )
    demo.set_defaults(func=cmd_demo, on_compute_thread=True)
    gen = sub.add_parser(
        "generate", help="generate from a model (a bundled name, a folder or a .gguf file)"
    )
    gen.add_argument(
        "--model", required=True, help="a bundled name (smollm2-135m), a model folder or a .gguf"
    )
    group = gen.add_mutually_exclusive_group(required=True)
    group.add_argument(
        "--prompt", help="text the model continues as it is (with --chat: one user turn)"
    )
    group.add_argument("--prompt-ids", help="token ids: 1,2,3 or a JSON list [1, 2, 3]")
    gen.add_argument(
        "--chat",
        action="store_true",
        help="send --prompt as a user turn of the model's chat template (as the demo and bench do)",
    )
    gen.add_argument(
        "--drafter", default="redrafter", metavar="NAME[:key=value,...]", help=DRAFTER_HELP
    )
    add_generation_args(gen)
    gen.set_defaults(func=cmd_generate, on_compute_thread=True)
