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
from specdec.training.lines import say
from specdec.training.sequence_files import SequenceSet, read_sequences
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
