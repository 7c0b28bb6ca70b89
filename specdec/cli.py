"""Command line: ``specdec demo | generate | bench | plan | train | cache | plugins``."""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

from specdec.errors import SpecdecError


def _add_generation_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--backend", default=None, help="numpy | torch | mlx | any installed backend")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--temperature", type=float, default=0.0)
    parser.add_argument("--top-k", type=int, default=None)
    parser.add_argument("--top-p", type=float, default=None)
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--dtype", default=None)
    parser.add_argument("--device", default=None)
    parser.add_argument("--beam-width", type=int, default=None)
    parser.add_argument("--beam-length", type=int, default=None)
    parser.add_argument("--verifier", default=None)
    parser.add_argument("--lookup", action="store_true",
                        help="add a prompt-lookup beam (n-gram copy from the text so far) to the drafter's beams")


def _options(args) -> dict:
    options = {"lookup": True} if args.lookup else {}
    if args.beam_width is not None:
        options["beam_width"] = args.beam_width
    if args.beam_length is not None:
        options["beam_length"] = args.beam_length
    if args.verifier is not None:
        options["verifier"] = args.verifier
    return options


def _common(args) -> dict:
    return dict(
        backend=args.backend, max_new_tokens=args.max_new_tokens, temperature=args.temperature, top_k=args.top_k,
        top_p=args.top_p, seed=args.seed, dtype=args.dtype, device=args.device,
    )


def _report(label: str, result, baseline_tps: float | None = None) -> str:
    stats = result.stats
    speed = f", {stats.tokens_per_second / baseline_tps:.2f}x plain" if baseline_tps else ""
    return (
        f"{label:>10}: {stats.new_tokens} tokens, {stats.tokens_per_step:.2f} tokens/step (bonus token counted), "
        f"{stats.tokens_per_second:.1f} tokens/s{speed}"
    )


def cmd_generate(args) -> int:
    import specdec

    from specdec.errors import InvalidInputError

    try:
        prompt = args.prompt if args.prompt is not None else json.loads(args.prompt_ids)
    except json.JSONDecodeError as exc:
        raise InvalidInputError(f"--prompt-ids must be a JSON list of token ids such as '[1, 2, 3]', got "
                                f"{args.prompt_ids!r} ({exc})") from None
    result = specdec.generate(args.model, prompt, drafter=args.drafter, **_common(args), **_options(args))
    print(result.text if result.text is not None else result.tokens)
    print(_report(str(args.drafter), result), file=sys.stderr)
    return 0


def _demo_models(args, tmp: Path):
    """(model, {label: (drafter, options)}) for the demo: the bundled model and its shipped
    drafters, or with --random a small random model and untrained drafters."""
    if args.random:
        from specdec.testing import make_random_drafter, make_random_model

        model = make_random_model(tmp / "model", vocab_size=512, hidden_size=64, num_layers=2, num_heads=4,
                                  num_kv_heads=2, seed=0, with_tokenizer=True)
        redrafter = make_random_drafter(tmp / "redrafter", model, kind="redrafter", seed=1)
        medusa = make_random_drafter(tmp / "medusa", model, kind="medusa", seed=2)
    else:
        model, redrafter, medusa = args.model, "redrafter", "medusa"
    return model, {"redrafter": (redrafter, {}), "+lookup": (redrafter, {"lookup": True}), "medusa": (medusa, {})}


def cmd_demo(args) -> int:
    """Answer a chat prompt with each drafter and with plain decoding, measured side by side."""
    import specdec

    with tempfile.TemporaryDirectory() as tmp:
        model, drafters = _demo_models(args, Path(tmp))
        backend = args.backend or ("numpy" if args.random else None)
        target = specdec.load(model, backend=backend, dtype=args.dtype)
        prompt = [{"role": "user", "content": args.prompt}]

        def run(drafter, options, max_new_tokens=args.max_new_tokens):
            return specdec.generate(target, prompt, drafter=drafter, backend=backend, max_new_tokens=max_new_tokens,
                                    **options)

        for drafter, options in [("none", {}), *drafters.values()]:  # warm-up: first calls pay one-off costs
            run(drafter, options, max_new_tokens=4)
        plain = run("none", {})
        results = {label: run(*choice) for label, choice in drafters.items()}
        label = "random untrained drafters: expect no acceptance" if args.random else "shipped drafters"
        print(f"model {model}, backend {backend or 'default'}, dtype {args.dtype or 'default'}; {label}\n")
        print(f"user: {args.prompt}\nassistant: {results['redrafter'].text}\n")
        print(_report("plain", plain))
        status = 0
        for name, result in results.items():
            same = "identical to plain decoding" if result.tokens == plain.tokens else "DIFFERS from plain decoding"
            print(_report(name, result, plain.stats.tokens_per_second) + f"; output {same}")
            status |= result.tokens != plain.tokens
        print("(+lookup: ReDrafter with a prompt-lookup beam beside its beams)")
    return int(status)


def cmd_bench(args) -> int:
    """Run a benchmark grid and write bench.json, bench.md and plots to --out."""
    from specdec.bench import load_prompt_set, parse_method, run_bench
    from specdec.bench.report import markdown, write_outputs
    from specdec.plugins import installed_distributions

    Path(args.out).mkdir(parents=True, exist_ok=True)  # an unwritable --out fails before the runs, not after
    prompts = load_prompt_set(args.prompts, per_category=args.per_category)
    methods = [parse_method(m) for m in args.methods]
    grid = [(item.partition(":")[0], item.partition(":")[2] or None) for item in args.backends]
    records = run_bench(args.model, prompts, methods, grid=grid, temperatures=args.temperatures,
                        max_new_tokens=args.max_new_tokens, repeats=args.repeats, warmup=args.warmup, seed=args.seed)
    meta = dict(command=" ".join(sys.argv), versions=installed_distributions(), model=str(args.model),
                prompts=args.prompts, per_category=args.per_category, max_new_tokens=args.max_new_tokens)
    out = write_outputs(records, Path(args.out), meta=meta)
    print(markdown(out["summary"], categories=args.categories))
    print(f"wrote {args.out}/bench.json, bench.md, speedup.png, accepted.png", file=sys.stderr)
    return 0


def cmd_plan(args) -> int:
    """Predict the speedup of every beam configuration, recommend one, and check the best few."""
    from specdec.bench import load_prompt_set
    from specdec.bench.planner import measure, plan

    prompts = [p.prompt for p in load_prompt_set(args.prompts, per_category=args.per_category)]
    rows = plan(args.model, args.drafter, prompts, backend=args.backend, dtype=args.dtype, widths=args.widths,
                lengths=args.lengths, max_new_tokens=args.max_new_tokens)
    checked = measure(args.model, args.drafter, prompts, rows[: args.measure_top], backend=args.backend,
                      dtype=args.dtype, max_new_tokens=args.max_new_tokens) if args.measure_top else []
    measured = {(r.beam_width, r.beam_length): r.measured_speedup for r in checked}
    print("| W | L | tokens/step (est.) | tree size | draft ms | verify ms | predicted speedup | measured |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        m = measured.get((r.beam_width, r.beam_length))
        print(f"| {r.beam_width} | {r.beam_length} | {r.tokens_per_step:.2f} | {r.tree_size:.1f} | {r.draft_ms:.1f} "
              f"| {r.verify_ms:.1f} | {r.predicted_speedup:.2f}x | {'-' if m is None else f'{m:.2f}x'} |")
    best = rows[0]
    print(f"recommended: beam_width={best.beam_width} beam_length={best.beam_length} "
          f"(predicted {best.predicted_speedup:.2f}x over plain decoding, decode phase)")
    return 0


def cmd_plugins(args) -> int:
    from specdec.plugins import default_registry

    rows = default_registry().describe()
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    for kind in ("backend", "drafter", "tree_builder", "verifier"):
        print(f"{kind.replace('_', ' ')}s:")
        for row in (r for r in rows if r["kind"] == kind):
            backend = "" if row["backend"] is None else f" [{row['backend']}]"
            flag = "" if row["lossless"] is None else (" lossless" if row["lossless"] else " LOSSY")
            print(f"  {row['name']}{backend}{flag}  ({row['package']}, plugin {row['plugin']})")
    return 0


def cmd_train(args) -> int:
    """Distil a drafter for a model (``specdec.training``); prints held-out tokens per step."""
    from specdec.errors import InvalidInputError, require

    if args.backend != "torch":
        raise InvalidInputError(f"training runs on the torch backend only, got --backend {args.backend!r}")
    if args.steps is None and args.minutes is None:
        raise InvalidInputError("give a training budget: --minutes N or --steps N")
    require("torch", extra="train", feature="specdec train")
    require("transformers", extra="train", feature="specdec train")
    options = dict(steps=args.steps, minutes=args.minutes, prompts=args.prompts, heldout_prompts=args.heldout_prompts,
                   max_new_tokens=args.max_new_tokens, batch_size=args.batch_size, lr=args.lr,
                   weight_decay=args.weight_decay, seed=args.seed,
                   resume=args.resume, overwrite=args.overwrite, allow_changes=args.allow_changes, threads=args.threads,
                   save_dtype=args.save_dtype, bf16=args.bf16,
                   negatives=args.negatives or None, prompt_text_prompts=args.prompt_text_prompts,
                   shortlist=(8192 if args.drafter == "redrafter" else 0) if args.shortlist is None else args.shortlist,
                   progress=not args.quiet)
    if args.drafter == "redrafter":
        from specdec_redrafter.train import train_redrafter

        report = train_redrafter(args.model, args.out, beam_width=args.beam_width, beam_length=args.beam_length,
                                 **options)
    else:
        from specdec_medusa.train import train_medusa

        report = train_medusa(args.model, args.out, **options)
    for row in report["history"]:
        print(f"step {row['step']:>6}  {row['minutes']:7.2f} min  loss {row['loss']:.3f}  held-out "
              f"{row['tokens_per_step']:.2f} tokens/step (bonus token counted)")
    print(f"saved {args.drafter} drafter to {args.out}", file=sys.stderr)
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="specdec", description="Speculative decoding with pluggable backends.")
    parser.add_argument("--debug", action="store_true", help="show the full traceback of an error")
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser("demo", help="answer a prompt with each drafter and with plain decoding, side by side")
    demo.add_argument("--model", default="smollm2-135m")
    demo.add_argument("--backend", default=None, help="default: torch when installed, else numpy")
    demo.add_argument("--dtype", default=None)
    demo.add_argument("--prompt", default="Explain in a few sentences why the sky is blue.")
    demo.add_argument("--max-new-tokens", type=int, default=128)
    demo.add_argument("--random", action="store_true", help="a small random model and untrained drafters instead")
    demo.set_defaults(func=cmd_demo)
    gen = sub.add_parser("generate", help="generate from a model folder")
    gen.add_argument("--model", required=True)
    group = gen.add_mutually_exclusive_group(required=True)
    group.add_argument("--prompt")
    group.add_argument("--prompt-ids", help="JSON list of token ids")
    gen.add_argument("--drafter", default="redrafter", help="redrafter | medusa | lookup | none | a checkpoint folder")
    _add_generation_args(gen)
    gen.set_defaults(func=cmd_generate)
    bench = sub.add_parser("bench", help="measure methods side by side on a prompt set")
    bench.add_argument("--model", required=True, help="a bundled name (smollm2-135m), folder or .gguf")
    bench.add_argument("--prompts", default="mt-bench", help="mt-bench | humaneval | a JSONL file")
    bench.add_argument("--per-category", type=int, default=None, help="first N prompts of each category")
    bench.add_argument("--methods", nargs="+", default=["plain", "redrafter", "medusa"],
                       help="plain, redrafter[:w=4,l=5,lookup=true], medusa[:choices=cpu16], lookup[:k=6], hf, hf-pld[:n=10], "
                            "hf-assisted:draft=M, mlx-lm, mlx-lm-draft:draft=M")
    bench.add_argument("--backends", nargs="+", default=["torch:bfloat16"], help="backend[:dtype] ...")
    bench.add_argument("--temperatures", nargs="+", type=float, default=[0.0])
    bench.add_argument("--max-new-tokens", type=int, default=128)
    bench.add_argument("--repeats", type=int, default=3)
    bench.add_argument("--warmup", type=int, default=1)
    bench.add_argument("--seed", type=int, default=0)
    bench.add_argument("--categories", action="store_true", help="print per-category rows too")
    bench.add_argument("--out", default="bench-out")
    bench.set_defaults(func=cmd_bench)
    planner = sub.add_parser("plan", help="predict the best ReDrafter beam configuration on this machine")
    planner.add_argument("--model", required=True)
    planner.add_argument("--drafter", default="redrafter", help="redrafter (the shipped one) or a checkpoint")
    planner.add_argument("--backend", default="torch")
    planner.add_argument("--dtype", default=None)
    planner.add_argument("--prompts", default="mt-bench")
    planner.add_argument("--per-category", type=int, default=1)
    planner.add_argument("--widths", nargs="+", type=int, default=[1, 2, 4, 8])
    planner.add_argument("--lengths", nargs="+", type=int, default=[2, 3, 4, 5, 6])
    planner.add_argument("--max-new-tokens", type=int, default=64)
    planner.add_argument("--measure-top", type=int, default=3, help="run the best N for real and compare")
    planner.set_defaults(func=cmd_plan)
    train = sub.add_parser("train", help="distil a ReDrafter or Medusa drafter from a model (needs specdec[train])")
    train.add_argument("drafter", choices=("redrafter", "medusa"))
    train.add_argument("--model", required=True, help="a bundled name (smollm2-135m) or a model folder")
    train.add_argument("--backend", default="torch", help="torch (the only training backend)")
    train.add_argument("--out", required=True, help="checkpoint folder (config.json, model.safetensors, state)")
    train.add_argument("--minutes", type=float, default=None, help="training-time budget")
    train.add_argument("--steps", type=int, default=None, help="optimiser-step budget")
    train.add_argument("--beam-width", type=int, default=4)
    train.add_argument("--beam-length", type=int, default=5, help="ReDrafter beam length, root included")
    train.add_argument("--resume", action="store_true", help="continue the run saved in --out (trainer_state.pt)")
    train.add_argument("--overwrite", action="store_true",
                       help="start again in a non-empty --out, replacing the run (or the files) there")
    train.add_argument("--allow-changes", action="store_true",
                       help="with --resume: accept settings that differ from the saved run's (both are recorded)")
    train.add_argument("--prompts", type=int, default=640, help="training prompts decoded for the teacher data")
    train.add_argument("--heldout-prompts", type=int, default=64)
    train.add_argument("--prompt-text-prompts", type=int, default=1024,
                       help="more prompts whose prompt text (teacher-forced) and first 16 tokens are training data")
    train.add_argument("--max-new-tokens", type=int, default=128, help="teacher continuation length")
    train.add_argument("--batch-size", type=int, default=64, help="positions per optimiser step")
    train.add_argument("--lr", type=float, default=1e-3)
    train.add_argument("--weight-decay", type=float, default=0.0, help="AdamW decoupled weight decay")
    train.add_argument("--seed", type=int, default=0)
    train.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    train.add_argument("--save-dtype", default="float32", choices=("float32", "float16"))
    train.add_argument("--bf16", action="store_true", help="bfloat16 autocast for the drafter")
    train.add_argument("--negatives", type=int, default=4096,
                       help="sampled-softmax loss: label tokens plus N sampled tokens instead of all (0: all)")
    train.add_argument("--shortlist", type=int, default=None,
                       help="ReDrafter: draft only the N token ids with the most teacher mass (0: all; "
                            "default 8192 for ReDrafter, 0 for Medusa)")
    train.add_argument("--quiet", action="store_true", help="no progress bars")
    train.set_defaults(func=cmd_train)
    from specdec.cli_cache import add_parser as add_cache_parser

    add_cache_parser(sub)
    plugins = sub.add_parser("plugins", help="list installed backends, drafters, tree builders and verifiers")
    plugins.add_argument("--json", action="store_true")
    plugins.set_defaults(func=cmd_plugins)
    return parser


def main(argv=None) -> int:
    """Run a command; every expected failure is one line on stderr and a non-zero exit
    (``--debug`` re-raises it with its traceback)."""
    from specdec.errors import TrainingInterrupted

    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
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


def one_line(exc: BaseException) -> str:
    """The error's message on one line; an OSError names its file and what went wrong."""
    if isinstance(exc, OSError) and not isinstance(exc, SpecdecError) and exc.strerror:
        where = f"{exc.filename}: " if exc.filename else ""
        return f"{where}{exc.strerror}"
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text


if __name__ == "__main__":
    sys.exit(main())
