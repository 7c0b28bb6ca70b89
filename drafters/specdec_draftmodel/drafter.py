"""The draft-model drafter: a smaller model with the target's tokenizer drafts a chain of K tokens.

The draft model is loaded as a second target on the target's own backend (``Backend.load_target``
with the target's dtype, device, slots and capacity), so this one class runs on every backend
through the ``TargetModel`` contract alone: ``admit`` when a request begins, ``forward_tree`` to
draft and ``commit`` what is certain, ``release`` when the request ends. Arrays cross between
host and backend only through ``backend.to_numpy`` / ``backend.from_numpy``.

The draft's cache holds only text the target committed: a target's tree entries are scratch
until ``commit``, and committed entries are never rolled back, so drafted tokens cannot be kept
while they are unverified. Per step (docs/algorithms/draft-model.md), with root r:

- forward 1 runs the chain p1 .. pm, r, where p1 .. pm are the tokens the target accepted in the
  previous step (recorded by ``observe``; none after ``begin``). All of them are certain, so the
  chain is committed at once; its logits at r give d1.
- forward k (k = 2..K) runs the chain d1 .. d(k-1) after the cache; its last logits give d(k).
  These entries stay scratch: each forward recomputes the chain, K forwards per step in all.

d(k) is the argmax of the logits (ties to the lowest id) or, when sampling with ``sample=True``,
a draw from ``target_probs(logits, sampling)`` with the loop's uniform ``uniforms[b, 0, k-1]``.
``observe`` only records which drafted tokens were accepted (the root and the bonus are handled
by the next step), whichever beam they came from (a prompt-lookup beam beside the chain too).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from specdec.capabilities import DrafterCaps
from specdec.errors import InvalidInputError, PluginOutputError
from specdec.reference.sampling import sample_from, target_probs
from specdec.types import Draft, DraftContext, DraftTree, Verdict

NAME = "draft_model"


def chain_tree(tokens: np.ndarray, lengths: np.ndarray | None = None) -> DraftTree:
    """A DraftTree of one chain per row: tokens (B, n) int64, row b's first ``lengths[b]`` tokens
    (all n when None) as nodes 0..lengths[b]-1, each the child of the one before (depth = index,
    a lower-triangular ancestor mask); the rest are padding nodes of token 0 hanging off the root,
    as ``specdec.reference.tree.build_prefix_tree`` pads. For a full row this is exactly
    ``build_prefix_tree(tokens[:, None, :])`` without ``beam_to_node``."""
    tokens = np.asarray(tokens, dtype=np.int64)
    batch, size = tokens.shape
    lengths = (
        np.full(batch, size, dtype=np.int64)
        if lengths is None
        else np.asarray(lengths, dtype=np.int64)
    )
    index = np.arange(size)
    real = index[None, :] < lengths[:, None]  # (B, n)
    parents = np.where(real, index[None, :] - 1, 0)
    parents[:, 0] = -1
    depth = np.where(real, index[None, :], 1)
    depth[:, 0] = 0
    chain_mask = np.tril(np.ones((size, size), dtype=bool))  # node i attends to nodes 0..i
    mask = np.where(real[:, :, None], chain_mask[None] & real[:, None, :], False)
    pad_rows = ~real
    mask[:, :, 0] |= pad_rows  # a padding node attends to the root ...
    mask[:, index, index] |= pad_rows  # ... and to itself
    return DraftTree(
        tokens=np.where(real, tokens, 0),
        parents=parents.astype(np.int64),
        depth=depth.astype(np.int64),
        ancestor_mask=mask,
        num_nodes=lengths.copy(),
    )


class _Request:
    """A request's draft state: ``length`` positions committed in the draft's cache, ``pending``
    tokens the target committed that the draft has not yet run, between a propose and its
    observe the committed ``root`` and its logits (a repeated propose reuses them), and
    ``tokens``: the prompt and every token the target committed since (``slot_tokens``)."""

    __slots__ = ("length", "pending", "root", "root_logits", "tokens")

    def __init__(self, tokens: list[int]):
        self.length, self.pending, self.root, self.root_logits = len(tokens), [], None, None
        self.tokens = list(tokens)


class DraftModelDrafter:
    """Drafts a chain of ``draft_length`` tokens per row with a draft model's own KV cache.

    backend: the Backend both models run on. target: the target (its vocabulary size is checked
    against the draft's). draft: the draft model, a TargetModel loaded by ``backend`` with the
    target's slots and capacity. draft_length: K >= 1 tokens per step. sample: when decoding
    samples, draw the chain from the draft model's distribution (verified by rejection sampling,
    exact in distribution); False drafts the greedy chain (verified by the exact tree walk).
    """

    def __init__(
        self,
        backend: Any,
        target: Any,
        draft: Any,
        *,
        draft_length: int = 4,
        sample: bool = True,
        label: str = "the draft model",
    ):
        if (
            isinstance(draft_length, bool)
            or not isinstance(draft_length, (int, np.integer))
            or draft_length < 1
        ):
            raise InvalidInputError(
                f"drafter {NAME!r}: draft_length must be an integer >= 1, got {draft_length!r}"
            )
        if not isinstance(sample, (bool, np.bool_)):
            raise InvalidInputError(
                f"drafter {NAME!r}: sample must be True or False, got {sample!r}"
            )
        if int(draft.vocab_size) != int(target.vocab_size):
            raise InvalidInputError(
                f"drafter {NAME!r}: {label} scores {draft.vocab_size} tokens and the target "
                f"{target.vocab_size}; the draft model must use the target's tokenizer"
            )
        self.backend, self.target, self.draft, self.label = backend, target, draft, label
        self.draft_length, self.sample = int(draft_length), bool(sample)
        # one chain of K tokens after the root
        self.beam_width, self.beam_length = (
            1,
            self.draft_length + 1,
        )
        self._requests: dict[int, _Request] = {}  # slot -> its draft state

    @property
    def caps(self) -> DrafterCaps:
        return DrafterCaps(
            stateful=True,
            sample_shape=(1, self.draft_length) if self.sample else None,
            sampled_proposals=self.sample,
            max_tree_size=self.draft_length + 1,
        )

    # -- the request lifecycle -------------------------------------------------------------------

    def begin(self, slot: int, prompt, output) -> None:
        tokens = [int(t) for t in np.asarray(prompt).reshape(-1)]
        self.draft.admit(int(slot), tokens)
        self._requests[int(slot)] = _Request(tokens)

    def observe(self, accepted) -> None:
        """Record, per row, the drafted tokens the target accepted (any beam's): they are run and
        committed with the next root, in the next propose's first forward. A row that did not
        draft this step (no propose: its budget was 0) commits its root alone, which waits
        with the others."""
        tokens = np.asarray(accepted.tokens, dtype=np.int64)
        for b, (slot, count) in enumerate(
            zip(np.asarray(accepted.slots).tolist(), np.asarray(accepted.num_accepted).tolist())
        ):
            request = self._request(slot, "observe")
            # a step in which this row did not draft: its root waits too
            if request.root is None and count == 0:
                request.pending.append(int(tokens[b, 0]))
                request.tokens.append(int(tokens[b, 0]))
                continue
            if request.root is None or int(tokens[b, 0]) != request.root:
                raise PluginOutputError(
                    f"drafter {NAME!r}: observe for slot {slot} commits root {int(tokens[b, 0])}, "
                    f"but the drafter proposed from {request.root}; observe must follow the "
                    "propose of the same step"
                )
            request.pending = tokens[b, 1 : 1 + int(count)].tolist()
            request.tokens += tokens[b, : 1 + int(count)].tolist()  # the root and accepted tokens
            request.root = request.root_logits = None

    def end(self, slot: int, reason: str) -> None:
        """The request in ``slot`` ended (any ``reason``): free its slot of the draft model."""
        # a request whose begin failed holds no draft slot
        if self._requests.pop(int(slot), None) is not None:
            self.draft.release(int(slot))

    def slot_tokens(self, slot: int) -> tuple:
        """The text the draft state of ``slot`` stands for: the prompt and every token the target
        committed since (``specdec.protocols.SlotView``); the draft model runs the last of them
        with the next root."""
        return tuple(self._request(int(slot), "slot_tokens").tokens)

    @property
    def open_slots(self) -> tuple[int, ...]:
        """Slots admitted into the draft model and not yet released."""
        return tuple(sorted(self._requests))

    def _request(self, slot: int, what: str) -> _Request:
        if slot not in self._requests:
            raise PluginOutputError(
                f"drafter {NAME!r}: {what} for slot {slot}, which no request began in"
            )
        return self._requests[slot]

    # -- drafting --------------------------------------------------------------------------------

    def _on_backend(self, tree: DraftTree) -> DraftTree:
        put = lambda a: self.backend.from_numpy(np.asarray(a), self.draft)  # noqa: E731
        return DraftTree(
            tokens=put(tree.tokens),
            parents=put(tree.parents),
            depth=put(tree.depth),
            ancestor_mask=put(tree.ancestor_mask),
            num_nodes=put(tree.num_nodes),
        )

    def _check_room(self, slot: int, request: _Request) -> None:
        needed = (
            (0 if request.root is not None else len(request.pending) + 1) + self.draft_length - 1
        )
        if request.length + needed > int(self.draft.capacity):
            raise InvalidInputError(
                f"drafter {NAME!r}: slot {slot} holds {request.length} positions and a chain of "
                f"draft_length={self.draft_length} needs {needed} more, beyond the capacity of "
                f"{self.draft.capacity} it shares with the target; load the target with a larger "
                "capacity or use a smaller draft_length"
            )

    def _commit_and_score_roots(self, slots: np.ndarray, roots: np.ndarray) -> None:
        """Forward 1 for ``slots`` (rows without a committed root): run pending + root, commit all
        of it, keep the logits at the root."""
        requests = [self._requests[s] for s in slots.tolist()]
        lengths = np.array([len(r.pending) + 1 for r in requests], dtype=np.int64)
        chains = np.zeros((len(slots), int(lengths.max())), dtype=np.int64)
        for i, (request, root) in enumerate(zip(requests, roots.tolist())):
            chains[i, : lengths[i]] = request.pending + [root]
        tree = self._on_backend(chain_tree(chains, lengths))
        output = self.draft.forward_tree(tree, slots)
        at_root = (
            self.backend.from_numpy(np.arange(len(slots)), self.draft),
            self.backend.from_numpy(lengths - 1, self.draft),
        )
        # (B', V)
        logits = np.asarray(self.backend.to_numpy(output.logits[at_root]), dtype=np.float64)
        steps = np.arange(chains.shape[1])[None, :]
        put = lambda a: self.backend.from_numpy(  # noqa: E731
            np.asarray(a, dtype=np.int64), self.draft
        )
        self.draft.commit(
            tree,
            Verdict(
                path=put(np.where(steps < lengths[:, None], steps, -1)),
                num_accepted=put(lengths - 1),
                bonus_tokens=put(np.zeros(len(slots))),
            ),
        )
        for i, (request, root) in enumerate(zip(requests, roots.tolist())):
            request.length += int(lengths[i])
            request.pending, request.root, request.root_logits = [], root, logits[i]

    def propose(self, context: DraftContext) -> Draft:
        if context.slots is None:
            raise InvalidInputError(
                f"drafter {NAME!r} keeps a cache per request and needs context.slots "
                "(the decode loop gives them)"
            )
        slots = np.asarray(context.slots, dtype=np.int64).reshape(-1)
        # (B,)
        roots = np.asarray(self.backend.to_numpy(context.root_tokens)).astype(np.int64).reshape(-1)
        requests = [self._request(s, "propose") for s in slots.tolist()]
        for slot, request, root in zip(slots.tolist(), requests, roots.tolist()):
            if request.root is not None and request.root != root:
                raise PluginOutputError(
                    f"drafter {NAME!r}: propose for slot {slot} from root {root} before the "
                    f"observe of the step drafted from root {request.root}"
                )
            self._check_room(slot, request)
        fresh = np.array([r.root is None for r in requests])
        if fresh.any():
            self._commit_and_score_roots(slots[fresh], roots[fresh])
        length = self.draft_length
        sampled = self.sample and not context.sampling.greedy
        if sampled and context.uniforms is None:
            raise InvalidInputError(
                f"drafter {NAME!r} samples its chain and needs context.uniforms (B, 1, "
                f"{length}) (the decode loop draws them for caps.sample_shape)"
            )
        keep_probs = sampled or context.want_draft_probs
        chains = np.zeros((len(roots), length + 1), dtype=np.int64)
        chains[:, 0] = roots
        probs = None
        for k in range(1, length + 1):
            if k == 1:
                logits = np.stack([r.root_logits for r in requests])  # (B, V), from forward 1
            else:  # d1 .. d(k-1) after the committed root
                output = self.draft.forward_tree(
                    self._on_backend(chain_tree(chains[:, 1:k])), slots
                )
                logits = np.asarray(
                    self.backend.to_numpy(output.logits[:, k - 2]), dtype=np.float64
                )
            if keep_probs:
                q = target_probs(logits, context.sampling)
                if probs is None:
                    probs = np.zeros((len(roots), length, q.shape[-1]), dtype=np.float64)
                probs[:, k - 1] = q
            if sampled:
                chains[:, k] = sample_from(
                    probs[:, k - 1], np.asarray(context.uniforms)[:, 0, k - 1]
                )
            else:
                chains[:, k] = np.argmax(logits, axis=-1)  # ties to the lowest id
        on_target = lambda a: self.backend.from_numpy(a, self.target)  # noqa: E731
        return Draft(
            root_tokens=context.root_tokens,
            beams=on_target(chains[:, None, :]),
            draft_probs=None if probs is None else on_target(probs[:, None]),
            sampled=sampled,
        )
