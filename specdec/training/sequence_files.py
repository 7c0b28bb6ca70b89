"""Token sequences read from files: ``.npz`` token sequences and ``.jsonl`` chats (the sources
``specdec.training.sequences`` learns from and ``specdec store`` indexes; its docstring says
what each holds). Sequences whose prompt repeats an earlier one's are dropped."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from pathlib import Path

import attrs
import numpy as np

from specdec.errors import InvalidInputError
from specdec.generation.chat import is_messages, render_chat
from specdec.models.files import jsonl_lines

__all__ = ["SequenceSet", "read_npz", "read_sequences"]


@attrs.frozen
class SequenceSet:
    """Token sequences: ``prompts[i]`` then ``answers[i]`` (int64 arrays); ``sources`` names the
    files and ``digest`` identifies the content (the cache key)."""

    prompts: tuple
    answers: tuple
    sources: tuple
    digest: str
    dropped_repeats: int = 0

    def __len__(self) -> int:
        return len(self.prompts)

    @property
    def answer_tokens(self) -> int:
        return int(sum(len(a) for a in self.answers))


def read_sequences(paths: Sequence, target) -> SequenceSet:
    """The sequences of ``.npz`` and ``.jsonl`` files (module docstring); ``target`` (a
    ``TeacherTarget`` or any object with ``vocab_size``, ``chat_template``, ``tokenizer``,
    ``eos_token_ids`` and ``name``) renders and encodes chats. Repeated prompts are kept once."""
    if not paths:
        raise InvalidInputError("--data needs at least one file (.npz token sequences or .jsonl)")
    prompts, answers, sources, digest = [], [], [], hashlib.sha256()
    for path in (Path(p).expanduser() for p in paths):
        if not path.is_file():
            raise InvalidInputError(f"--data {path} is not a file")
        if path.suffix == ".npz":
            pairs = read_npz(path)
        elif path.suffix == ".jsonl":
            pairs = _read_jsonl(path, target)
        else:
            raise InvalidInputError(
                f"--data {path}: give token sequences as .npz (tokens, prompt_lengths, "
                "response_lengths) or chats as .jsonl (one {\"messages\": [...]} per line)"
            )
        for prompt, answer in pairs:
            prompts.append(prompt)
            answers.append(answer)
        sources.append(str(path))
    vocab = int(target.vocab_size)
    seen, keep = set(), []
    for i, (prompt, answer) in enumerate(zip(prompts, answers)):
        key = prompt.tobytes()
        if key in seen or not len(answer):
            continue
        if int(max(prompt.max(initial=0), answer.max())) >= vocab:
            raise InvalidInputError(
                f"--data: sequence {i} holds token ids beyond the model's vocabulary ({vocab}); "
                "were these sequences made for another model?"
            )
        seen.add(key)
        keep.append(i)
        digest.update(np.int64(len(prompt)).tobytes() + prompt.tobytes() + answer.tobytes())
    if not keep:
        raise InvalidInputError(f"--data {', '.join(sources)} holds no sequence with an answer")
    return SequenceSet(
        prompts=tuple(prompts[i] for i in keep),
        answers=tuple(answers[i] for i in keep),
        sources=tuple(sources),
        digest=digest.hexdigest()[:24],
        dropped_repeats=len(prompts) - len(keep),
    )


def read_npz(path: Path) -> list[tuple[np.ndarray, np.ndarray]]:
    try:
        with np.load(path, allow_pickle=False) as data:
            tokens = np.asarray(data["tokens"], dtype=np.int64)
            prompt_lengths = np.asarray(data["prompt_lengths"], dtype=np.int64)
            answer_lengths = np.asarray(data["response_lengths"], dtype=np.int64)
    except (OSError, ValueError, KeyError) as exc:
        raise InvalidInputError(
            f"--data {path} is not a token-sequence file (arrays tokens, prompt_lengths, "
            f"response_lengths): {exc}"
        ) from None
    lengths = prompt_lengths + answer_lengths
    if (
        prompt_lengths.shape != answer_lengths.shape
        or (prompt_lengths < 1).any()
        or (answer_lengths < 0).any()
        or int(lengths.sum()) != tokens.size
    ):
        raise InvalidInputError(
            f"--data {path}: prompt_lengths + response_lengths (each prompt at least one token) "
            f"must sum to the {tokens.size} tokens"
        )
    ends = np.cumsum(lengths)
    return [
        (tokens[end - n : end - n + p], tokens[end - n + p : end])
        for end, n, p in zip(ends, lengths, prompt_lengths)
    ]


def _read_jsonl(path: Path, target) -> list[tuple[np.ndarray, np.ndarray]]:
    if target.chat_template is None:
        raise InvalidInputError(
            f"--data {path} holds chats, and model {target.name!r} has no chat template to "
            "render them: give token sequences (.npz) instead"
        )
    if target.tokenizer is None:
        raise InvalidInputError(
            f"--data {path} holds chats; model {target.name!r} has no tokenizer"
        )
    pairs = []
    for number, line in jsonl_lines(path, what=f"--data {path}"):
        try:
            messages = json.loads(line).get("messages")
        except (ValueError, AttributeError, RecursionError):
            messages = None
        if not is_messages(messages):
            raise InvalidInputError(
                f"--data {path}, line {number}: expected {{\"messages\": [{{\"role\": ..., "
                "\"content\": ...}, ...]}"
            )
        for turn, message in enumerate(messages):
            if message["role"] != "assistant" or turn == 0:
                continue
            prompt_text = render_chat(target.chat_template, messages[:turn])
            full = render_chat(
                target.chat_template, messages[: turn + 1], add_generation_prompt=False
            )
            if not full.startswith(prompt_text):
                raise InvalidInputError(
                    f"--data {path}, line {number}: the chat template renders turn {turn} so "
                    "that the chat before it is not its prefix; split the chat at that turn"
                )
            prompt = target.tokenizer.encode(prompt_text).ids
            answer = target.tokenizer.encode(full[len(prompt_text) :], add_special_tokens=False).ids
            ends = [i for i, t in enumerate(answer) if t in target.eos_token_ids]
            answer = answer[: ends[0] + 1] if ends else answer  # the turn ends at its end token
            pairs.append((np.asarray(prompt, dtype=np.int64), np.asarray(answer, dtype=np.int64)))
    return pairs
