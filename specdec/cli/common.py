"""What the decoding commands share: their generation flags and report lines."""

from __future__ import annotations

import argparse
import importlib.util

from specdec.errors import InvalidInputError, install_command


def positive(text: str) -> int:
    """An argparse type: a whole number of 1 or more (``--repeats 0`` ran the whole warm-up and
    then failed in the plot with a traceback)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a whole number, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be 1 or more, got {value}")
    return value


def numpy_fallback_note(backend: str | None) -> str | None:
    """A line when no backend was named and torch is not installed, so a command runs on the
    numpy reference (float64: seconds a token on a real model); a server installed with only
    its own extra sat silent on it for minutes."""
    if backend is not None or importlib.util.find_spec("torch") is not None:
        return None
    return (
        "specdec: torch is not installed, so this runs on the numpy reference (float64, exact, "
        f"seconds a token on a real model): {install_command('torch,hf')} (or name --backend)"
    )


def add_generation_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--backend", default=None, help="numpy | torch | mlx | any installed backend"
    )
    parser.add_argument("--max-new-tokens", type=int, default=64, help="default 64")
    parser.add_argument(
        "--temperature",
        type=float,
        default=0.0,
        help="0 (default): greedy, identical to plain decoding (bit for bit where exact mode is "
        "on); above 0: sampled, distributed as plain decoding's",
    )
    parser.add_argument("--top-k", type=int, default=None, help="sample among the k likeliest")
    parser.add_argument(
        "--top-p", type=float, default=None, help="sample within this probability mass"
    )
    parser.add_argument("--seed", type=int, default=None, help="sampling seed (default: random)")
    parser.add_argument(
        "--dtype", default=None, help="default: the fastest measured on this machine (specdec tune)"
    )
    parser.add_argument(
        "--device",
        default=None,
        help="torch: cpu, cuda, mps (default: the first available of cuda, mps, cpu)",
    )
    add_exact_arg(parser)
    parser.add_argument(
        "--beam-width",
        type=int,
        default=None,
        help="ReDrafter: beams (default: the plan `specdec plan` kept here, else the drafter's; "
        "`specdec cache` lists the plans)",
    )
    parser.add_argument(
        "--beam-length",
        type=int,
        default=None,
        help="ReDrafter: tokens per beam (default: as --beam-width's)",
    )
    parser.add_argument("--verifier", default=None, help="default: the drafter's")
    add_speculation_arg(parser)
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


def add_speculation_arg(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--speculation",
        choices=("auto", "always", "never"),
        default=None,
        help="auto (default): each step, each request drafts what this machine's measured costs "
        "and its acceptance say pays (none under load); always: every step; never: plain decoding",
    )


def add_exact_arg(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--exact",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="exact mode: rows computed so that speculative output is bit-identical to plain "
        "decoding at any dtype (default: on where this machine's check holds; --exact "
        "insists, --no-exact turns it off)",
    )


def generation_kwargs(args) -> dict:
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


def report_line(
    label: str, result, baseline_tps: float | None = None, *, counted: bool = True
) -> str:
    """A result's one line; ``counted`` False leaves "(bonus token counted)" to a legend."""
    stats = result.stats
    speed = f", {stats.tokens_per_second / baseline_tps:.2f}x plain" if baseline_tps else ""
    bonus = " (bonus token counted)" if counted else ""
    return (
        f"{label:>10}: {stats.new_tokens} tokens, {stats.tokens_per_step:.2f} tokens/step{bonus}, "
        f"{stats.tokens_per_second:.1f} tokens/s{speed}"
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
