"""The contracts between the pieces of one decode step (docs/design.md section 2).

All protocols are structural (``typing.Protocol``): a class satisfies one by having the methods,
no inheritance needed. Arrays are the backend's own; shapes as in ``specdec.types``.
"""

from __future__ import annotations

from typing import Any, Protocol, Sequence, runtime_checkable

from specdec.capabilities import DrafterCaps, VerifierCaps
from specdec.types import (
    Accepted,
    Draft,
    DraftContext,
    DraftTree,
    PromptOutput,
    SamplingConfig,
    TargetOutput,
    Verdict,
)


@runtime_checkable
class TargetModel(Protocol):
    """The model being accelerated, with the KV cache of ``num_slots`` requests.

    Each slot holds one request's committed keys and values, preallocated for ``capacity``
    positions when the target is loaded (never grown by copying). A request is admitted into a
    free slot, decoded by tree forwards over the slots of the active requests, and released.
    Attributes: ``vocab_size``, ``hidden_size``, ``num_layers``, ``num_slots``, ``capacity``
    (ints) and ``eos_token_ids`` (tuple of ints, may be empty). Drafters that share the
    target's token embedding or LM head read them through the backend's own target class.
    """

    vocab_size: int
    hidden_size: int
    num_layers: int
    num_slots: int
    capacity: int
    eos_token_ids: tuple[int, ...]

    def admit(
        self, slot: int, prompt: Sequence[int], *, layers: Sequence[int] = ()
    ) -> PromptOutput:
        """Prefill ``prompt`` into the free ``slot`` (0 <= slot < num_slots) and return its
        PromptOutput (logits at the last position, hidden states at every position, and the
        outputs of decoder ``layers``). Other slots are untouched."""

    def forward_tree(
        self, tree: DraftTree, slots: Any, *, layers: Sequence[int] = ()
    ) -> TargetOutput:
        """Run every node of ``tree`` in one forward; row b belongs to slot ``slots[b]`` ((B,)
        int64 NumPy, distinct admitted slots): node i sits at position ``length[slot] +
        depth[b, i]`` and attends to the slot's cache and its tree ancestors. Returns logits
        (B, N, V), hidden (B, N, H) and the outputs of decoder ``layers``; no cache entry
        changes until commit."""

    def commit(self, tree: DraftTree, verdict: Verdict) -> None:
        """Append the KV entries of the accepted path (root included) to the cache of each
        row's slot (those of the last forward_tree) and drop the rest of the tree."""

    def release(self, slot: int) -> None:
        """Free ``slot``: its request is done (or cancelled); it can be admitted into again."""


@runtime_checkable
class Drafter(Protocol):
    """Proposes candidate continuations of each row's root token.

    ``caps`` (``specdec.DrafterCaps``) declares what the loop needs to know: the tree builder
    its drafts are for, the uniforms it draws, whether its beams are sampled, whether it keeps
    per-request state (then it is also a ``RequestObserver``).
    """

    caps: DrafterCaps

    def propose(self, context: DraftContext) -> Draft: ...


@runtime_checkable
class RequestObserver(Protocol):
    """The lifecycle of a stateful drafter (``DrafterCaps.stateful``): per request, ``begin``
    once, then per step ``propose`` and ``observe``, and ``end`` once. A draft model or a
    feature-level drafter keeps its own cache here, keyed by slot (docs/writing-a-drafter.md,
    "Stateful drafters")."""

    def begin(self, slot: int, prompt: Any, output: PromptOutput) -> None:
        """A request's prompt is in ``slot``: prompt (P,) int64 NumPy and the target's
        PromptOutput for it (with ``caps.prompt_states``, the default: hidden states of every
        prompt position and the layers in ``caps.hidden_layers``; without, those of its last
        position only). Its first token is the root of its first draft."""

    def observe(self, accepted: Accepted) -> None:
        """What the last step committed for each of its rows (tokens, hidden states)."""

    def end(self, slot: int, reason: str) -> None:
        """The request in ``slot`` ended; drop its state. ``reason``: its finish reason, "stop"
        (a stop token or string), "length" (``max_new_tokens``), "cancelled" or "error". An
        ``end(slot)`` without the reason is still called, with the slot alone."""


@runtime_checkable
class SlotView(Protocol):
    """Optional, for stateful drafters: what the state kept for a slot stands for, so that the
    conformance kit can hold it to the request (``specdec.testing.checks.check_slot_views``)."""

    def slot_tokens(self, slot: int) -> Sequence[int]:
        """The tokens the state of the request in ``slot`` covers, in order: its prompt (after
        ``begin``), then every token ``observe`` committed (each step's root and accepted
        drafted tokens, not the bonus token, which is the next step's root). At a ``propose``
        that is the row's ``DraftContext.history`` without its last token."""


@runtime_checkable
class StepKinds(Protocol):
    """Optional, for any drafter: sorts a request's coming step into kinds before it drafts, from
    the row's text alone and cheaply (it runs for every decoding request, drafting or not).
    ``speculation="auto"`` then learns the acceptance of each kind apart, per request and over
    requests, and decides each step on its kind's. The prompt-lookup beam's kinds: 1 where the
    text ends with an n-gram that occurred before (its chain then leads the tree), 0 elsewhere;
    over MT-Bench its trees accepted 2.7 drafted tokens in steps of kind 1 and 0.9 in the rest
    (docs/serving-internals.md, "Steps of two kinds")."""

    def step_kind(self, history: Any) -> int:
        """history (T,) int64 NumPy, read-only: the request's prompt and every token emitted so
        far (its last is the coming draft's root). A small non-negative integer; a drafter
        without this method has steps of kind 0 alone."""


@runtime_checkable
class TreeBuilder(Protocol):
    """Turns a draft into the token tree the target verifies."""

    def build(self, draft: Draft) -> DraftTree: ...


@runtime_checkable
class Verifier(Protocol):
    """Chooses the accepted path and the bonus token from the target's tree logits.

    ``caps`` (``specdec.VerifierCaps``) declares whether it reads the drafter's distributions.

    ``uniforms`` (B, D+1, W+1) float64 in [0, 1) or None when greedy: ``uniforms[b, d, 0]``
    draws the target token at depth d, ``uniforms[b, d, 1 + i]`` is the acceptance test of
    beam i at depth d (rejection-sampling verifiers).
    """

    caps: VerifierCaps

    def verify(
        self,
        tree: DraftTree,
        draft: Draft,
        target: TargetOutput,
        sampling: SamplingConfig,
        uniforms: Any,
    ) -> Verdict: ...


@runtime_checkable
class Backend(Protocol):
    """A framework that runs targets, drafters and verifiers (numpy, torch, mlx, ...)."""

    name: str

    def load_target(
        self,
        source: Any,
        *,
        dtype: str | None,
        device: str | None,
        slots: int = 1,
        capacity: int | None = None,
    ) -> TargetModel:
        """Load a target from a local Hugging Face-format folder or a backend-native model object,
        with ``slots`` request slots of ``capacity`` positions each (None: the model's context
        length)."""

    def to_numpy(self, array: Any) -> Any:
        """Copy a backend array to a NumPy array on the host (the one host sync of a step)."""

    def from_numpy(self, array: Any, target: TargetModel) -> Any:
        """Put a NumPy array where ``target`` computes (device and framework)."""
