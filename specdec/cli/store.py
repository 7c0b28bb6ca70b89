"""``specdec store``: index a model's answers (token sequences or chats) as an answer store, which
the prompt-lookup beam drafts from where the row's own text has no match
(``specdec.drafting.store``)."""

from __future__ import annotations

import time
from pathlib import Path

import attrs

from specdec.drafting.store import DEFAULT_CONTEXT, build_store
from specdec.generation.loading import ModelFolder
from specdec.models.llama import LlamaConfig
from specdec.training.sequence_files import read_sequences


def add_parser(sub) -> None:
    parser = sub.add_parser(
        "store",
        help="index a model's own answers (.npz token sequences or .jsonl chats) as an answer "
        "store for the prompt-lookup beam (docs/algorithms/lookup.md)",
    )
    parser.add_argument("--model", required=True, help="a bundled name or a model folder")
    parser.add_argument(
        "--data",
        action="append",
        required=True,
        help=".npz token sequences (what `specdec teacher` writes) or .jsonl chats "
        "({\"messages\": [...]} per line; each assistant turn is an answer); repeatable",
    )
    parser.add_argument("--out", required=True, help="the store file to write (.npz)")
    parser.add_argument(
        "--context",
        type=int,
        default=DEFAULT_CONTEXT,
        help=f"prompt tokens kept before each answer (default {DEFAULT_CONTEXT}: the chat "
        "template's opening of the assistant turn)",
    )
    parser.set_defaults(func=cmd_store)


@attrs.frozen
class _Vocabulary:
    """What reading sequences needs of a model: its vocabulary, tokenizer and chat template."""

    name: str
    vocab_size: int
    tokenizer: object
    chat_template: str | None
    eos_token_ids: tuple


def cmd_store(args) -> int:
    folder = ModelFolder.of(args.model)
    config = LlamaConfig.from_folder(folder.path)
    model = _Vocabulary(
        name=folder.path.resolve().name,
        vocab_size=config.vocab_size,
        tokenizer=folder.tokenizer,
        chat_template=folder.chat_template,
        eos_token_ids=config.eos_token_ids,
    )
    start = time.perf_counter()
    sequences = read_sequences(args.data, model)
    store = build_store(
        sequences.prompts,
        sequences.answers,
        model.vocab_size,
        model=model.name,
        context=args.context,
    )
    out = store.save(Path(args.out).expanduser())
    print(
        f"{out}: {len(sequences)} answers, {len(store):,} tokens ({sequences.dropped_repeats} "
        f"repeated prompts left out), {out.stat().st_size / 1e6:.1f} MB, "
        f"{time.perf_counter() - start:.1f} s; use it with lookup={{'store': '{out}'}} or "
        f"drafter='lookup', store='{out}' (CLI: --drafter lookup:store={out})"
    )
    return 0
