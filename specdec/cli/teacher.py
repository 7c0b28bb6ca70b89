"""``specdec teacher``: write the target's own greedy answers to prompts as token sequences, the
data ``specdec train --data`` learns from (``specdec.training.answers``)."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from tqdm.auto import tqdm

import specdec
from specdec.errors import InvalidInputError, require
from specdec.training import answers as teacher


def add_parser(sub) -> None:
    parser = sub.add_parser(
        "teacher",
        help="decode the model's own answers to prompts into a token-sequence file for "
        "`specdec train --data` (docs/training.md)",
    )
    parser.add_argument("--model", required=True, help="a bundled name or a model folder")
    parser.add_argument(
        "--prompts",
        default="corpus",
        help="corpus (specdec's training corpus), self (requests the model writes in its own "
        "chat template's user turn), or a .jsonl file of {\"messages\": [...]} or "
        "{\"prompt\": \"text\"} lines",
    )
    parser.add_argument(
        "--count", type=int, default=1024, help="prompts to answer (corpus, self; a file: all)"
    )
    parser.add_argument("--max-new-tokens", type=int, default=512, help="answer length at most")
    parser.add_argument(
        "--max-prompt-tokens", type=int, default=512, help="longer prompts are left out"
    )
    parser.add_argument(
        "--batch-size", type=int, default=64, help="requests decoded at once (slots in flight)"
    )
    parser.add_argument("--device", default=None, help="cpu, cuda, cuda:1, mps (default: torch's)")
    parser.add_argument(
        "--dtype", default=None, help="the target's dtype (default: the fastest measured here)"
    )
    parser.add_argument("--seed", type=int, default=0, help="corpus order and self requests")
    parser.add_argument("--out", required=True, help="the .npz file to write")
    parser.add_argument("--overwrite", action="store_true", help="replace --out if it exists")
    parser.set_defaults(func=cmd_teacher)


def cmd_teacher(args) -> int:
    require("torch", extra="torch", feature="specdec teacher")
    out = Path(args.out).expanduser()
    if out.suffix != ".npz":
        raise InvalidInputError(f"--out {out}: the sequences are written as a .npz file")
    if out.exists() and not args.overwrite:
        raise InvalidInputError(f"--out {out} exists; pass --overwrite to replace it")
    for flag, value in (
        ("--count", args.count),
        ("--max-new-tokens", args.max_new_tokens),
        ("--max-prompt-tokens", args.max_prompt_tokens),
        ("--batch-size", args.batch_size),
    ):
        if value < 1:
            raise InvalidInputError(f"{flag} must be at least 1, got {value}")
    source = args.prompts
    prompt_file = None if source in ("corpus", "self") else Path(source).expanduser()
    if prompt_file is not None and not prompt_file.is_file():
        raise InvalidInputError(f"--prompts {source}: give corpus, self or a .jsonl file")
    began = time.perf_counter()
    target = specdec.load(
        args.model,
        backend="torch",
        device=args.device,
        dtype=args.dtype,
        slots=args.batch_size,
        capacity=args.max_prompt_tokens + args.max_new_tokens,
    )
    if getattr(target, "tokenizer", None) is None:
        raise InvalidInputError(f"model {args.model!r} has no tokenizer: prompts cannot be encoded")
    if prompt_file is None and getattr(target, "chat_template", None) is None:
        raise InvalidInputError(
            f"--prompts {source} renders chats, and model {args.model!r} has no chat template: "
            "give a .jsonl file of {\"prompt\": \"text\"} lines"
        )
    if prompt_file is not None:
        prompts, kind = teacher.file_prompts(target, prompt_file), "file"
    elif source == "self":
        prompts = teacher.self_prompts(
            target, args.count, seed=args.seed, batch_size=args.batch_size
        )
        kind = "self"
    else:
        prompts, kind = teacher.corpus_prompts(target, args.count, seed=args.seed), "corpus"
    kept = [p for p in prompts if 0 < len(p) <= args.max_prompt_tokens]
    drafted = time.perf_counter()
    parts = out.with_name(f".{out.name}.parts")
    with tqdm(total=len(kept), unit="prompt", desc="teacher") as bar:
        answers = teacher.decode_answers(
            target,
            kept,
            max_new_tokens=args.max_new_tokens,
            chunk=4 * args.batch_size,
            parts=parts,
            progress=bar.update,
        )
    decoded = time.perf_counter() - drafted
    report = teacher.write_teacher(
        out,
        kept,
        answers,
        [teacher.SOURCES.index(kind)] * len(kept),
        target.eos_token_ids,
        int(target.vocab_size),
    )
    for part in parts.glob("answers-*.npz"):
        part.unlink()
    parts.rmdir()
    report.update(
        {
            "prompts": kind,
            "left_out_longer_than_max_prompt_tokens": len(prompts) - len(kept),
            "answer_tokens_per_second": round(report["answer_tokens"] / max(decoded, 1e-9), 1),
            "minutes": round((time.perf_counter() - began) / 60, 2),
        }
    )
    print(json.dumps(report))
    print(f"wrote {report['sequences']} sequences to {out}", file=sys.stderr)
    return 0
