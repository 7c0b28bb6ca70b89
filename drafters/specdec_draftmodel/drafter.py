"""The draft-model drafter: a smaller model with the target's tokenizer drafts a chain of K tokens.

The draft model is loaded as a second target on the target's own backend (``Backend.load_target``
with the target's dtype, device, slots and capacity), so this one class runs on every backend
through the ``TargetModel`` contract alone: ``admit`` when a request begins, ``forward_tree`` to
draft, ``commit`` what the target accepted, ``release`` when the request ends. Arrays cross
between host and backend only through ``backend.to_numpy`` / ``backend.from_numpy``.

Drafting, per step (docs/algorithms/draft-model.md): the root r is not yet in either cache.
Forward k (k = 1..K) runs the chain r, d1, ..., d(k-1) through the draft model and takes the
logits of its last node: d(k) is their argmax (ties to the lowest id) or, when sampling with
``sample=True``, a draw from ``target_probs(logits, sampling)`` with the loop's uniform
``uniforms[b, 0, k-1]``. A target's tree entries are scratch until ``commit`` (there is no
rollback of committed entries), so each forward recomputes the chain: K forwards of 1..K nodes,
K(K+1)/2 node-forwards per step, cheap next to the target for small K.

After the target's step, ``observe`` commits the same tokens into the draft's cache: the longest
prefix of the accepted tokens that the last chain forward holds (root, d1, ..., d(K-1)) is
committed from that forward; whatever remains (d(K) when every drafted token was accepted, or
tokens of another beam, e.g. a prompt-lookup beam beside this one) runs through one more chain
forward and is committed from it. The draft cache therefore always holds exactly the target's
committed text.
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
    lengths = np.full(batch, size, dtype=np.int64) if lengths is None else np.asarray(lengths, dtype=np.int64)
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
    return DraftTree(tokens=np.where(real, tokens, 0), parents=parents.astype(np.int64), depth=depth.astype(np.int64),
                     ancestor_mask=mask, num_nodes=lengths.copy())


class DraftModelDrafter:
    """Drafts a chain of ``draft_length`` tokens per row with a draft model's own KV cache.

    backend: the Backend both models run on. target: the target (its vocabulary size is checked
    against the draft's). draft: the draft model, a TargetModel loaded by ``backend`` with the
    target's slots and capacity. draft_length: K >= 1 tokens per step. sample: when decoding
    samples, draw the chain from the draft model's distribution (verified by rejection sampling,
    exact in distribution); False drafts the greedy chain (verified by the exact tree walk).
    """

    def __init__(self, backend: Any, target: Any, draft: Any, *, draft_length: int = 4, sample: bool = True,
                 label: str = "the draft model"):
        if isinstance(draft_length, bool) or not isinstance(draft_length, (int, np.integer)) or draft_length < 1:
            raise InvalidInputError(f"drafter {NAME!r}: draft_length must be an integer >= 1, got {draft_length!r}")
        if not isinstance(sample, (bool, np.bool_)):
            raise InvalidInputError(f"drafter {NAME!r}: sample must be True or False, got {sample!r}")
        if int(draft.vocab_size) != int(target.vocab_size):
            raise InvalidInputError(
                f"drafter {NAME!r}: {label} scores {draft.vocab_size} tokens and the target {target.vocab_size}; "
                "the draft model must use the target's tokenizer")
        self.backend, self.target, self.draft, self.label = backend, target, draft, label
        self.draft_length, self.sample = int(draft_length), bool(sample)
        self.beam_width, self.beam_length = 1, self.draft_length + 1  # one chain of K tokens after the root
        self._lengths: dict[int, int] = {}  # slot -> positions committed in the draft's cache
        self._last: tuple[np.ndarray, np.ndarray, DraftTree] | None = None  # slots, chains (B, K+1), last forward's tree

    @property
    def caps(self) -> DrafterCaps:
        return DrafterCaps(stateful=True, sample_shape=(1, self.draft_length) if self.sample else None,
                           sampled_proposals=self.sample)

    # -- the request lifecycle -------------------------------------------------------------------

    def begin(self, slot: int, prompt, output) -> None:
        slot = int(slot)
        self.draft.admit(slot, [int(t) for t in np.asarray(prompt).reshape(-1)])
        self._lengths[slot] = int(np.asarray(prompt).size)

    def end(self, slot: int) -> None:
        slot = int(slot)
        if self._lengths.pop(slot, None) is not None:  # a request whose begin failed holds no draft slot
            self.draft.release(slot)

    @property
    def open_slots(self) -> tuple[int, ...]:
        """Slots admitted into the draft model and not yet released."""
        return tuple(sorted(self._lengths))

    # -- drafting --------------------------------------------------------------------------------

    def _on_backend(self, tree: DraftTree) -> DraftTree:
        put = lambda a: self.backend.from_numpy(np.asarray(a), self.draft)  # noqa: E731
        return DraftTree(tokens=put(tree.tokens), parents=put(tree.parents), depth=put(tree.depth),
                         ancestor_mask=put(tree.ancestor_mask), num_nodes=put(tree.num_nodes))

    def _check_room(self, slots: np.ndarray, size: int) -> None:
        for slot in slots.tolist():
            if slot not in self._lengths:
                raise PluginOutputError(f"drafter {NAME!r}: propose for slot {slot}, which no request began in")
            if self._lengths[slot] + size > int(self.draft.capacity):
                raise InvalidInputError(
                    f"drafter {NAME!r}: slot {slot} holds {self._lengths[slot]} positions and a chain of "
                    f"draft_length={self.draft_length} needs {size} more, beyond the capacity of "
                    f"{self.draft.capacity} it shares with the target; load the target with a larger capacity "
                    "or use a smaller draft_length")

    def propose(self, context: DraftContext) -> Draft:
        if context.slots is None:
            raise InvalidInputError(f"drafter {NAME!r} keeps a cache per request and needs context.slots "
                                    "(the decode loop gives them)")
        slots = np.asarray(context.slots, dtype=np.int64).reshape(-1)
        length = self.draft_length
        self._check_room(slots, length)
        roots = np.asarray(self.backend.to_numpy(context.root_tokens)).astype(np.int64).reshape(-1)  # (B,)
        sampled = self.sample and not context.sampling.greedy
        if sampled and context.uniforms is None:
            raise InvalidInputError(f"drafter {NAME!r} samples its chain and needs context.uniforms (B, 1, "
                                    f"{length}) (the decode loop draws them for caps.sample_shape)")
        keep_probs = sampled or context.want_draft_probs
        chains = np.zeros((len(roots), length + 1), dtype=np.int64)
        chains[:, 0] = roots
        probs = None
        tree = None
        for k in range(1, length + 1):
            tree = self._on_backend(chain_tree(chains[:, :k]))  # root, d1 .. d(k-1)
            output = self.draft.forward_tree(tree, slots)
            logits = np.asarray(self.backend.to_numpy(output.logits[:, k - 1]), dtype=np.float64)  # (B, V)
            if keep_probs:
                q = target_probs(logits, context.sampling)
                if probs is None:
                    probs = np.zeros((len(roots), length, q.shape[-1]), dtype=np.float64)
                probs[:, k - 1] = q
            if sampled:
                chains[:, k] = sample_from(probs[:, k - 1], np.asarray(context.uniforms)[:, 0, k - 1])
            else:
                chains[:, k] = np.argmax(logits, axis=-1)  # ties to the lowest id
        self._last = (slots.copy(), chains, tree)
        on_target = lambda a: self.backend.from_numpy(a, self.target)  # noqa: E731
        return Draft(root_tokens=context.root_tokens, beams=on_target(chains[:, None, :]),
                     draft_probs=None if probs is None else on_target(probs[:, None]), sampled=sampled)

    # -- keeping the draft's cache in step with the target's -------------------------------------

    def observe(self, accepted) -> None:
        slots = np.asarray(accepted.slots, dtype=np.int64).reshape(-1)
        if self._last is None or not np.array_equal(self._last[0], slots):
            raise PluginOutputError(
                f"drafter {NAME!r}: observe for slots {slots.tolist()} does not follow a propose for the same rows "
                f"({None if self._last is None else self._last[0].tolist()}); it commits into its cache from its "
                "last draft")
        _, chains, tree = self._last
        self._last = None
        tokens = np.asarray(accepted.tokens, dtype=np.int64)
        num_accepted = np.asarray(accepted.num_accepted, dtype=np.int64).reshape(-1)
        batch, in_tree = len(slots), tree.size  # the last forward holds root, d1 .. d(K-1)
        if np.any(tokens[:, 0] != chains[:, 0]):
            raise PluginOutputError(f"drafter {NAME!r}: the committed roots {tokens[:, 0].tolist()} are not the "
                                    f"roots it drafted from {chains[:, 0].tolist()}")
        matched = np.zeros(batch, dtype=np.int64)  # accepted tokens that are the chain's, within the last tree
        for b in range(batch):
            limit = min(int(num_accepted[b]), in_tree - 1)
            while matched[b] < limit and tokens[b, 1 + matched[b]] == chains[b, 1 + matched[b]]:
                matched[b] += 1
        path = np.where(np.arange(in_tree)[None, :] <= matched[:, None], np.arange(in_tree)[None, :], -1)
        self._commit(tree, path, matched)
        rest = num_accepted - matched  # accepted tokens the draft has not run yet
        rows = np.flatnonzero(rest > 0)
        if len(rows):
            size = int(rest[rows].max())
            pending = np.zeros((len(rows), size), dtype=np.int64)
            for i, b in enumerate(rows):
                pending[i, : rest[b]] = tokens[b, 1 + matched[b] : 1 + num_accepted[b]]
            catch_up = self._on_backend(chain_tree(pending, rest[rows]))
            self.draft.forward_tree(catch_up, slots[rows])
            steps = np.arange(size)[None, :]
            self._commit(catch_up, np.where(steps < rest[rows][:, None], steps, -1), rest[rows] - 1)
        for b, slot in enumerate(slots.tolist()):
            self._lengths[slot] += int(num_accepted[b]) + 1

    def _commit(self, tree: DraftTree, path: np.ndarray, num_accepted: np.ndarray) -> None:
        """Commit ``path`` (B, n), -1 past ``num_accepted[b]``, of the draft's last forward ``tree``."""
        put = lambda a: self.backend.from_numpy(np.asarray(a, dtype=np.int64), self.draft)  # noqa: E731
        bonus = np.zeros(len(num_accepted), dtype=np.int64)  # commit reads no bonus: the next root is not cached
        self.draft.commit(tree, Verdict(path=put(path), num_accepted=put(num_accepted), bonus_tokens=put(bonus)))
