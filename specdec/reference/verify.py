"""Verifiers: the accepted path and the bonus token of one step (float64 reference).

Every verifier is a per-row algorithm that walks the draft tree from the root (node 0, the
last emitted token). ``target.logits[b, u]`` is the target's distribution for the child of
node u; probabilities always come from ``specdec.reference.sampling.target_probs``.

The algorithms draw their randomness only through a ``Chooser``:
``chooser.categorical(probs, depth)`` samples a token at a node of that depth and
``chooser.accept(probability, depth, beam)`` is a coin that comes up True with that
probability. ``verify`` wraps each row of ``uniforms`` (B, D+1, W+1) into a
``UniformChooser`` (``uniforms[b, d, 0]`` draws the token at depth d through ``sample_from``,
``uniforms[b, d, 1 + i]`` tests beam i's token at depth d+1), or uses ``GreedyChooser`` when
``uniforms`` is None (greedy decoding). Tests substitute a chooser that explores every branch
with its exact probability, which is how exactness is proved by enumeration.

This module holds the exact rules (greedy, tree walk, multi-draft rejection); the lossy ones
(ReDrafter's published rule, Medusa's typical acceptance) live in ``verify_lossy``, which
imports the helpers here.
See docs/algorithms/verification.md for worked examples.
"""

from __future__ import annotations

from typing import Any, Protocol

import numpy as np

from specdec.capabilities import VerifierRule
from specdec.errors import InvalidInputError
from specdec.reference.sampling import greedy_tokens, sample_from, target_probs
from specdec.types import Draft, DraftTree, SamplingConfig, TargetOutput, Verdict


class Chooser(Protocol):
    """The only source of randomness of a per-row verifier."""

    def categorical(self, probs: np.ndarray, depth: int) -> int:
        """A token drawn from ``probs`` (V,) (non-negative, need not be normalised)."""

    def accept(self, probability: float, depth: int, beam: int) -> bool:
        """True with ``probability``: the test of ``beam``'s drafted token at depth+1."""


class UniformChooser:
    """Draws from one row of uniforms, shape (D+1, W+1) float64 in [0, 1)."""

    def __init__(self, uniforms: np.ndarray):
        self.uniforms = uniforms

    def categorical(self, probs: np.ndarray, depth: int) -> int:
        return int(sample_from(probs, self.uniforms[depth, 0]))

    def accept(self, probability: float, depth: int, beam: int) -> bool:
        return bool(self.uniforms[depth, 1 + beam] < probability)


class GreedyChooser:
    """Greedy decoding: the most likely token (lowest id on ties); a coin is accepted only when
    every uniform in [0, 1) would accept it (probability >= 1)."""

    def categorical(self, probs: np.ndarray, depth: int) -> int:
        return int(greedy_tokens(probs))

    def accept(self, probability: float, depth: int, beam: int) -> bool:
        return bool(probability >= 1.0)


# ----------------------------------------------------------------------------------------
# Tree and probability helpers (one row at a time)


def tree_depth(tree: DraftTree) -> int:
    """D, the largest depth of a real (unpadded) node over the batch."""
    return max(int(np.max(tree.depth[b, : int(tree.num_nodes[b])])) for b in range(tree.batch_size))


def num_beams(draft: Draft | None) -> int:
    """W, the number of beams of a draft (0 for head-token drafts)."""
    return 0 if draft is None or draft.beams is None else int(draft.beams.shape[1])


def children_of(tree: DraftTree, b: int, node: int) -> list[int]:
    """The real children of ``node`` in row b, in node order (padded nodes are never children)."""
    return [i for i in range(1, int(tree.num_nodes[b])) if int(tree.parents[b, i]) == node]


def child_with_token(tree: DraftTree, b: int, node: int, token: int) -> int | None:
    """The first child of ``node`` (node order) whose token is ``token``, or None."""
    for child in children_of(tree, b, node):
        if int(tree.tokens[b, child]) == token:
            return child
    return None


def beam_nodes(tree: DraftTree, draft: Draft, b: int) -> np.ndarray:
    """The node of every beam token of row b, shape (W, L) int64.

    Taken from ``tree.beam_to_node`` when the tree builder recorded it, else found by walking
    each beam down the tree.
    """
    if tree.beam_to_node is not None:
        return np.asarray(tree.beam_to_node[b], dtype=np.int64)
    beams = np.asarray(draft.beams[b])
    width, length = beams.shape
    nodes = np.zeros((width, length), dtype=np.int64)
    for i in range(width):
        for k in range(1, length):
            child = child_with_token(tree, b, int(nodes[i, k - 1]), int(beams[i, k]))
            if child is None:
                raise InvalidInputError(
                    f"beam {i} of row {b} ({beams[i].tolist()}) is not a path of the draft tree"
                )
            nodes[i, k] = child
    return nodes


def acceptance_probability(
    residual_probs: np.ndarray, draft_probs: np.ndarray, token: int
) -> float:
    """min(1, residual_probs[token] / draft_probs[token]); a token the drafter gave no mass is
    accepted when the target gives it some (the ratio is infinite) and rejected otherwise."""
    numerator = float(residual_probs[token])
    denominator = float(draft_probs[token])
    if denominator <= 0.0:
        return 1.0 if numerator > 0.0 else 0.0
    return min(1.0, numerator / denominator)


def subtract_draft(residual_probs: np.ndarray, draft_probs: np.ndarray) -> np.ndarray:
    """normalize(max(residual_probs - draft_probs, 0)), the distribution left after a rejection.

    Both (V,). If nothing is left (the two were equal, so the rejection had probability 0 and
    only rounding got us here) the residual is returned unchanged.
    """
    leftover = np.maximum(residual_probs - draft_probs, 0.0)
    mass = leftover.sum()
    if mass <= 0.0:
        return residual_probs
    return leftover / mass


def entropy(probs: np.ndarray) -> float:
    """Shannon entropy in nats of probs (V,), with 0 log 0 = 0."""
    mass = probs[probs > 0]
    return float(-(mass * np.log(mass)).sum())


def make_verdict(paths: list[list[int]], bonus_tokens: list[int], depth: int) -> Verdict:
    """Pack per-row paths (root first) into a Verdict with path (B, depth+1), -1 padded."""
    path = np.full((len(paths), depth + 1), -1, dtype=np.int64)
    for b, nodes in enumerate(paths):
        path[b, : len(nodes)] = nodes
    return Verdict(
        path=path,
        num_accepted=np.array([len(nodes) - 1 for nodes in paths], dtype=np.int64),
        bonus_tokens=np.array(bonus_tokens, dtype=np.int64),
    )


# ----------------------------------------------------------------------------------------
# The batch wrapper shared by every verifier


def check_verifier_inputs(
    verifier, tree: DraftTree, draft: Draft, target: TargetOutput, *, backend: str = ""
) -> None:
    """Shape-only checks every backend's verifiers make (no device reads): logits match the tree,
    and the draft carries what ``verifier.needs_draft_probs`` / ``needs_sampled_draft`` ask for."""
    name = f"{backend} {type(verifier).__name__}".strip()
    batch, size = tree.tokens.shape
    if tuple(target.logits.shape[:2]) != (batch, size):
        raise InvalidInputError(
            f"{name}: target.logits must have shape (B, N, V) = ({batch}, {size}, V) to match the "
            f"tree, got {tuple(target.logits.shape)}"
        )
    if verifier.needs_draft_probs and (
        draft is None or draft.beams is None or draft.draft_probs is None
    ):
        raise InvalidInputError(f"{name} needs a Draft with beams and draft_probs (B, W, L-1, V)")
    if getattr(verifier, "needs_sampled_draft", False) and not draft.sampled:
        raise InvalidInputError(
            f"{name} is exact only for beams drawn from draft_probs (Draft.sampled=True); "
            "use ExactTreeVerifier for deterministic drafts such as beam search"
        )


def check_uniform_shape(
    verifier,
    shape,
    sampling: SamplingConfig,
    batch: int,
    depth: int,
    width: int,
    *,
    backend: str = "",
) -> None:
    """Uniforms are needed unless greedy, and must be at least (B, D+1, W+1) (or (B, D+1, 1) for
    verifiers that draw no per-beam tests)."""
    name = f"{backend} {type(verifier).__name__}".strip()
    if shape is None:
        if not sampling.greedy:
            raise InvalidInputError(
                f"{name}: uniforms (B, D+1, W+1) are needed when temperature > 0"
            )
        return
    columns = 1 + width if verifier.uses_beam_uniforms else 1
    if len(shape) != 3 or shape[0] != batch or shape[1] < depth + 1 or shape[2] < columns:
        raise InvalidInputError(
            f"{name}: uniforms must have shape (B, D+1, W+1) = ({batch}, {depth + 1}, "
            f"{1 + width}), got {tuple(shape)}"
        )


class RowVerifier(VerifierRule):
    """Runs ``verify_row`` on every row with that row's chooser (subclasses define the rule and
    set the class attributes of ``specdec.capabilities.VerifierRule``)."""

    def verify(
        self,
        tree: DraftTree,
        draft: Draft,
        target: TargetOutput,
        sampling: SamplingConfig,
        uniforms: Any,
    ) -> Verdict:
        """tree (B, N); target.logits (B, N, V); uniforms (B, D+1, W+1) float64 or None when
        greedy. Returns the Verdict: path (B, D+1), num_accepted (B,), bonus_tokens (B,)."""
        self.check_inputs(tree, draft, target)
        depth = tree_depth(tree)
        if self.uses_uniforms:
            uniforms = self.check_uniforms(
                uniforms, sampling, tree.batch_size, depth, num_beams(draft)
            )
        else:
            uniforms = None
        paths, bonus_tokens = [], []
        for b in range(tree.batch_size):
            chooser = GreedyChooser() if uniforms is None else UniformChooser(uniforms[b])
            path, bonus = self.verify_row(tree, draft, target, sampling, b, chooser)
            paths.append(path)
            bonus_tokens.append(bonus)
        return make_verdict(paths, bonus_tokens, depth)

    def verify_row(
        self,
        tree: DraftTree,
        draft: Draft,
        target: TargetOutput,
        sampling: SamplingConfig,
        b: int,
        chooser: Chooser,
    ) -> tuple[list[int], int]:
        """Row b: the accepted node path (root first) and the bonus token."""
        raise NotImplementedError

    def check_inputs(self, tree: DraftTree, draft: Draft, target: TargetOutput) -> None:
        check_verifier_inputs(self, tree, draft, target)

    def check_uniforms(
        self, uniforms: Any, sampling: SamplingConfig, batch: int, depth: int, width: int
    ) -> Any:
        check_uniform_shape(
            self, None if uniforms is None else np.shape(uniforms), sampling, batch, depth, width
        )
        return None if uniforms is None else np.asarray(uniforms, dtype=np.float64)


def node_probs(target: TargetOutput, sampling: SamplingConfig, b: int, node: int) -> np.ndarray:
    """target_probs of the child of ``node`` in row b, (V,) float64."""
    return target_probs(np.asarray(target.logits[b, node], dtype=np.float64), sampling)


# ----------------------------------------------------------------------------------------
# The exact rules


class GreedyVerifier(RowVerifier):
    """Greedy decoding: follow the target's argmax while it is a drafted child.

    At node u, x = argmax(logits[u]) (lowest id on ties); if x is the token of a child of u,
    descend to it, else stop and emit x as the bonus. The output is exactly plain greedy
    decoding of the target. It ignores temperature, top-k and top-p (use it when greedy).
    ReDrafter's greedy rule (the beam with the longest prefix matching the argmax) picks the
    same path on a prefix tree.
    """

    lossless = True
    uses_uniforms = False

    def verify_row(self, tree, draft, target, sampling, b, chooser):
        path = [0]
        while True:
            token = int(greedy_tokens(np.asarray(target.logits[b, path[-1]], dtype=np.float64)))
            child = child_with_token(tree, b, path[-1], token)
            if child is None:
                return path, token
            path.append(child)


class ExactTreeVerifier(RowVerifier):
    """The exact tree walk for any draft tree fixed before the target's randomness.

    At node u of depth d, sample x from target_probs(logits[u]) with ``uniforms[b, d, 0]``; if
    x is a drafted child token of u, descend to that child, else emit x as the bonus and stop.
    Every emitted token is a sample of the target's conditional, whatever was drafted, so
    the output distribution is the target's (docs/design.md section 3). The rule for deterministic
    proposals (beam search, top-k heads); at temperature 0 it is GreedyVerifier.
    """

    lossless = True

    def verify_row(self, tree, draft, target, sampling, b, chooser):
        path = [0]
        while True:
            node = path[-1]
            token = chooser.categorical(
                node_probs(target, sampling, b, node), int(tree.depth[b, node])
            )
            child = child_with_token(tree, b, node, token)
            if child is None:
                return path, token
            path.append(child)


class RejectionVerifier(RowVerifier):
    """Multi-draft recursive rejection sampling on the prefix tree of sampled beams.

    Needs ``Draft.sampled``: each beam's tokens drawn from ``draft_probs`` independently of the
    other beams. At node u of depth d, residual_probs starts as target_probs(logits[u]); the
    beams through u propose their next token x = beams[b, i, d+1] in increasing beam index,
    drawn from draft_probs[b, i, d] (the drafter's distribution at u). Beam i's token is
    accepted with probability min(1, residual_probs[x] / draft_probs[x]) (coin
    ``uniforms[b, d, 1+i]``): descend to its child and restart there. On rejection
    residual_probs <- normalize(max(residual_probs - draft_probs, 0)); a later duplicate of a
    rejected token then has no residual mass and is rejected too. When every beam is rejected,
    or no beam goes deeper, the bonus is drawn from residual_probs with ``uniforms[b, d, 0]``.

    Exact because the proposals at u are i.i.d. draws from draft_probs given the tree above u,
    and one round of rejection sampling turns (residual, proposal) into an exact sample of the
    residual; the continuations below the accepted child are fresh independent draws.
    """

    lossless = True
    needs_draft_probs = True
    needs_sampled_draft = True
    uses_beam_uniforms = True

    def verify_row(self, tree, draft, target, sampling, b, chooser):
        nodes = beam_nodes(tree, draft, b)  # (W, L)
        beams = np.asarray(draft.beams[b])  # (W, L)
        draft_probs = np.asarray(draft.draft_probs[b], dtype=np.float64)  # (W, L-1, V)
        width, length = beams.shape
        path = [0]
        while True:
            node = path[-1]
            depth = len(path) - 1
            residual_probs = node_probs(target, sampling, b, node)
            accepted = None
            if depth + 1 < length:
                for i in range(width):
                    if nodes[i, depth] != node:
                        continue
                    token = int(beams[i, depth + 1])
                    probability = acceptance_probability(
                        residual_probs, draft_probs[i, depth], token
                    )
                    if chooser.accept(probability, depth, i):
                        accepted = int(nodes[i, depth + 1])
                        break
                    residual_probs = subtract_draft(residual_probs, draft_probs[i, depth])
            if accepted is None:
                return path, chooser.categorical(residual_probs, depth)
            path.append(accepted)
