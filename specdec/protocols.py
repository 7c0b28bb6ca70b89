"""The contracts between the pieces of one decode step (docs/design.md section 2).

All protocols are structural (``typing.Protocol``): a class satisfies one by having the methods,
no inheritance needed. Arrays are the backend's own; shapes as in ``specdec.types``.
"""

from __future__ import annotations

from typing import Any, Protocol, Sequence, runtime_checkable

from specdec.types import Draft, DraftContext, DraftTree, SamplingConfig, TargetOutput, Verdict


@runtime_checkable
class TargetModel(Protocol):
    """The model being accelerated, with the KV cache of one batch of requests.

    Attributes ``vocab_size`` and ``hidden_size`` (ints). Drafters that share the target's
    token embedding or LM head read them through the backend's own target class.
    """

    vocab_size: int
    hidden_size: int

    def prefill(self, prompts: Sequence[Sequence[int]]) -> TargetOutput:
        """Start a new cache for these prompts (ragged lengths allowed); return logits and hidden
        state at each prompt's last position, shapes (B, 1, V) and (B, 1, H)."""

    def forward_tree(self, tree: DraftTree) -> TargetOutput:
        """Run every node of ``tree`` in one forward: node i of row b sits at position
        ``cache_length[b] + depth[b, i]`` and attends to the cache and its tree ancestors.
        Returns logits (B, N, V) and hidden (B, N, H); the cache is unchanged until commit."""

    def commit(self, tree: DraftTree, verdict: Verdict) -> None:
        """Append the KV entries of the accepted path (root included) to the cache and drop
        the rest of the tree."""


@runtime_checkable
class Drafter(Protocol):
    """Proposes candidate continuations of each row's root token.

    Optional attributes the decode loop reads: ``tree_builder = (name, options)`` (default
    ``("prefix_tree", {})``); ``sample_shape = (W, L)`` when the drafter needs uniforms in
    ``DraftContext.uniforms``; ``sampled_proposals = True`` when its beams are independent draws
    from ``Draft.draft_probs`` (the loop then verifies with rejection sampling).
    """

    def propose(self, context: DraftContext) -> Draft: ...


@runtime_checkable
class TreeBuilder(Protocol):
    """Turns a draft into the token tree the target verifies."""

    def build(self, draft: Draft) -> DraftTree: ...


@runtime_checkable
class Verifier(Protocol):
    """Chooses the accepted path and the bonus token from the target's tree logits.

    ``uniforms`` (B, D+1, W+1) float64 in [0, 1) or None when greedy: ``uniforms[b, d, 0]``
    draws the target token at depth d, ``uniforms[b, d, 1 + i]`` is the acceptance test of
    beam i at depth d (rejection-sampling verifiers).
    """

    def verify(
        self, tree: DraftTree, draft: Draft, target: TargetOutput, sampling: SamplingConfig, uniforms: Any
    ) -> Verdict: ...


@runtime_checkable
class Backend(Protocol):
    """A framework that runs targets, drafters and verifiers (numpy, torch, mlx, ...)."""

    name: str

    def load_target(self, source: Any, *, dtype: str | None, device: str | None) -> TargetModel:
        """Load a target from a local Hugging Face-format folder or a backend-native model object."""

    def to_numpy(self, array: Any) -> Any:
        """Copy a backend array to a NumPy array on the host (the one host sync of a step)."""

    def from_numpy(self, array: Any, target: TargetModel) -> Any:
        """Put a NumPy array where ``target`` computes (device and framework)."""
