"""``specdec teacher``: the target's own answers to prompts, written as token sequences.

The expensive part of distillation is decoding: a drafter learns what the target answers, and
the target answers one token per forward. This command decodes greedily (plain decoding, no
drafter) with ``specdec.generate`` on the torch backend, batched over ``batch_size`` request
slots in flight, on any device the backend runs on (a GPU makes in minutes what two CPU cores
make in days), and writes the layout ``specdec train --data`` reads
(``specdec.training.sequences``): ``tokens`` (each prompt's ids then its answer's, end token kept),
``prompt_lengths``, ``response_lengths``, ``finished`` (the answer ended with an end token rather
than at ``max_new_tokens``) and ``source`` (the ``SOURCES`` index of its prompt).

Prompts (``--prompts``): ``corpus`` (specdec's training corpus, split "train", rendered with the
chat template); ``self`` (requests the model draws itself: the chat template's system turn and an
open user turn, sampled at temperature 1 and top-p 0.95 until the turn ends, kept when new, then
closed and answered; the way Magpie draws instructions from an aligned model's own distribution);
or a ``.jsonl`` file of ``{"messages": [...]}`` chats (answered after their last turn) or
``{"prompt": "text"}`` completions. Work is written in parts beside ``--out`` as it goes: a killed
run continues from its last part; ``--out`` appears only when every part is there.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

import specdec
from specdec.errors import InvalidInputError
from specdec.generation.chat import is_messages, render_chat
from specdec.models.cache import cache_entry
from specdec.models.files import jsonl_lines
from specdec.training.corpus import build_prompts, default_corpus

__all__ = ["SOURCES", "decode_answers", "open_user_turn", "write_teacher"]

SOURCES = ("corpus", "self", "file")
SENTINEL = "\x00specdec-request\x00"
REQUEST_TOKENS = 96


def open_user_turn(template: str) -> tuple[str, str]:
    """(text before a user message, text after it up to the assistant's answer) under the chat
    ``template``: what is around a request the model writes itself."""
    rendered = render_chat(template, [{"role": "user", "content": SENTINEL}])
    before, found, after = rendered.partition(SENTINEL)
    if not found:
        raise InvalidInputError(
            "the model's chat template does not show a user message as it was given, so the "
            "model cannot write requests in it (--prompts self); give --prompts corpus or a file"
        )
    return before, after


def _encode(tokenizer, text: str, *, start: bool = True) -> list[int]:
    """``text``'s ids as ``specdec.generate`` encodes a prompt (``start``), or as a piece that
    continues one (no special tokens added)."""
    return list(tokenizer.encode(text, add_special_tokens=start).ids)


def corpus_prompts(target, count: int, *, seed: int) -> list[list[int]]:
    """The first ``count`` training prompts of specdec's corpus, encoded as ``generate`` does."""
    corpus = default_corpus(cache_entry("corpus"))
    prompts = build_prompts(corpus, count, split="train", seed=seed)
    template = target.chat_template
    return [_encode(target.tokenizer, render_chat(template, list(p.messages))) for p in prompts]


def file_prompts(target, path: Path) -> list[list[int]]:
    """The prompts of a ``.jsonl`` file: chats (``messages``) or completions (``prompt``)."""
    prompts = []
    for number, line in jsonl_lines(path, what=f"--prompts {path}"):
        try:
            item = json.loads(line)
        except (ValueError, RecursionError):  # not JSON, or nested deeper than the parser goes
            item = None
        if isinstance(item, dict) and is_messages(item.get("messages")):
            text = render_chat(target.chat_template, item["messages"])
        elif isinstance(item, dict) and isinstance(item.get("prompt"), str) and item["prompt"]:
            text = item["prompt"]
        else:
            raise InvalidInputError(
                f"--prompts {path}, line {number}: expected {{\"messages\": [...]}} or "
                "{\"prompt\": \"text\"}"
            )
        prompts.append(_encode(target.tokenizer, text))
    if not prompts:
        raise InvalidInputError(f"--prompts {path} holds no prompt")
    return prompts


def self_prompts(target, count: int, *, seed: int, batch_size: int) -> list[list[int]]:
    """``count`` distinct requests the model writes in its own chat template's user turn."""
    before, after = open_user_turn(target.chat_template)
    head, tail = _encode(target.tokenizer, before), _encode(target.tokenizer, after, start=False)
    eos = set(target.eos_token_ids)
    found, seen, draw = [], set(), 0
    while len(found) < count and draw < 4 * count + 64:
        rows = min(batch_size, 2 * (count - len(found)) + 8)
        result = specdec.generate(
            target,
            [head] * rows,
            drafter="none",
            max_new_tokens=REQUEST_TOKENS,
            temperature=1.0,
            top_p=0.95,
            seed=[seed * 1_000_003 + draw + i for i in range(rows)],
        )
        draw += rows
        for request in result.tokens:
            if not request or request[-1] not in eos or len(request) < 3:
                continue  # the turn did not end (or is empty): not a request
            key = tuple(request[:-1])
            if key not in seen:
                seen.add(key)
                found.append(head + list(key) + tail)
    if not found:
        raise InvalidInputError(
            f"the model wrote no request that ended its user turn in {draw} draws of up to "
            f"{REQUEST_TOKENS} tokens (--prompts self needs a chat model): give --prompts corpus "
            "or a file"
        )
    return found[:count]


def decode_answers(
    target,
    prompts: Sequence[Sequence[int]],
    *,
    max_new_tokens: int,
    chunk: int,
    parts: Path,
    progress: Callable[[int], None] | None = None,
) -> list[list[int]]:
    """Greedy answers to ``prompts``, ``chunk`` prompts at a time, each chunk kept in ``parts``
    (reused by a later run on the same prompts)."""
    parts.mkdir(parents=True, exist_ok=True)
    answers = []
    for start in range(0, len(prompts), chunk):
        batch = [list(p) for p in prompts[start : start + chunk]]
        file = parts / f"answers-{start:08d}-{len(batch)}.npz"
        if file.is_file():
            with np.load(file) as kept:
                if kept["prompts"].tolist() == [len(p) for p in batch]:
                    lengths = kept["lengths"]
                    flat = kept["tokens"].tolist()
                    ends = np.cumsum(lengths)
                    answers += [flat[e - n : e] for e, n in zip(ends, lengths)]
                    if progress:
                        progress(len(batch))
                    continue
        result = specdec.generate(target, batch, drafter="none", max_new_tokens=max_new_tokens)
        rows = [list(t) for t in result.tokens]
        partial = file.with_name(f".{file.name}.{os.getpid()}.partial.npz")
        np.savez(
            partial,
            prompts=np.array([len(p) for p in batch]),
            lengths=np.array([len(r) for r in rows]),
            tokens=np.array([t for r in rows for t in r], dtype=np.int64),
        )
        partial.replace(file)
        answers += rows
        if progress:
            progress(len(batch))
    return answers


def write_teacher(out: Path, prompts, answers, sources, eos: Sequence[int], vocab: int) -> dict:
    """Write the sequences to ``out`` (.npz, atomically); returns counts for a report."""
    dtype = np.uint16 if vocab <= 1 << 16 else np.uint32
    tokens = np.array([t for p, a in zip(prompts, answers) for t in list(p) + list(a)], dtype=dtype)
    finished = np.array([bool(a) and a[-1] in set(eos) for a in answers])
    partial = out.with_name(f".{out.name}.{os.getpid()}.partial.npz")
    np.savez(
        partial,
        tokens=tokens,
        prompt_lengths=np.array([len(p) for p in prompts], dtype=np.int32),
        response_lengths=np.array([len(a) for a in answers], dtype=np.int32),
        finished=finished,
        source=np.array(sources, dtype=np.uint8),
    )
    partial.replace(out)
    return {
        "sequences": len(prompts),
        "answer_tokens": int(sum(len(a) for a in answers)),
        "finished": float(finished.mean()) if len(finished) else 0.0,
    }
