"""Drafting from a store of the model's own answers: retrieval beside prompt lookup.

Prompt lookup (``specdec.drafting.lookup``) guesses the next tokens from the row's own text. A
model's answers to other prompts repeat its phrases too ("is a process called", "Here is the
function with type hints"), and where the store holds the target's own greedy answers, the
continuation most of its matches share is what the target tends to say after those words.
This is retrieval-based drafting (REST, He et al. 2023, arXiv 2311.08252: a datastore searched by
the context's suffix, its continuations drafted) with the target's answers as the datastore.

**The store** (``AnswerStore``): sequences (each answer with the last ``context`` tokens of its
prompt, the chat template's opening of the assistant turn) in one token array, a separator between
them. Every position's next ``span`` tokens are packed into one 64-bit key (``bits`` bits per token,
the id plus one so that the separator packs as 0; span = 64 // bits: 4 tokens for vocabularies
below 65,535 ids, 3 up to 2**21), and the positions are sorted by key. A suffix of the history of n
<= span tokens is then one key range (two ``searchsorted``), found in O(log N).

**The chain** (``AnswerStore.chain``): the longest suffix of the history, of at most ``span``
tokens, that occurs in the store; from its matches (at most ``sample``, evenly spread over the key
range, which is sorted by what follows, so the spread keeps the continuations' proportions), each
step takes the next token most matches share (ties: the smallest id), keeps the matches that go
on with it, and stops where none goes on, or where that token is shared by fewer than
``min_share`` of the matches left. ``store_chain_reference`` is its readable twin (every window of
every sequence scanned; equal whenever the matches number at most ``sample``, property-tested).

**Files** (``save`` / ``load_store``): an ``.npz`` of ``tokens`` (every sequence, concatenated),
``lengths``, ``vocab_size``, ``context`` and ``model`` (the target's name); no pickles. The index is
built when loaded (under a second for 3M tokens) and kept per file for the process.
"""

from __future__ import annotations

import functools
from importlib import resources
from pathlib import Path
from typing import Sequence

import numpy as np

from specdec.errors import IncompatibleDrafterError, InvalidInputError

__all__ = [
    "AnswerStore",
    "DEFAULT_CONTEXT",
    "build_store",
    "load_store",
    "resolve_store",
    "shipped_store",
    "store_chain_reference",
]

DEFAULT_CONTEXT = 4  # prompt tokens kept before each answer (the assistant turn's opening)
DEFAULT_SAMPLE = 256  # matches a chain follows at most
SEPARATOR = -1


class AnswerStore:
    """Token sequences indexed by every position's next ``span`` tokens (module docstring).

    sequences: int arrays of ids in [0, vocab_size); vocab_size: the target's; model: its name,
    kept in the file to say what the answers are of; context: prompt tokens kept per answer.
    """

    def __init__(
        self,
        sequences: Sequence[np.ndarray],
        vocab_size: int,
        *,
        model: str | None = None,
        context: int = DEFAULT_CONTEXT,
    ):
        if int(vocab_size) < 1 or int(vocab_size) >= 2**21:
            raise InvalidInputError(
                f"an answer store packs token ids in at most 21 bits; vocab_size {vocab_size}"
            )
        self.vocab_size, self.model, self.context = int(vocab_size), model, int(context)
        self.lengths = np.array([len(s) for s in sequences], dtype=np.int64)
        parts = []
        for s in sequences:
            parts += [np.asarray(s, dtype=np.int64), np.array([SEPARATOR])]
        tokens = np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)
        if len(tokens) and (tokens.max() >= self.vocab_size or tokens.min() < SEPARATOR):
            raise InvalidInputError(
                f"an answer store's sequences hold token ids outside [0, {self.vocab_size}): were "
                "they made for another model?"
            )
        self.tokens = tokens
        self.bits = int(self.vocab_size).bit_length()  # ids + 1 fit: vocab_size < 2**bits
        self.span = 64 // self.bits
        keys = _packed_keys(tokens, self.bits, self.span)
        order = np.argsort(keys, kind="stable")
        order = order[tokens[order] != SEPARATOR]  # a match starts on a token
        self.order, self.keys = order, keys[order]

    def __len__(self) -> int:
        return int(self.lengths.sum())

    def matches(self, suffix: np.ndarray) -> tuple[int, int]:
        """The index range [lo, hi) of ``order`` whose positions start with ``suffix`` (n <=
        span tokens)."""
        key = 0
        for token in suffix:
            key = (key << self.bits) | (int(token) + 1)
        shift = self.bits * (self.span - len(suffix))
        lo, hi = np.uint64(key << shift), np.uint64((key + 1) << shift)
        return int(np.searchsorted(self.keys, lo)), int(np.searchsorted(self.keys, hi))

    def chain(
        self,
        history: np.ndarray,
        length: int,
        *,
        min_share: float = 0.0,
        sample: int = DEFAULT_SAMPLE,
    ) -> np.ndarray:
        """Up to ``length`` tokens continuing ``history`` (T,) by the store (module docstring);
        empty where not even its last token occurs."""
        history = np.asarray(history, dtype=np.int64)
        for n in range(min(self.span, len(history)), 0, -1):
            lo, hi = self.matches(history[-n:])
            if hi > lo:
                break
        else:
            return np.zeros(0, dtype=np.int64)
        picked = np.arange(lo, hi) if hi - lo <= sample else np.linspace(lo, hi - 1, sample)
        return _follow(self.tokens, self.order[picked.astype(np.int64)] + n, length, min_share)

    def save(self, path) -> Path:
        """Write the store as an ``.npz`` (module docstring); returns the path."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        tokens = self.tokens[self.tokens != SEPARATOR]
        dtype = np.uint16 if self.vocab_size <= 2**16 else np.uint32
        np.savez_compressed(
            path,
            tokens=tokens.astype(dtype),
            lengths=self.lengths,
            vocab_size=np.int64(self.vocab_size),
            context=np.int64(self.context),
            model=np.array(self.model or ""),
        )
        return path


def _packed_keys(tokens: np.ndarray, bits: int, span: int) -> np.ndarray:
    """(N,) uint64: position i's tokens i .. i+span-1, each id + 1 in ``bits`` bits, first token
    highest; past the end of the array, 0 (a separator's code)."""
    codes = (tokens + 1).astype(np.uint64)
    keys = np.zeros(len(tokens), dtype=np.uint64)
    for j in range(span):
        shifted = np.zeros(len(tokens), dtype=np.uint64)
        shifted[: max(0, len(tokens) - j)] = codes[j:]
        keys = (keys << np.uint64(bits)) | shifted
    return keys


def _follow(tokens: np.ndarray, positions: np.ndarray, length: int, min_share: float):
    """The chain from match ``positions`` (where each match's continuation starts)."""
    chain = []
    for _ in range(length):
        following = tokens[positions]  # the separator ends the store too: never out of range
        going = following != SEPARATOR
        if not going.any():
            break
        ids, counts = np.unique(following[going], return_counts=True)
        best = int(np.argmax(counts))  # the first of the most shared: the smallest id
        if counts[best] < min_share * len(positions):
            break
        chain.append(int(ids[best]))
        positions = positions[following == ids[best]] + 1
    return np.array(chain, dtype=np.int64)


def store_chain_reference(
    sequences: Sequence[np.ndarray],
    history: np.ndarray,
    length: int,
    *,
    span: int,
    min_share: float = 0.0,
) -> np.ndarray:
    """``AnswerStore.chain``'s readable twin over the raw ``sequences``: the longest suffix (at
    most ``span`` tokens) found in any sequence, then the most shared next token (ties: the
    smallest id) among every match, step by step."""
    history = [int(t) for t in history]
    for n in range(min(span, len(history)), 0, -1):
        suffix = history[-n:]
        matches = [
            (s, i + n)
            for s in range(len(sequences))
            for i in range(len(sequences[s]) - n + 1)
            if [int(t) for t in sequences[s][i : i + n]] == suffix
        ]
        if matches:
            break
    else:
        return np.zeros(0, dtype=np.int64)
    chain = []
    for _ in range(length):
        going = [(s, i) for s, i in matches if i < len(sequences[s])]
        if not going:
            break
        counts: dict[int, int] = {}
        for s, i in going:
            counts[int(sequences[s][i])] = counts.get(int(sequences[s][i]), 0) + 1
        token = min(counts, key=lambda t: (-counts[t], t))
        if counts[token] < min_share * len(matches):
            break
        chain.append(token)
        matches = [(s, i + 1) for s, i in going if int(sequences[s][i]) == token]
    return np.array(chain, dtype=np.int64)


def build_store(prompts, answers, vocab_size: int, *, model=None, context=DEFAULT_CONTEXT):
    """An ``AnswerStore`` of each answer after the last ``context`` tokens of its prompt."""
    sequences = [
        np.concatenate([np.asarray(p, dtype=np.int64)[len(p) - min(context, len(p)) :], a])
        for p, a in zip(prompts, answers)
    ]
    return AnswerStore(sequences, vocab_size, model=model, context=context)


@functools.lru_cache(maxsize=4)
def _read(path: str, mtime: float) -> AnswerStore:
    try:
        with np.load(path, allow_pickle=False) as data:
            tokens = np.asarray(data["tokens"], dtype=np.int64)
            lengths = np.asarray(data["lengths"], dtype=np.int64)
            vocab_size, context = int(data["vocab_size"]), int(data["context"])
            model = str(data["model"]) or None
    except (OSError, ValueError, KeyError) as exc:
        raise InvalidInputError(
            f"{path} is not an answer store (arrays tokens, lengths, vocab_size, context, model; "
            f"made by `specdec store`): {exc}"
        ) from None
    if int(lengths.sum()) != len(tokens) or (lengths < 0).any():
        raise InvalidInputError(f"{path}: the answer store's lengths do not add up to its tokens")
    sequences = np.split(tokens, np.cumsum(lengths)[:-1]) if len(lengths) else []
    return AnswerStore(sequences, vocab_size, model=model, context=context)


def load_store(path, target=None) -> AnswerStore:
    """The answer store in ``path`` (read once per process), checked against ``target``'s
    vocabulary: a store of another tokenizer's ids would draft nonsense."""
    path = Path(path).expanduser()
    if not path.is_file():
        raise InvalidInputError(
            f"answer store {path} is not a file: give a store made by `specdec store` (or "
            "none: store=False)"
        )
    store = _read(str(path.resolve()), path.stat().st_mtime)
    vocab = getattr(target, "vocab_size", None)
    if vocab is not None and int(vocab) != store.vocab_size:
        raise IncompatibleDrafterError(
            f"answer store {path} holds the answers of another model ({store.model!r}, "
            f"vocab_size {store.vocab_size}), but the target's vocab_size is {vocab}: build one "
            "for this model with `specdec store`, or pass store=False"
        )
    return store


def shipped_store(target) -> Path | None:
    """The answer store shipped for ``target`` (``specdec/models/stores/<name>.npz``), if any."""
    name = getattr(target, "name", None)
    if not name:
        return None
    shipped = resources.files("specdec.models") / "stores" / f"{name}.npz"
    return Path(str(shipped)) if shipped.is_file() else None


def resolve_store(option, target) -> AnswerStore | None:
    """The answer store an option names: ``"auto"`` the one shipped for ``target`` (None where
    none ships), True the same but insisting, False or None no store, a path a store file."""
    if option is None or option is False:
        return None
    if option is True or option == "auto":
        path = shipped_store(target)
        if path is None and option is True:
            raise InvalidInputError(
                f"no answer store ships for model {getattr(target, 'name', None)!r}: build one "
                "from its answers with `specdec store --model MODEL --data FILE --out FILE` and "
                "pass its path as store="
            )
        return None if path is None else load_store(path, target)
    if isinstance(option, (str, Path)):
        return load_store(option, target)
    raise InvalidInputError(
        f"store must be 'auto', True, False or the path of an answer store, got {option!r}"
    )
