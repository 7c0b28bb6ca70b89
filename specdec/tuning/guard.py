"""The decoding guard: exact mode checked on the forward decoding runs, not only on its parts.

Exact mode's self-test (``target.check_row_invariance``) runs each product and the attention on
random inputs at a few row counts. A kernel library picks its algorithm (tiles, split-K) by the
row count, so a row count the self-test never tried may round otherwise, and then speculative
output parts from plain decoding while exact mode says "on". The guard closes that gap with the
target's own weights and its own ``forward_tree``, through the target protocol only, so it runs
on every backend and device:

1. **one token at a time**: a random token sequence decoded as plain decoding does (a one-token
   prompt, then one-node trees, each committed) gives the reference logits, hidden states and
   decoder-layer outputs of every position;
2. **trees of every node count** the decoder can issue, 1 to ``max_nodes`` (the largest tree
   the drafter's settings allow), in every one of ``rows`` slots at once (the rows a step
   packs): even rows a chain, odd rows a branched tree whose path to check is its second beam
   (decoys first), all over the same prefix; every node on the path must equal the reference
   at its position, bit for bit;
3. **prompt chunks** of several sizes (3, 7, 16 and the whole sequence), the sequence fed in
   chunks beside the other rows' trees: every position's hidden state, and each chunk's last
   logits, must equal the reference.

A difference turns exact mode off with one line naming the shape (node count and rows, or chunk
size), the row count of that forward, the position and the first decoder layer whose output
differs. The verdict is cached per machine, software, dtype, model shape, ``max_nodes`` and
``rows`` (``specdec.tuning.exactness.cached_check``).
"""

from __future__ import annotations

from typing import Any, Callable

import warnings

import attrs
import numpy as np

from specdec.errors import InvalidInputError
from specdec.tuning.exactness import Exactness, InvarianceCheck, cached_check
from specdec.types import DraftTree, Verdict

__all__ = [
    "GUARD_NODES",
    "GUARD_VERSION",
    "check_decoding",
    "guard_exact_mode",
    "guard_key",
    "guarded",
]

GUARD_VERSION = 1
PREFIX = 12  # committed positions before the trees
GUARD_NODES = 16  # the trees checked for a drafter that states no largest tree
CHUNKS = (3, 7, 16)  # and the whole sequence at once


class _Mismatch(Exception):
    def __init__(self, what: str, position: int, rows: int, redo: Callable | None):
        super().__init__(what)
        self.what, self.position, self.rows, self.redo = what, position, rows, redo


def _tree(tokens, parents) -> tuple:
    """(tokens, parents, depth, ancestor mask) of one row's tree."""
    n = len(tokens)
    depth = np.zeros(n, dtype=np.int64)
    mask = np.zeros((n, n), dtype=bool)
    for i, parent in enumerate(parents):
        depth[i] = 0 if parent < 0 else depth[parent] + 1
        j = i
        while j >= 0:
            mask[i, j] = True
            j = parents[j]
    return np.asarray(tokens, dtype=np.int64), np.asarray(parents, dtype=np.int64), depth, mask


def _shape(size: int, sequence: np.ndarray, decoys: np.ndarray, branched: bool):
    """A tree of ``size`` nodes over ``sequence`` (its root first) and the nodes on its path:
    a chain, or (``branched``, size >= 3) the root, a decoy beam, then the path's beam."""
    if not branched or size < 3:
        return _tree(sequence[:size], list(range(-1, size - 1))), list(range(size))
    decoy = (size - 1) // 2
    path_len = size - 1 - decoy
    tokens = np.concatenate([sequence[:1], decoys[:decoy], sequence[1 : 1 + path_len]])
    parents = [-1] + list(range(decoy)) + [0] + list(range(decoy + 1, decoy + path_len))
    return _tree(tokens, parents), [0] + list(range(decoy + 1, size))


class _Guard:
    """One run of the guard on ``target`` (module docstring)."""

    def __init__(self, target, to_numpy, from_numpy, *, max_nodes: int, rows: int, seed: int):
        rng = np.random.default_rng(seed)
        self.target, self.to_numpy, self.from_numpy = target, to_numpy, from_numpy
        self.layers = tuple(range(int(getattr(target, "num_layers", 0))))
        self.max_nodes, self.rows = max_nodes, rows
        self.sequence = rng.integers(0, int(target.vocab_size), PREFIX + max_nodes)
        self.decoys = rng.integers(0, int(target.vocab_size), max_nodes)
        self.held: set[int] = set()
        self.ref: dict = {}

    def pack(self, trees: list[tuple]) -> DraftTree:
        """Rows of trees of one size as a DraftTree of the backend's arrays."""
        t, p, d, m = (np.stack([tree[i] for tree in trees]) for i in range(4))
        to = self.from_numpy
        return DraftTree(
            tokens=to(t),
            parents=to(p),
            depth=to(d),
            ancestor_mask=to(m),
            num_nodes=to(np.full(len(trees), t.shape[1], dtype=np.int64)),
        )

    def forward(self, tree, slots, context=(), layers=()):
        self.held.update(slot for slot, _ in context)
        return self.target.forward_tree(
            tree, np.asarray(slots, dtype=np.int64), context=list(context), layers=layers
        )

    def release(self, slot: int) -> None:
        if slot in self.held:
            self.target.release(slot)
            self.held.discard(slot)

    def reference(self, layers: tuple = (), upto: int | None = None) -> list:
        """Logits and hidden states of each position, one token at a time in slot 0 (kept as
        ``ref``); with ``layers``, returns the outputs of those decoder layers at each position
        up to ``upto`` instead."""
        numpy, end = self.to_numpy, len(self.sequence) if upto is None else upto + 1
        first = self.forward(None, [], context=[(0, self.sequence[:1])], layers=layers).context[0]
        logits, hidden = [numpy(first.logits)], [numpy(first.hidden)[-1]]
        inner = [[numpy(first.layers[i])[-1] for i in layers]]
        zero = self.from_numpy(np.zeros((1, 1), dtype=np.int64))
        verdict = Verdict(path=zero, num_accepted=zero[:, 0], bonus_tokens=zero[:, 0])
        for token in self.sequence[1:end]:
            tree = self.pack([_tree([token], [-1])])
            out = self.forward(tree, [0], layers=layers)
            logits.append(numpy(out.logits)[0, 0])
            hidden.append(numpy(out.hidden)[0, 0])
            inner.append([numpy(out.layers[i])[0, 0] for i in layers])
            self.target.commit(tree, verdict)
        self.release(0)
        if not layers:
            self.ref = {"logits": np.stack(logits), "hidden": np.stack(hidden)}
        return inner

    def agrees(self, hidden, logits, position: int) -> bool:
        same = np.array_equal(hidden, self.ref["hidden"][position])
        return same and (logits is None or np.array_equal(logits, self.ref["logits"][position]))

    def trees(self, size: int, count: int):
        shapes = [
            _shape(size, self.sequence[PREFIX:], self.decoys, branched=bool(r % 2))
            for r in range(count)
        ]
        return self.pack([s[0] for s in shapes]), [s[1] for s in shapes]

    def check_trees(self, size: int) -> None:
        """Every row a ``size``-node tree over the committed prefix, checked on its path."""
        tree, paths = self.trees(size, self.rows)
        slots = list(range(self.rows))
        out = self.forward(tree, slots)
        logits, hidden = self.to_numpy(out.logits), self.to_numpy(out.hidden)
        for r, path in enumerate(paths):
            for depth, node in enumerate(path):
                if self.agrees(hidden[r, node], logits[r, node], PREFIX + depth):
                    continue
                shape = "branched tree" if r % 2 else "chain"
                beside = f" beside {self.rows - 1} other row(s)" if self.rows > 1 else ""

                def redo(r=r, node=node):
                    again = self.forward(tree, slots, layers=self.layers)
                    return [self.to_numpy(again.layers[i])[r, node] for i in self.layers]

                raise _Mismatch(
                    f"a {size}-node {shape}{beside}", PREFIX + depth, self.rows * size, redo
                )

    def check_chunks(self, chunk: int) -> None:
        """The last slot in use fed the whole sequence in chunks of ``chunk`` tokens, beside the
        other rows' trees."""
        slot = self.rows - 1
        others = list(range(slot))
        tree = self.trees(min(self.max_nodes, 8), len(others))[0] if others else None
        self.release(slot)
        fed = 0
        while fed < len(self.sequence):
            part = self.sequence[fed : fed + chunk]
            result = self.forward(tree, others, context=[(slot, part)]).context[0]
            hidden = self.to_numpy(result.hidden)
            for offset in range(len(part)):
                last = offset == len(part) - 1
                logits = self.to_numpy(result.logits) if last else None
                if not self.agrees(hidden[offset], logits, fed + offset):
                    beside = f" beside {len(others)} row(s) of trees" if others else ""
                    count = len(part) + (
                        0 if tree is None else len(others) * int(tree.tokens.shape[1])
                    )
                    raise _Mismatch(
                        f"a prompt chunk of {len(part)} tokens{beside}", fed + offset, count, None
                    )
            fed += len(part)
        self.release(slot)

    def where(self, found: _Mismatch) -> str:
        """ ", first at decoder layer L's output": the failing forward run again with every
        layer's output, against the same layers decoded one token at a time."""
        if found.redo is None or not self.layers:
            return ""
        outputs = found.redo()
        for slot in sorted(self.held):
            self.release(slot)
        wanted = self.reference(self.layers, upto=found.position)[found.position]
        for index, (got, want) in enumerate(zip(outputs, wanted)):
            if not np.array_equal(got, want):
                return f", first at decoder layer {self.layers[index]}'s output"
        return ", after the last decoder layer (the final norm or the LM head)"


def check_decoding(
    target,
    to_numpy: Callable[[Any], np.ndarray],
    from_numpy: Callable[[np.ndarray], Any],
    *,
    max_nodes: int,
    rows: int,
    seed: int = 0,
) -> InvarianceCheck:
    """Run the guard now (module docstring) on a target whose slots are all free (as they are
    again after)."""
    room = int(getattr(target, "capacity", PREFIX + max_nodes)) - PREFIX
    max_nodes = max(1, min(int(max_nodes), room))
    rows = max(1, min(int(rows), int(target.num_slots)))
    guard = _Guard(target, to_numpy, from_numpy, max_nodes=max_nodes, rows=rows, seed=seed)
    checked: list[str] = []
    try:
        guard.reference()
        checked.append(f"one token at a time ({len(guard.sequence)} positions)")
        prefix = guard.sequence[:PREFIX]
        guard.forward(None, [], context=[(slot, prefix) for slot in range(rows)])
        for size in range(1, max_nodes + 1):
            guard.check_trees(size)
        checked.append(f"trees of 1 to {max_nodes} nodes in {rows} row(s)")
        chunks = sorted({min(c, len(guard.sequence)) for c in (*CHUNKS, len(guard.sequence))})
        for chunk in chunks:
            guard.check_chunks(chunk)
        checked.append("prompt chunks of " + ", ".join(map(str, chunks)) + " tokens")
    except _Mismatch as found:
        failed = (
            f"{found.what} ({found.rows} rows in one forward) gives position {found.position} "
            f"other bits than one token at a time{guard.where(found)}"
        )
        return InvarianceCheck(holds=False, failed=failed, checked=tuple(checked))
    finally:
        for slot in sorted(guard.held):
            guard.release(slot)
    return InvarianceCheck(holds=True, checked=tuple(checked))


def guard_key(backend, target, *, max_nodes: int, rows: int) -> dict:
    """What the verdict depends on: the machine and software (``describe_device``), the dtype,
    the model's shape, the exact attention form, ``max_nodes`` and ``rows``."""
    device = getattr(target, "device", None)
    return {
        "guard": GUARD_VERSION,
        "backend": backend.name,
        "device": backend.describe_device(None if device is None else str(device)),
        "dtype": str(getattr(target, "dtype", "")),
        "shape": [
            int(target.vocab_size),
            int(getattr(target, "hidden_size", 0)),
            int(getattr(target, "num_layers", 0)),
        ],
        "form": getattr(target, "exact_form", None),
        "max_nodes": int(max_nodes),
        "rows": int(rows),
    }


def guarded(backend, target, *, max_nodes: int, rows: int) -> InvarianceCheck:
    """``check_decoding``'s verdict for this machine and target, measured once and cached."""
    rows = max(1, min(int(rows), int(target.num_slots)))
    key = guard_key(backend, target, max_nodes=max_nodes, rows=rows)
    return cached_check(
        key,
        lambda: check_decoding(
            target,
            backend.to_numpy,
            lambda array: backend.from_numpy(array, target),
            max_nodes=max_nodes,
            rows=rows,
        ),
    )


def guard_exact_mode(backend, target, *, max_nodes: int, rows: int, insist: bool = False):
    """Keep exact mode on only where the guard holds for this target at the decoder's tree
    sizes; off (with one warning line), or an InvalidInputError when ``insist`` (exact=True),
    where it does not. A target not in exact mode is left as it is. Returns the check or None.
    The guard uses every slot: never call it while a generation holds the target."""
    if not getattr(target, "exact", False) or not hasattr(target, "forward_tree"):
        return None
    check = guarded(backend, target, max_nodes=max_nodes, rows=rows)
    if check.holds:
        outcome = getattr(target, "exactness", None)
        if outcome is not None and "decoding checked" not in outcome.reason:
            _record(
                target,
                attrs.evolve(
                    outcome, reason=f"{outcome.reason}; decoding checked ({check.source})"
                ),
            )
        return check
    what = (
        f"{check.failed} on this machine ({str(getattr(target, 'dtype', '')).rpartition('.')[2]})"
    )
    if insist:
        raise InvalidInputError(
            f"exact=True, but {what}: speculative output could part from plain decoding; pass "
            "exact=False (or None) to decode anyway"
        )
    target.exact = False
    _record(target, Exactness(on=False, reason=f"off: {what}", check=check))
    warnings.warn(
        f"specdec: exact mode off: {what}; greedy speculative output then follows each "
        "verification forward's rounding; exact=False silences this",
        RuntimeWarning,
        stacklevel=3,
    )
    return check


def _record(target, outcome) -> None:
    try:
        target.exactness = outcome
    except AttributeError:  # a frozen target class
        pass
