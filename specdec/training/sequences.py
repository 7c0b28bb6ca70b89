"""Teacher data from token sequences: a drafter learns from text the target has already answered.

A sequence is a prompt and an answer, as token ids. Its teacher records (``TeacherData``, the
same fields decoding makes: the last-layer hidden state, the next token, the target's top-k
next-token distribution, the outputs of asked-for decoder layers) come from one teacher-forced
forward of the target over the whole sequence, a prefill, packed with other sequences in
forwards of at most ``SequenceSettings.budget`` tokens (a long sequence continues over several
forwards, in chunks, as a prompt does) by the torch backend's ``TargetModel``, the forward
decoding runs. Records are kept at the answer's positions only: position t's next token is
token t+1, from the last prompt position to the answer's last token but one (the prompt is
context, not loss).

Sources (``read_sequences``):

- ``.npz`` files: ``tokens`` (every sequence's prompt then answer ids, concatenated),
  ``prompt_lengths`` and ``response_lengths`` (one per sequence); what ``specdec teacher``
  writes;
- ``.jsonl`` files, one chat per line (``{"messages": [{"role": ..., "content": ...}, ...]}``):
  each assistant turn is a sequence, its prompt the chat before it rendered with the model's
  chat template (as ``specdec.generate`` renders a chat), its answer the turn's text and the
  template's end of turn. This is how a drafter is trained on a service's own logs.

Sequences whose prompt repeats an earlier one's are dropped (two sources may answer the same
prompt). The split is by sequence: a permutation seeded by ``seed`` puts the first ``heldout``
sequences in the held-out split, the rest in training order. The records are cached in shards
of ``shard_size`` sequences in that order, keyed by the target's fingerprint, the sequences'
digest, the seed and the settings, so a killed run resumes where its shards end and a run with
``max_positions`` larger reuses the shards it has.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import attrs
import numpy as np
import torch
from tqdm.auto import tqdm

from specdec.errors import InvalidInputError
from specdec.generation.chat import is_messages, render_chat
from specdec.models.files import jsonl_lines
from specdec.training.lines import say
from specdec.training.teacher import _decoding_target, _stack_layers
from specdec.training.records import TeacherData

__all__ = [
    "SequenceSet",
    "SequenceSettings",
    "read_sequences",
    "sequence_datasets",
    "sequence_records",
]

SEQUENCES_VERSION = 1


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


@attrs.frozen(kw_only=True)
class SequenceSettings:
    """top_k: soft labels per position; layers: decoder layers whose outputs are kept; budget:
    tokens per forward; slots: sequences in a forward at most; hidden_dtype: how hidden states
    and layers are stored; shard_size: sequences per cache file. exact: run the target in exact
    mode, where each position's hidden states and layers are bit for bit what decoding computes
    there (greedy decoding in exact mode too); by default the faster forms, whose rounding
    differs from decoding's in the last bits (a drafter learns the same from either, and the
    target verifies every draft)."""

    top_k: int = 32
    layers: tuple = attrs.field(default=(), converter=lambda v: tuple(sorted({int(i) for i in v})))
    budget: int = 2048
    slots: int = 16
    hidden_dtype: str = "bfloat16"
    shard_size: int = 256
    exact: bool = False

    def key(self, dtype: str) -> dict:
        key = {
            "version": SEQUENCES_VERSION,
            "top_k": self.top_k,
            "hidden_dtype": self.hidden_dtype,
            "dtype": dtype,
            "shard_size": self.shard_size,
        }
        return {**key, "exact": True} if self.exact else key


# ---------------------------------------------------------------------------------------------
# Reading


def read_sequences(paths: Sequence, target) -> SequenceSet:
    """The sequences of ``.npz`` and ``.jsonl`` files (module docstring); ``target`` (a
    ``TeacherTarget``) renders and encodes chats. Repeated prompts are kept once."""
    if not paths:
        raise InvalidInputError("--data needs at least one file (.npz token sequences or .jsonl)")
    prompts, answers, sources, digest = [], [], [], hashlib.sha256()
    for path in (Path(p).expanduser() for p in paths):
        if not path.is_file():
            raise InvalidInputError(f"--data {path} is not a file")
        if path.suffix == ".npz":
            pairs = _read_npz(path)
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
    vocab = int(target.embed_tokens.shape[0])
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


def _read_npz(path: Path) -> list[tuple[np.ndarray, np.ndarray]]:
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


# ---------------------------------------------------------------------------------------------
# Teacher-forced records


@torch.inference_mode()
def teacher_forced(
    target,
    prompts: Sequence[np.ndarray],
    answers: Sequence[np.ndarray],
    settings: SequenceSettings,
    *,
    progress: Callable[[int], None] | None = None,
) -> TeacherData:
    """The records of every sequence's answer positions (module docstring), in order."""
    lengths = [len(p) + len(a) for p, a in zip(prompts, answers)]
    decoder = _decoding_target(
        target.model,
        slots=min(settings.slots, len(lengths)),
        capacity=max(lengths),
        exact=settings.exact,
    )
    hidden_dtype = getattr(torch, settings.hidden_dtype)
    layers = settings.layers
    waiting = list(range(len(lengths)))[::-1]
    free = list(range(decoder.num_slots))[::-1]
    running: dict[int, list] = {}  # slot -> [sequence index, tokens fed, hidden parts, layer parts]
    records: list[TeacherData | None] = [None] * len(lengths)
    while waiting or running:
        while waiting and free:
            running[free.pop()] = [waiting.pop(), 0, [], []]
        context, budget = [], settings.budget
        for slot, entry in sorted(running.items(), key=lambda item: item[1][0]):
            if budget <= 0:
                break
            index, fed = entry[0], entry[1]
            tokens = np.concatenate([prompts[index], answers[index]])
            take = min(lengths[index] - fed, budget)
            context.append((slot, tokens[fed : fed + take]))
            budget -= take
        out = decoder.forward_tree(
            None, np.zeros(0, dtype=np.int64), context=context, layers=layers
        )
        for (slot, chunk), result in zip(context, out.context):
            entry = running[slot]
            entry[1] += chunk.size
            entry[2].append(result.hidden)
            if layers:
                entry[3].append(_stack_layers(result.layers, layers))
            index = entry[0]
            if entry[1] == lengths[index]:
                records[index] = _records(
                    target.model,
                    torch.cat(entry[2]),
                    torch.cat(entry[3]) if layers else None,
                    prompts[index],
                    answers[index],
                    settings.top_k,
                    hidden_dtype,
                )
                del running[slot]
                decoder.release(slot)
                free.append(slot)
        if progress is not None:
            progress(sum(chunk.size for _, chunk in context))
    data = TeacherData.concat(records) if len(records) > 1 else records[0]
    return attrs.evolve(data, layers=data.layers if layers else None, layer_ids=layers)


def _records(model, hidden, layers, prompt, answer, top_k: int, dtype) -> TeacherData:
    """TeacherData of one sequence's answer positions from its per-position hidden states."""
    start, n = len(prompt) - 1, len(prompt) + len(answer)
    kept = hidden[start : n - 1]
    probs = torch.softmax(model.lm_head(kept).float(), dim=-1)
    top_probs, top_ids = torch.topk(probs, top_k, dim=-1)
    count = kept.shape[0]
    return TeacherData(
        hidden=kept.to(dtype),
        next_tokens=torch.as_tensor(np.asarray(answer), dtype=torch.long),
        label_ids=top_ids,
        label_probs=top_probs.half(),
        remaining=torch.arange(count - 1, -1, -1),
        sequence=torch.zeros(count, dtype=torch.long),
        layers=None if layers is None else layers[start : n - 1].to(dtype),
    )


# ---------------------------------------------------------------------------------------------
# Cached datasets


def split_order(count: int, heldout: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(held-out indices, training indices in training order): a seeded permutation's first
    ``heldout`` sequences, then the rest."""
    if heldout >= count:
        raise InvalidInputError(
            f"--heldout-sequences {heldout} leaves no training sequence of the {count} given"
        )
    order = np.random.default_rng(seed).permutation(count)
    return order[:heldout], order[heldout:]


def first_sequences(data: TeacherData, count: int) -> TeacherData:
    """The records of ``data``'s first ``count`` sequences."""
    if count >= data.num_sequences:
        return data
    end = int(data.starts()[count])
    fields = ("hidden", "next_tokens", "label_ids", "label_probs", "remaining", "sequence")
    return attrs.evolve(
        data,
        **{name: getattr(data, name)[:end] for name in fields},
        layers=None if data.layers is None else data.layers[:end],
    )


def _shard_file(cache: Path, key: dict) -> Path:
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:24]
    return cache / f"sequences-{digest}.safetensors"


def _ensure_shard(
    target, sequences: SequenceSet, indices, key: dict, settings, cache: Path, stats, progress
) -> Path:
    """The cache file of the records of ``indices`` (one shard), computed and saved when it is
    missing or lacks a layer asked for; nothing is kept in memory."""
    file = _shard_file(cache, key)
    stored = TeacherData.stored_layers(file) if file.is_file() else None
    if stored is not None and set(settings.layers) <= set(stored):
        stats["shards_reused"] += 1
        return file
    began = time.perf_counter()
    data = teacher_forced(
        target,
        [sequences.prompts[i] for i in indices],
        [sequences.answers[i] for i in indices],
        settings,
        progress=progress,
    )
    data.save(file, {**key, "target": target.name})
    stats["shards_made"] += 1
    stats["positions_made"] += data.num_positions
    stats["tokens_forwarded"] += int(
        sum(len(sequences.prompts[i]) + len(sequences.answers[i]) for i in indices)
    )
    stats["seconds"] += time.perf_counter() - began
    return file


def sequence_records(
    target,
    paths: Sequence,
    *,
    heldout: int = 64,
    max_positions: int | None = None,
    seed: int = 0,
    settings: SequenceSettings = SequenceSettings(),
    cache: Path,
    progress: bool = True,
) -> tuple[dict, dict, dict]:
    """Make sure the record shards of the sequences in ``paths`` are in ``cache`` (computing the
    missing ones) without holding them: -> ({split: (shard files, sequences wanted)}, stats,
    wall seconds per stage). ``heldout`` sequences are held out; the training ones are taken in
    order until their answer positions reach ``max_positions`` (None: all)."""
    times, began = {}, time.perf_counter()
    sequences = read_sequences(paths, target)
    times["read_sequences"] = time.perf_counter() - began
    held, order = split_order(len(sequences), heldout, seed)
    Path(cache).mkdir(parents=True, exist_ok=True)
    dtype = str(target.model.dtype).removeprefix("torch.")
    base = {
        "fingerprint": target.fingerprint,
        "sequences": sequences.digest,
        "seed": seed,
        "heldout": heldout,
        **settings.key(dtype),
    }
    stats = {
        "shards_reused": 0,
        "shards_made": 0,
        "positions_made": 0,
        "tokens_forwarded": 0,
        "seconds": 0.0,
    }
    splits = {}
    size = lambda i: len(sequences.prompts[i]) + len(sequences.answers[i])
    for name, indices, limit in (("heldout", held, None), ("train", order, max_positions)):
        began = time.perf_counter()
        # shards over the whole order, so their keys do not depend on max_positions
        shards = [
            indices[i : i + settings.shard_size]
            for i in range(0, len(indices), settings.shard_size)
        ]
        if limit is not None:
            counts = np.cumsum([len(sequences.answers[i]) for i in indices])
            wanted = int(np.searchsorted(counts, limit)) + 1  # sequences up to the limit
            shards = shards[: -(-wanted // settings.shard_size)]
        else:
            wanted = len(indices)
        total = int(sum(size(i) for shard in shards for i in shard))
        files = []
        with tqdm(total=total, disable=not progress, unit="tok", desc=f"records {name}") as bar:
            for number, shard in enumerate(shards):
                key = {**base, "split": name, "shard": number, "size": len(shard)}
                reused = stats["shards_reused"]
                files.append(
                    _ensure_shard(target, sequences, shard, key, settings, cache, stats, bar.update)
                )
                if stats["shards_reused"] > reused:
                    bar.update(int(sum(size(i) for i in shard)))
                elif not progress:
                    say(
                        f"records {name}: shard {number + 1} of {len(shards)} made "
                        f"({stats['tokens_forwarded'] / max(stats['seconds'], 1e-9):.0f} tokens "
                        "forwarded/s)"
                    )
        splits[name] = (files, wanted)
        times[f"records_{name}"] = time.perf_counter() - began
    if stats["seconds"]:
        stats["positions_per_second"] = round(stats["positions_made"] / stats["seconds"], 1)
        stats["tokens_forwarded_per_second"] = round(
            stats["tokens_forwarded"] / stats["seconds"], 1
        )
    stats.update(
        {
            "sources": list(sequences.sources),
            "sequences": len(sequences),
            "repeated_prompts_dropped": sequences.dropped_repeats,
            "heldout_sequences": len(held),
            "settings": {**attrs.asdict(settings), "dtype": dtype},
        }
    )
    return splits, stats, times


def sequence_datasets(target, paths: Sequence, *, settings=SequenceSettings(), **options):
    """(datasets {"train", "heldout"}, stats, wall seconds per stage): ``sequence_records``'s
    shards (made where missing) loaded as ``TeacherData``."""
    splits, stats, times = sequence_records(target, paths, settings=settings, **options)
    began = time.perf_counter()
    datasets = {
        name: first_sequences(TeacherData.load_many(files, layers=settings.layers), wanted)
        for name, (files, wanted) in splits.items()
    }
    times["load_records"] = time.perf_counter() - began
    stats.update(
        {
            "train_sequences": datasets["train"].num_sequences,
            "train_positions": datasets["train"].num_positions,
            "heldout_positions": datasets["heldout"].num_positions,
        }
    )
    return datasets, stats, times
