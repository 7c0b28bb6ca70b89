"""Checks every target makes of its slot arguments, shared so that every backend words them
alike, and ``SlotTarget``, the shell the targets of this repository share around their forward."""

from __future__ import annotations

import os
from typing import Sequence

import attrs
import numpy as np

from specdec.errors import InvalidInputError
from specdec.types import DraftTree, PromptOutput

DEFAULT_CAPACITY = (
    4096  # positions per slot when a target is loaded without a capacity (at most its context)
)
TREE_ROOM = 256  # positions a slot keeps beyond prompt + new tokens for the last step's draft tree
# prompt tokens of one request per forward (specdec.decode.loop.Decoder; bounds the attention
# matrix)
PREFILL_CHUNK = 512


def machine_memory() -> int | None:
    """This machine's physical memory in bytes, or None where the system does not say."""
    try:
        return int(os.sysconf("SC_PAGE_SIZE")) * int(os.sysconf("SC_PHYS_PAGES"))
    except (AttributeError, ValueError, OSError):
        return None


def _bytes(count: int) -> str:
    """1234567 -> '1.2 MiB'."""
    size, unit = float(count), "bytes"
    for unit in ("bytes", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"):
        if size < 1024 or unit == "EiB":
            break
        size /= 1024
    return f"{size:.1f} {unit}" if unit != "bytes" else f"{count} bytes"


def check_slot_arguments(
    slots,
    capacity,
    context_length: int,
    *,
    position_bytes: int | None = None,
    memory: int | None = None,
    where: str = "this machine's memory",
) -> tuple[int, int]:
    """(slots, capacity) of a target being loaded; capacity None means the model's context length,
    at most DEFAULT_CAPACITY. With ``position_bytes`` (what one position of one slot takes in the
    KV cache), sizes whose cache cannot fit ``memory`` bytes (None: this machine's physical
    memory; ``where`` names it) are refused before it is allocated."""
    if isinstance(slots, bool) or not isinstance(slots, (int, np.integer)) or slots < 1:
        raise InvalidInputError(
            f"slots must be a positive integer (requests decoded at once), got {slots!r}"
        )
    if capacity is None:
        capacity = min(int(context_length), DEFAULT_CAPACITY)
    if isinstance(capacity, bool) or not isinstance(capacity, (int, np.integer)) or capacity < 2:
        raise InvalidInputError(
            f"capacity must be an integer >= 2 (positions per slot), got {capacity!r}"
        )
    slots, capacity = int(slots), int(capacity)
    limit = memory if memory is not None else machine_memory()
    if position_bytes and limit:
        need = slots * capacity * int(position_bytes)
        if need > limit:
            raise InvalidInputError(
                f"slots={slots} and capacity={capacity} need a KV cache of {need} bytes "
                f"({_bytes(need)}), more than {where} ({_bytes(limit)}): load the target with "
                "fewer slots or a smaller capacity"
            )
    return slots, capacity


def check_prompt(prompt: Sequence[int], vocab_size: int) -> np.ndarray:
    """A prompt as (P,) int64 after checking it is a non-empty sequence of ids in the vocabulary."""
    array = np.asarray(prompt, dtype=np.int64) if len(prompt) else np.zeros(0, dtype=np.int64)
    if array.ndim != 1 or array.size == 0:
        raise InvalidInputError(
            f"a prompt must be a non-empty sequence of token ids, got shape {array.shape}"
        )
    if array.min() < 0 or array.max() >= vocab_size:
        raise InvalidInputError(
            f"the prompt holds token ids outside [0, {vocab_size}): {array.min()}..{array.max()}"
        )
    return array


def check_slots(
    admitted: np.ndarray, slots, *, admitted_state: bool = True, what: str
) -> np.ndarray:
    """``slots`` as (B,) int64 after checking they are distinct, in range and each admitted (or,
    with ``admitted_state=False``, free); ``admitted`` (num_slots,) bool is the target's record."""
    num_slots = len(admitted)
    slots = np.asarray(slots, dtype=np.int64).reshape(-1)
    if np.any(slots < 0) or np.any(slots >= num_slots):
        raise InvalidInputError(
            f"{what}: slots {slots.tolist()} outside [0, {num_slots}); the target was loaded "
            f"with {num_slots} slot(s) (load it with more: slots=N)"
        )
    if len(set(slots.tolist())) != len(slots):
        raise InvalidInputError(f"{what}: slots {slots.tolist()} repeat a slot")
    wrong = slots[admitted[slots] != admitted_state]
    if wrong.size:
        state = (
            "holds no request (admit one first)"
            if admitted_state
            else "already holds a request (release it first)"
        )
        raise InvalidInputError(f"{what}: slot {int(wrong[0])} {state}")
    return slots


def check_room(lengths: np.ndarray, slots: np.ndarray, size: int, capacity: int, what: str) -> None:
    """Each of ``slots`` has room for ``size`` more positions beyond its ``lengths``."""
    full = slots[lengths[slots] + size > capacity]
    if full.size:
        s = int(full[0])
        raise InvalidInputError(
            f"{what}: slot {s} holds {int(lengths[s])} positions and {size} more do not fit its "
            f"capacity of {capacity}; load the target with a larger capacity"
        )


def check_layers(layers: Sequence[int], num_layers: int) -> set[int]:
    """The decoder layers asked for, after checking they exist."""
    wanted = {int(i) for i in layers}
    if any(not 0 <= i < num_layers for i in wanted):
        raise InvalidInputError(
            f"layers {sorted(wanted)} outside the target's decoder layers 0..{num_layers - 1}"
        )
    return wanted


def check_chunks(
    context,
    admitted: np.ndarray,
    lengths: np.ndarray,
    capacity: int,
    vocab_size: int,
    tree_slots: np.ndarray,
) -> list[tuple[int, np.ndarray]]:
    """The prompt chunks of a forward as [(slot, (c,) int64 tokens)], after checking each is a
    non-empty chunk of token ids for a distinct slot that no tree row uses and that has room for
    it. A chunk's slot may be free (the chunk starts its request at position 0) or admitted (the
    chunk continues its prompt at the slot's length)."""
    chunks = []
    for item in context:
        try:
            slot, tokens = item
        except (TypeError, ValueError):
            raise InvalidInputError(f"context holds (slot, tokens) pairs, got {item!r}") from None
        if isinstance(slot, bool) or not isinstance(slot, (int, np.integer)):
            raise InvalidInputError(f"context: a chunk's slot must be an int, got {slot!r}")
        chunks.append((int(slot), check_prompt(tokens, vocab_size)))
    slots = np.array([slot for slot, _ in chunks], dtype=np.int64)
    num_slots = len(admitted)
    if np.any(slots < 0) or np.any(slots >= num_slots):
        raise InvalidInputError(
            f"context: slots {slots.tolist()} outside [0, {num_slots}); the target was loaded "
            f"with {num_slots} slot(s) (load it with more: slots=N)"
        )
    if len(set(slots.tolist()) | set(np.asarray(tree_slots).tolist())) != len(slots) + len(
        tree_slots
    ):
        raise InvalidInputError(
            f"context: slots {slots.tolist()} repeat a slot or one of the tree rows' "
            f"{np.asarray(tree_slots).tolist()}: a slot takes one chunk or one tree row per forward"
        )
    for slot, tokens in chunks:
        start = int(lengths[slot]) if admitted[slot] else 0
        if start + tokens.size > capacity:
            raise InvalidInputError(
                f"context: slot {slot} holds {start} positions and a chunk of {tokens.size} more "
                f"does not fit its capacity of {capacity}; load the target with a larger capacity"
            )
    return chunks


def check_forward(
    tree, slots, context, admitted: np.ndarray, lengths: np.ndarray, capacity: int, vocab_size: int
) -> tuple[np.ndarray, list[tuple[int, np.ndarray]], list[int]]:
    """The checks of ``forward_tree(tree, slots, context=...)``: (tree slots (B,) int64, prompt
    chunks as ``check_chunks``, each chunk's start position: its slot's length, 0 for a free
    slot)."""
    slots = (
        np.zeros(0, dtype=np.int64)
        if tree is None
        else check_slots(admitted, slots, what="forward_tree")
    )
    chunks = check_chunks(context, admitted, lengths, capacity, vocab_size, slots)
    if tree is None and not chunks:
        raise InvalidInputError("forward_tree needs a tree or at least one context chunk")
    if tree is not None:
        if tree.batch_size != len(slots):
            raise InvalidInputError(
                f"tree has {tree.batch_size} rows but {len(slots)} slots were given; "
                "pass one slot per tree row"
            )
        check_room(lengths, slots, tree.size, capacity, "forward_tree")
    return slots, chunks, [int(lengths[slot]) if admitted[slot] else 0 for slot, _ in chunks]


def admit_in_chunks(
    target,
    slot: int,
    prompt: Sequence[int],
    layers: Sequence[int],
    *,
    admitted: np.ndarray,
    lengths: np.ndarray,
    chunk: int,
    concatenate,
):
    """``TargetModel.admit`` through ``target.forward_tree``: after the checks (``admitted`` and
    ``lengths`` are the target's records), the prompt runs as context chunks of at most ``chunk``
    tokens, and their PromptOutputs are joined with ``concatenate``
    (the framework's, over axis 0)."""
    prompt = check_prompt(prompt, target.vocab_size)
    check_layers(layers, target.num_layers)
    slot = int(check_slots(admitted, [slot], admitted_state=False, what="admit")[0])
    check_room(lengths, np.array([slot]), prompt.size, target.capacity, f"admit(slot={slot})")
    parts = [
        target.forward_tree(
            None, (), context=[(slot, prompt[start : start + chunk])], layers=layers
        ).context[0]
        for start in range(0, prompt.size, chunk)
    ]
    if len(parts) == 1:
        return parts[0]
    return PromptOutput(
        logits=parts[-1].logits,
        hidden=concatenate([p.hidden for p in parts]),
        layers={i: concatenate([p.layers[i] for p in parts]) for i in parts[0].layers},
    )


def check_commit(staged_size: int | None, tree) -> None:
    """``commit(tree, verdict)``'s check that ``tree`` is the one the last ``forward_tree`` ran:
    ``staged_size`` is that tree's node count, None when no tree is staged."""
    if staged_size is None:
        raise InvalidInputError(
            "commit(tree, verdict) needs a preceding forward_tree(tree); no tree is staged"
        )
    if tree.size != staged_size:
        raise InvalidInputError(
            f"commit got a tree of {tree.size} nodes, the last forward_tree ran {staged_size}; "
            "pass the tree that was run"
        )


class SlotTarget:
    """What a target over request slots keeps around its own forward, in one place:
    ``num_slots``, ``capacity``, ``cache_lengths``, ``fingerprint`` and ``admit`` of
    ``specdec.protocols.TargetModel``.

    A subclass sets ``cache`` (with ``num_slots``, ``capacity`` and the host (num_slots,) records
    ``admitted`` (bool) and ``lengths`` (int64)), ``vocab_size`` and ``num_layers``; implements
    ``forward_tree``, ``commit`` and ``release``; and gives ``_prefill_chunk`` (prompt tokens per
    forward of ``admit``), ``_concatenate`` (its framework's, over axis 0) and
    ``_compute_fingerprint()`` (the weights' fingerprint, computed when first asked for).
    """

    _fingerprint: str | None = None
    _prefill_chunk: int = PREFILL_CHUNK

    @staticmethod
    def _concatenate(arrays):
        return np.concatenate(arrays)

    def _compute_fingerprint(self) -> str:
        raise NotImplementedError

    @property
    def num_slots(self) -> int:
        return self.cache.num_slots

    @property
    def capacity(self) -> int:
        return self.cache.capacity

    @property
    def cache_lengths(self) -> np.ndarray:
        """(num_slots,) int64: committed positions per slot (a host copy; 0 for free slots)."""
        return self.cache.lengths.copy()

    @property
    def fingerprint(self) -> str:
        """Hex sha256 over the sorted tensor names, their shapes and their float32 bytes (as the
        reference computes it), computed once."""
        if self._fingerprint is None:
            self._fingerprint = self._compute_fingerprint()
        return self._fingerprint

    def _check_layers(self, layers: Sequence[int]) -> set[int]:
        return check_layers(layers, self.num_layers)

    def admit(
        self, slot: int, prompt: Sequence[int], *, layers: Sequence[int] = ()
    ) -> PromptOutput:
        """Prefill ``prompt`` into the free ``slot``: logits (V,) at its last token, hidden (P, H)
        at every token and the outputs of decoder ``layers`` (P, H); a forward per
        ``_prefill_chunk`` tokens (``forward_tree`` with the chunk as its context)."""
        return admit_in_chunks(
            self,
            slot,
            prompt,
            layers,
            admitted=self.cache.admitted,
            lengths=self.cache.lengths,
            chunk=self._prefill_chunk,
            concatenate=self._concatenate,
        )


LOWER_OPTIONS = (
    "lower the drafter's tree options (W beams of length L make 1 + W * (L - 1) "
    "nodes, e.g. --beam-width 4 --beam-length 5)"
)


def lower_options(spec, *, lookup: bool = False) -> str:
    """How to make a drafter's trees smaller, in its own settings (``check_tree_room``'s
    ``lower``): a beam drafter's width and length (``LOWER_OPTIONS``); a tree drafter's
    ``DrafterSpec.tree_options`` (EAGLE's and EAGLE-3's trees hold total_tokens + 1 nodes);
    ``lookup``: a prompt-lookup beam rides beside it, whose length adds to the tree."""
    names = tuple(getattr(spec, "tree_options", None) or ())
    if spec is None or getattr(spec, "beam_options", False) or not names:
        advice = LOWER_OPTIONS
    elif "total_tokens" in names:
        advice = (
            f"lower the drafter's tree settings ({', '.join(names)}; its own tree holds "
            f"total_tokens + 1 nodes), e.g. total_tokens=12, depth=4 (--drafter "
            f"{spec.name}:total_tokens=12,depth=4)"
        )
    else:
        advice = f"lower the drafter's tree settings ({', '.join(names)})"
    if lookup:
        advice += (
            "; the prompt-lookup beam beside it adds its length (lookup=False or a shorter "
            "lookup, --no-lookup or --lookup-length)"
        )
    return advice


def check_tree_room(
    max_tree_size: int | None, room: int, who: str, fix: str, lower: str = LOWER_OPTIONS
) -> None:
    """A drafter whose trees hold up to ``max_tree_size`` nodes (``DrafterCaps.max_tree_size``)
    fits the ``room`` positions a slot has for the last step's tree; ``lower``: how to make its
    trees smaller, ``fix``: how to get more room."""
    if max_tree_size is not None and max_tree_size > room:
        raise InvalidInputError(
            f"{who} drafts trees of up to {max_tree_size} nodes, more than the {room} positions a "
            f"slot has for a step's draft tree: {lower}{fix}"
        )


def on_target(value, backend, target):
    """A host array, or every array of a host DraftTree, on the target's backend."""
    if isinstance(value, DraftTree):
        return DraftTree(
            **{
                f.name: None
                if getattr(value, f.name) is None
                else backend.from_numpy(np.asarray(getattr(value, f.name)), target)
                for f in attrs.fields(DraftTree)
            }
        )
    return backend.from_numpy(np.asarray(value), target)
