"""Drafting by n-gram lookup in the row's own text (prompt lookup decoding), alone or beside a
model drafter.

Text that repeats itself (a document the answer quotes, code that reuses its identifiers, a list
that keeps its pattern) is predicted by its own past: if the last n tokens occurred before, the
token that followed them then is a good guess now. ``lookup_chain`` is that guess, extended one
token at a time over the text plus what it already drafted (an n-gram model with back-off from
``max_ngram`` to ``min_ngram``, the most recent occurrence winning). It costs no model call.

Where the row's text has no match, a store of the model's own answers (``specdec.drafting.store``,
``store=``; shipped for some models, used by default when lookup drafts alone) continues it
instead: what the target tends to say after the same words.

``LookupDrafter`` drafts the chain alone (``drafter="lookup"``) or adds it as one more beam to a
beam drafter's draft (``specdec.generate(..., lookup=True)``): the prefix tree shares whatever
the chain has in common with the model's beams, and verification keeps the output lossless
because the greedy and exact verifiers accept only what the target itself would produce.
The draft is deterministic, so it cannot be verified by multi-draft rejection sampling, which
needs sampled beams and their draft distributions.
"""

from __future__ import annotations

from typing import Any, Sequence

import attrs
import numpy as np

from specdec.capabilities import DrafterCaps, drafter_caps
from specdec.drafting.none import PassLifecycle
from specdec.errors import InvalidInputError
from specdec.reference.tree import check_beam_lengths
from specdec.types import Draft, DraftContext

DEFAULT_MAX_NGRAM = 3
DEFAULT_MIN_NGRAM = 2
DEFAULT_DRAFT_LENGTH = (
    10  # measured: benchmarks/README.md, "The prompt-lookup beam at its own length"
)
# tokens drafted when only the last token occurred before (no match of min_ngram or more);
# measured: benchmarks/README.md, "A short chain where only the last token matches"
DEFAULT_UNIGRAM_LENGTH = 3


def check_length(name: str, value: Any, *, least: int) -> None:
    """Raise InvalidInputError unless ``value`` is an integer >= ``least``."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < least:
        raise InvalidInputError(f"lookup {name} must be an integer >= {least}, got {value!r}")


def check_ngram_sizes(max_ngram: int, min_ngram: int) -> None:
    """Raise InvalidInputError unless 1 <= min_ngram <= max_ngram."""
    for name, value in (("max_ngram", max_ngram), ("min_ngram", min_ngram)):
        check_length(name, value, least=1)
    if min_ngram > max_ngram:
        raise InvalidInputError(
            f"lookup min_ngram ({min_ngram}) must not exceed max_ngram ({max_ngram})"
        )


def next_token_by_lookup(tokens: np.ndarray, *, max_ngram: int, min_ngram: int) -> int | None:
    """The token that followed the most recent earlier occurrence of the longest suffix of
    ``tokens`` (T,) with between ``min_ngram`` and ``max_ngram`` tokens; None if none occurred.

    Example: tokens = [5, 6, 7, 5, 6], max_ngram=2 -> suffix [5, 6] occurred at 0, followed by 7.
    """
    for n in range(min(max_ngram, len(tokens) - 1), min_ngram - 1, -1):
        suffix = tokens[-n:]
        # windows[i] = tokens[i : i + n] for every i whose window ends before the last token
        windows = np.lib.stride_tricks.sliding_window_view(tokens[:-1], n)  # (T - n, n)
        starts = np.flatnonzero((windows == suffix).all(axis=1))
        if len(starts):
            return int(tokens[starts[-1] + n])
    return None


def lookup_chain(
    history: np.ndarray,
    length: int,
    *,
    max_ngram: int = DEFAULT_MAX_NGRAM,
    min_ngram: int = DEFAULT_MIN_NGRAM,
) -> np.ndarray:
    """Up to ``length`` tokens continuing ``history`` (T,) int: each is ``next_token_by_lookup``
    of the history plus the tokens chosen before it. Shorter (possibly empty) only when the
    history's own suffix never occurred before: once one token is found, the suffix that ends
    with it occurred one position later, so the chain always reaches ``length``.

    The same tokens as ``lookup_chain_reference`` (property-tested), found by searching the
    history's bytes (``bytearray.rfind``, 4 bytes per token) instead of comparing every window:
    a step drafts a 10-token chain over a few hundred tokens in tens of microseconds instead of
    about a millisecond.
    """
    tokens = np.asarray(history, dtype=np.int64)
    if len(tokens) and (tokens.min() < 0 or tokens.max() >= 2**31):
        return lookup_chain_reference(tokens, length, max_ngram=max_ngram, min_ngram=min_ngram)
    text, count, chain = bytearray(tokens.astype("<i4").tobytes()), len(tokens), []
    for _ in range(length):
        token = _next_token_in_bytes(text, count, max_ngram, min_ngram)
        if token is None:
            break
        chain.append(token)
        text += token.to_bytes(4, "little")
        count += 1
    return np.array(chain, dtype=np.int64)


def _next_token_in_bytes(text: bytearray, count: int, max_ngram: int, min_ngram: int) -> int | None:
    """``next_token_by_lookup`` over ``count`` tokens stored as little-endian int32 in ``text``."""
    for n in range(min(max_ngram, count - 1), min_ngram - 1, -1):
        suffix = bytes(text[(count - n) * 4 :])
        end = (count - 1) * 4  # an occurrence must end before the last token
        while (at := text.rfind(suffix, 0, end)) >= 0:
            if at % 4 == 0:  # on a token boundary: the most recent occurrence
                return int.from_bytes(text[at + 4 * n : at + 4 * n + 4], "little")
            end = at + len(suffix) - 1  # a match across token boundaries: look before it
    return None


def lookup_chain_reference(
    history: np.ndarray,
    length: int,
    *,
    max_ngram: int = DEFAULT_MAX_NGRAM,
    min_ngram: int = DEFAULT_MIN_NGRAM,
) -> np.ndarray:
    """``lookup_chain``'s readable twin: ``next_token_by_lookup`` applied ``length`` times."""
    tokens = np.asarray(history, dtype=np.int64)
    chain: list[int] = []
    for _ in range(length):
        token = next_token_by_lookup(tokens, max_ngram=max_ngram, min_ngram=min_ngram)
        if token is None:
            break
        chain.append(token)
        tokens = np.append(tokens, token)
    return np.array(chain, dtype=np.int64)


def row_chain(
    history: np.ndarray,
    length: int,
    *,
    max_ngram: int,
    min_ngram: int,
    unigram_length: int,
    store=None,
) -> np.ndarray:
    """A row's lookup chain: ``length`` tokens where the history's last ``min_ngram`` or more
    tokens occurred before; else, with an answer ``store``, its chain (``AnswerStore.chain``,
    up to ``length`` tokens) where it finds one; else, where the history's last token occurred
    before, ``min(unigram_length, length)`` tokens by the same rule down to one-token suffixes
    (a guess that is right less often, so kept short); else none.

    Example: history [7, 8, 9, 7] with min_ngram=2: no earlier "9 7", but 7 occurred at 0, so
    the chain follows it: 8, 9, 7, ... cut at unigram_length tokens.
    """
    chain = lookup_chain(history, length, max_ngram=max_ngram, min_ngram=min_ngram)
    if len(chain) == 0 and store is not None:
        chain = store.chain(history, length)
    if len(chain) or min_ngram == 1 or unigram_length == 0:
        return chain
    return lookup_chain(history, min(unigram_length, length), max_ngram=max_ngram, min_ngram=1)


def lookup_beams(
    histories: Sequence[np.ndarray],
    length: int,
    *,
    max_ngram: int,
    min_ngram: int,
    unigram_length: int,
    fallback: np.ndarray,
    store=None,
) -> tuple[np.ndarray, np.ndarray]:
    """One lookup beam per row: (B, 1, length) int64 beams, and (B,) int64 their lengths (the
    root counted; 1 where the row found nothing). ``fallback`` (B, length): each row's beam
    where its chain does not reach (the root repeated); its first column is the root. A row
    whose history does not end with its root has finished (the loop stopped recording its
    tokens) and keeps its fallback."""
    beams = np.array(fallback, dtype=np.int64, copy=True)[:, None, :]  # (B, 1, L)
    lengths = np.ones(len(histories), dtype=np.int64)
    for b, history in enumerate(histories):
        if len(history) == 0 or history[-1] != beams[b, 0, 0]:
            continue
        chain = row_chain(
            history,
            length - 1,
            max_ngram=max_ngram,
            min_ngram=min_ngram,
            unigram_length=unigram_length,
            store=store,
        )
        beams[b, 0, 1 : 1 + len(chain)] = chain
        lengths[b] = 1 + len(chain)
    return beams, lengths


class LookupDrafter(PassLifecycle):
    """Prompt lookup drafting, alone (``inner=None``) or beside a beam drafter.

    backend: the Backend whose arrays the draft must hold (``from_numpy``), target: its target.
    inner: a Drafter whose drafts have beams (B, W, L); the lookup chain of ``draft_length``
        tokens becomes beam W, of its own length (``Draft.beam_lengths``): a long chain beside
        short model beams costs only its own nodes; where the chain is an n-gram match
        (``step_kind`` 1) it is beam 0 instead, ahead of the model's. A row without a match gets
        a beam of the root alone, which the prefix tree folds away. Without ``inner`` the draft
        is the chain alone, (B, 1, longest chain + 1) greedy and (B, 1, draft_length + 1) when
        sampling; a greedy step in which no row finds a match drafts nothing (the root alone, a
        plain step), and rows without a match otherwise repeat their root (so a row's seeded
        sample does not depend on whether other rows of its batch found a match).
    unigram_length: the chain's length where only the last token occurred before (``row_chain``;
        0: no chain there).
    store: an ``AnswerStore`` that continues a row whose text has no match (``row_chain``), or
        None.
    """

    def __init__(
        self,
        backend: Any,
        target: Any,
        *,
        inner: Any = None,
        draft_length: int = DEFAULT_DRAFT_LENGTH,
        max_ngram: int = DEFAULT_MAX_NGRAM,
        min_ngram: int = DEFAULT_MIN_NGRAM,
        unigram_length: int = DEFAULT_UNIGRAM_LENGTH,
        store=None,
    ):
        check_ngram_sizes(max_ngram, min_ngram)
        check_length("draft_length", draft_length, least=1)
        check_length("unigram_length", unigram_length, least=0)
        inner_caps = None if inner is None else drafter_caps(inner)
        if inner_caps is not None and inner_caps.sampled_proposals:
            raise InvalidInputError(
                "lookup cannot join a drafter that samples its beams (sample=True): its beams are "
                "verified by multi-draft rejection sampling, which needs every beam drawn from a "
                "draft distribution; drop sample=True (the exact verifier then keeps sampling "
                "lossless) or drop lookup"
            )
        self.backend, self.target, self.inner = backend, target, inner
        self.draft_length, self.max_ngram, self.min_ngram, self.unigram_length = (
            int(draft_length),
            int(max_ngram),
            int(min_ngram),
            int(unigram_length),
        )
        self.store = store
        # beams per draft, and their length (for reports)
        self.beam_width = 1 + getattr(inner, "beam_width", 0)
        self.beam_length = getattr(inner, "beam_length", self.draft_length + 1)
        # Beside a drafter, its needs (a stateful one keeps its lifecycle: LookupDrafter passes it
        # on).
        self.caps = (
            DrafterCaps(max_tree_size=self.draft_length + 1)
            if inner_caps is None
            else attrs.evolve(
                inner_caps,
                max_tree_size=None
                if inner_caps.max_tree_size is None
                else inner_caps.max_tree_size + self.draft_length,
            )
        )

    def propose(self, context: DraftContext) -> Draft:
        if context.history is None:
            raise ValueError("LookupDrafter needs context.history (the decode loop provides it)")
        if context.want_draft_probs:
            raise InvalidInputError(
                "lookup drafts are deterministic and have no draft distribution, which this "
                "verifier needs; use the 'greedy' or 'exact' verifier (the defaults) with lookup"
            )
        if self.inner is None:
            return self._propose_alone(context)
        draft = self.inner.propose(context)
        if draft.beams is None:
            raise InvalidInputError(
                f"lookup joins drafters that propose beams; {type(self.inner).__name__} proposes "
                "head top-k tokens (a static tree, e.g. Medusa): use it without lookup, or use "
                "drafter='lookup' alone"
            )
        return self._join(draft, context)

    def _join(self, draft: Draft, context: DraftContext) -> Draft:
        """``draft``'s beams (B, W, L) and the lookup chain as beam W: (B, W + 1, L') beams with
        their lengths, L' = max(L, the longest chain + 1) greedy, max(L, draft_length + 1) when
        sampling (the shape never depends on the batch then, see ``_chains``)."""
        beams = self.backend.to_numpy(draft.beams)  # (B, W, L)
        length = beams.shape[2]
        lengths = check_beam_lengths(draft.beam_lengths, beams.shape)  # (B, W): L each when None
        chains, chain_lengths = self._chains(context, beams[:, 0, 0])
        size = max(length, chains.shape[2])
        joined = np.concatenate([_pad(beams, size), _pad(chains, size)], axis=1)  # (B, W + 1, size)
        lengths = np.concatenate([lengths, chain_lengths[:, None]], axis=1)
        leads = np.array([self._matches(h) for h in context.history], dtype=bool)
        if leads.any():  # the chain first: a tree cut short keeps it (``step_kind``)
            width = joined.shape[1]
            order = np.where(leads[:, None], np.roll(np.arange(width), 1), np.arange(width))
            joined = np.take_along_axis(joined, order[:, :, None], axis=1)
            lengths = np.take_along_axis(lengths, order, axis=1)
        return Draft(
            root_tokens=draft.root_tokens,
            beams=self.backend.from_numpy(joined, self.target),
            sampled=False,
            beam_lengths=lengths,
        )

    def step_kind(self, history: np.ndarray) -> int:
        """1 where the row's text ends with ``min_ngram`` or more tokens that occurred before (its
        chain is then an n-gram match, and leads the tree beside a model's beams), else 0
        (``specdec.protocols.StepKinds``): over MT-Bench, ReDrafter's trees with the chain
        accepted 2.7 drafted tokens a step where it matched and 0.9 where it did not, and most
        of the first came from the chain, which a tree cut to a few nodes lost while it came
        last. Beside a drafter that has kinds of its own, 2 x its kind + this one."""
        matched = int(self._matches(history))
        inner = getattr(self.inner, "step_kind", None)
        if inner is None:
            return matched
        kind = inner(history)
        if isinstance(kind, bool) or not isinstance(kind, (int, np.integer)) or kind < 0:
            raise InvalidInputError(
                f"{type(self.inner).__name__}.step_kind must return a non-negative integer (the "
                f"kind of a request's coming step), got {kind!r}"
            )
        return 2 * int(kind) + matched

    def _matches(self, history: np.ndarray) -> bool:
        """Whether the row's chain is an n-gram match (``step_kind``)."""
        found = lookup_chain(history, 1, max_ngram=self.max_ngram, min_ngram=self.min_ngram)
        return len(found) > 0

    def _chains(self, context: DraftContext, roots: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Every row's chain as a beam (B, 1, L) and its length (B,) (1: no chain). Greedy, L is
        the longest chain's; when sampling, the draft keeps its shape (``draft_length + 1``): a
        shorter draft would change how many random numbers each row draws, and so a row's sample
        would depend on the rest of the batch. A row's beam length is its own chain's whatever
        the others found: its root repeated, verified where another row's chain made the draft
        long, made a request's drafts depend on what shared its step."""
        length = self.draft_length + 1
        beams, lengths = lookup_beams(
            context.history,
            length,
            max_ngram=self.max_ngram,
            min_ngram=self.min_ngram,
            unigram_length=self.unigram_length,
            fallback=np.repeat(roots[:, None], length, axis=1),
            store=self.store,
        )
        if context.sampling.greedy:
            beams = beams[:, :, : lengths.max(initial=1)]  # (B, 1, 1) where no row found any
        return beams, lengths

    def _propose_alone(self, context: DraftContext) -> Draft:
        roots = np.asarray(self.backend.to_numpy(context.root_tokens), dtype=np.int64)  # (B,)
        beams, lengths = self._chains(context, roots)
        return Draft(
            root_tokens=context.root_tokens,
            beams=self.backend.from_numpy(beams, self.target),
            sampled=False,
            beam_lengths=lengths[:, None],
        )


def _pad(beams: np.ndarray, length: int) -> np.ndarray:
    """beams (B, W, L) int64 extended to (B, W, length) by repeating each beam's last column
    (padding past the beams' lengths, which no tree builder reads)."""
    return np.pad(beams, ((0, 0), (0, 0), (0, length - beams.shape[2])), mode="edge")
