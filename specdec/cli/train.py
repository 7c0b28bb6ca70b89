"""``specdec train DRAFTER``: distil a drafter from the target (its flags from the drafter's
spec)."""

from __future__ import annotations

import argparse
import sys

from specdec.bench.trust import Measured
from specdec.errors import InvalidInputError, require
from specdec.plugins.registry import default_registry
from specdec.training.selfinstruct import check_mix


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


def busy_training_note(clock) -> str | None:
    """The line for a training run that other processes slowed (what they took: a run on fewer
    threads than cores is not busy by itself), or None."""
    if clock.others is None or clock.quiet:
        return None
    return (
        f"note: other work shared the cores while it trained (other processes computed on "
        f"{clock.others:.0%} of them): its positions/s are below what this machine gives alone, "
        "and a --minutes budget bought fewer steps"
    )


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
        progress=not args.quiet and sys.stderr.isatty(),  # else a line per stage
    )
    options.update({option.dest: getattr(args, option.dest) for option in args.spec.train_options})
    with Measured() as clock:
        report = args.spec.train(args.model, args.out, **options)
    for row in report["history"]:
        print(
            f"step {row['step']:>6}  {row['minutes']:7.2f} min  loss {row['loss']:.3f}  held-out "
            f"{row['tokens_per_step']:.2f} tokens/step (bonus token counted)"
        )
    print(
        "(loss: the drafter's training loss, comparable only within one drafter and data; "
        "held-out tokens/step is what decoding gains, docs/training.md)",
        file=sys.stderr,
    )
    note = busy_training_note(clock)
    if note:
        print(note, file=sys.stderr)
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
    train.add_argument(
        "--minutes", type=float, default=None, help="training-time budget (fractions allowed)"
    )
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
    train.add_argument(
        "--batch-size",
        type=int,
        default=64,
        help="positions per optimiser step (default 64; the docs' EAGLE and EAGLE-3 runs take 512)",
    )
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
    train.add_argument("--lr", type=float, default=1e-3, help="learning rate (default 1e-3)")
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
        help="start from this checkpoint folder's weights (and its shortlist, unless --shortlist "
        "is given): one trained before, or a shipped drafter's where one ships"
        if spec.takes_shortlist
        else "start from this checkpoint folder's weights: one trained before, or a shipped "
        "drafter's where one ships",
    )
    train.add_argument("--quiet", action="store_true", help="no progress bars")
    for option in spec.train_options:
        train.add_argument(option.flag, type=option.type, default=option.default, help=option.help)
    train.set_defaults(func=cmd_train, spec=spec)


def add_parsers(sub) -> None:
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
            train_sub.add_parser(spec.name, help=f"distil the {spec.name} drafter from a model"),
            spec,
        )
