"""Exactness by enumeration: the emitted tokens have exactly the target's distribution.

Not a Monte Carlo estimate. A tiny target (prefix -> logits, V = 2..4) and a tiny drafter
(prefix -> draft probs) are functions of the prefix. For one speculative step, every random
choice of a verifier is enumerated through an enumerating chooser, each branch with its exact
probability; for sampled drafts every possible draft is enumerated too. The emitted tokens are
extended with the target's own conditionals to a fixed length, and the resulting distribution
over sequences must equal the target's joint to 1e-12 (float64). Lossy rules are shown to
differ by a stated total-variation distance.
"""

from __future__ import annotations

import itertools
from functools import lru_cache

import numpy as np
import pytest

from specdec.reference.sampling import target_probs
from specdec.reference.tree import build_prefix_tree
from specdec.reference.verify import ExactTreeVerifier, GreedyVerifier, RejectionVerifier
from specdec.reference.verify_lossy import RedrafterPublishedVerifier, TypicalVerifier
from specdec.testing.enumeration import enumerate_outcomes
from specdec.types import Draft, SamplingConfig, TargetOutput

TOLERANCE = 1e-12

SAMPLINGS = {
    "t1": SamplingConfig(temperature=1.0),
    "t0.7-k2": SamplingConfig(temperature=0.7, top_k=2),
    "t1.5-p0.7": SamplingConfig(temperature=1.5, top_p=0.7),
    "t0.5-k3-p0.8": SamplingConfig(temperature=0.5, top_k=3, top_p=0.8),
    "greedy": SamplingConfig(temperature=0.0),
}


# ----------------------------------------------------------------------------------------
# A tiny world: target and drafter as functions of the prefix


class World:
    """target_logits(prefix) -> (V,) and draft_probs(prefix) -> (V,), seeded by the prefix.

    Random Dirichlet probabilities with about a third of the target's entries (a sixth of the
    drafter's) set to zero (logit -inf), so supports differ between prefixes and between target
    and drafter. ``table`` overrides
    the target probabilities of given prefixes (constructed cases).
    """

    def __init__(
        self, seed: int, vocab: int, table: dict | None = None, draft_table: dict | None = None
    ):
        self.seed, self.vocab = seed, vocab
        self.table, self.draft_table = table or {}, draft_table or {}

    def _random_probs(self, tag: int, prefix: tuple[int, ...], zero_fraction: float) -> np.ndarray:
        rng = np.random.default_rng([self.seed, tag, len(prefix), *prefix])
        probs = rng.dirichlet(np.ones(self.vocab))
        keep = rng.random(self.vocab) >= zero_fraction
        keep[np.argmax(probs)] = True
        return np.where(keep, probs, 0.0) / np.where(keep, probs, 0.0).sum()

    def target_logits(self, prefix: tuple[int, ...]) -> np.ndarray:
        probs = (
            np.asarray(self.table[prefix])
            if prefix in self.table
            else self._random_probs(1, prefix, 1 / 3)
        )
        return np.where(probs > 0, np.log(np.where(probs > 0, probs, 1.0)), -np.inf)

    def draft_probs(self, prefix: tuple[int, ...]) -> np.ndarray:
        if prefix in self.draft_table:
            return np.asarray(self.draft_table[prefix], dtype=np.float64)
        return self._random_probs(2, prefix, 1 / 6)


@lru_cache(maxsize=None)
def _conditional(world: World, sampling: SamplingConfig, prefix: tuple[int, ...]) -> np.ndarray:
    return target_probs(world.target_logits(prefix), sampling)


def continuations(world, sampling, prefix, length) -> dict[tuple[int, ...], float]:
    """The target's joint over the next ``length`` tokens after ``prefix``
    (zero-probability sequences left out)."""
    if length == 0:
        return {(): 1.0}
    out = {}
    probs = _conditional(world, sampling, prefix)
    for token in np.flatnonzero(probs > 0):
        for rest, weight in continuations(
            world, sampling, prefix + (int(token),), length - 1
        ).items():
            out[(int(token),) + rest] = probs[token] * weight
    return out


# ----------------------------------------------------------------------------------------
# One speculative step, enumerated


def path_tokens(tree, node: int) -> tuple[int, ...]:
    """Tokens from below the root down to ``node`` (row 0)."""
    tokens = []
    while node > 0:
        tokens.append(int(tree.tokens[0, node]))
        node = int(tree.parents[0, node])
    return tuple(reversed(tokens))


def step_distribution(
    verifier, world, sampling, context, beams, draft_probs=None, sampled=False, length=None
):
    """Distribution of the next ``length`` tokens: one verified step, then the target's own
    conditionals. beams (W, L) with beams[:, 0] == context[-1]."""
    beams = np.asarray(beams, dtype=np.int64)[None]  # (1, W, L)
    length = length or beams.shape[2]
    tree = build_prefix_tree(beams)
    logits = np.stack(
        [world.target_logits(context + path_tokens(tree, u)) for u in range(tree.size)]
    )[None]
    target = TargetOutput(logits=logits, hidden=np.zeros(logits.shape[:2] + (1,)))
    draft = Draft(
        root_tokens=beams[:, 0, 0],
        beams=beams,
        draft_probs=None if draft_probs is None else np.asarray(draft_probs)[None],
        sampled=sampled,
    )
    outcomes = enumerate_outcomes(
        lambda chooser: verifier.verify_row(tree, draft, target, sampling, 0, chooser)
    )
    total = sum(weight for _, weight in outcomes)
    assert abs(total - 1.0) < TOLERANCE, (
        f"{type(verifier).__name__}: enumerated branches sum to {total}"
    )
    out: dict[tuple[int, ...], float] = {}
    for (path, bonus), weight in outcomes:
        emitted = tuple(int(tree.tokens[0, u]) for u in path[1:]) + (int(bonus),)
        rest = length - len(emitted)
        assert rest >= 0, f"{type(verifier).__name__} emitted {emitted}, more than {length} tokens"
        for tail, tail_weight in continuations(world, sampling, context + emitted, rest).items():
            out[emitted + tail] = out.get(emitted + tail, 0.0) + weight * tail_weight
    return out


def sampled_drafts(world, context, width, length):
    """Every draft of ``width`` beams drawn independently from the drafter:
    (beams, draft_probs, probability)."""
    chains = []  # one beam: (tokens after the root, draft_probs (L-1, V), probability)
    for tokens in itertools.product(range(world.vocab), repeat=length - 1):
        probs = [world.draft_probs(context + tokens[:k]) for k in range(length - 1)]
        weight = float(np.prod([probs[k][tokens[k]] for k in range(length - 1)]))
        if weight > 0:
            chains.append((tokens, np.array(probs).reshape(length - 1, world.vocab), weight))
    for combo in itertools.product(chains, repeat=width):
        beams = np.array([(context[-1],) + tokens for tokens, _, _ in combo])  # (W, L)
        yield (
            beams,
            np.stack([probs for _, probs, _ in combo]),
            float(np.prod([w for _, _, w in combo])),
        )


def sampled_step_distribution(verifier, world, sampling, context, width, length):
    out: dict[tuple[int, ...], float] = {}
    for beams, draft_probs, weight in sampled_drafts(world, context, width, length):
        for seq, p in step_distribution(
            verifier, world, sampling, context, beams, draft_probs, sampled=True
        ).items():
            out[seq] = out.get(seq, 0.0) + weight * p
    return out


def max_error(got: dict, expected: dict) -> float:
    return max(abs(got.get(k, 0.0) - expected.get(k, 0.0)) for k in set(got) | set(expected))


def total_variation(got: dict, expected: dict) -> float:
    return 0.5 * sum(abs(got.get(k, 0.0) - expected.get(k, 0.0)) for k in set(got) | set(expected))


# ----------------------------------------------------------------------------------------
# Deterministic drafts (beam search, top-k): fixed beam sets after the root


BEAM_SETS = {
    "root-only": [[]],
    "chain": [[0, 1]],
    "shared-prefix": [[0, 1], [0, 2]],
    "duplicates": [[1, 1], [1, 1], [2, 0]],
    "all-first-tokens": [[0], [1], [2]],
    "two-branches": [[2, 2], [0, 2], [2, 1]],
    "deep-chain": [[0, 1, 1, 0]],
    "deep-branches": [[1, 0, 1, 1], [1, 0, 0, 1], [0, 1, 1, 0]],
}
CONTEXT = (1, 2)  # the root is token 2


@pytest.mark.parametrize("vocab, seed", [(3, 0), (3, 1), (4, 2)])
@pytest.mark.parametrize("beam_set", list(BEAM_SETS))
@pytest.mark.parametrize("sampling", list(SAMPLINGS))
def test_exact_tree_verifier_is_exact_for_fixed_beams(sampling, beam_set, vocab, seed):
    world = World(seed, vocab)
    beams = [[CONTEXT[-1], *beam] for beam in BEAM_SETS[beam_set]]
    length = len(beams[0])
    got = step_distribution(
        ExactTreeVerifier(), world, SAMPLINGS[sampling], CONTEXT, beams, length=length + 1
    )
    expected = continuations(world, SAMPLINGS[sampling], CONTEXT, length + 1)
    error = max_error(got, expected)
    assert error < TOLERANCE, (
        f"ExactTreeVerifier, {sampling}, beams {beams}, V={vocab}, seed {seed}: max error "
        f"{error:.3g}"
    )


@pytest.mark.parametrize("beam_set", list(BEAM_SETS))
@pytest.mark.parametrize("sampling", ["t1", "t0.7-k2"])
def test_greedy_verifier_emits_the_argmax_sequence_with_probability_one(sampling, beam_set):
    world = World(3, 3)
    beams = [[CONTEXT[-1], *beam] for beam in BEAM_SETS[beam_set]]
    got = step_distribution(GreedyVerifier(), world, SAMPLINGS["greedy"], CONTEXT, beams)
    argmax_sequence = continuations(world, SAMPLINGS["greedy"], CONTEXT, len(beams[0]))
    assert len(argmax_sequence) == 1 and got == pytest.approx(argmax_sequence, abs=TOLERANCE), (
        f"GreedyVerifier, beams {beams}: {got} != argmax sequence {argmax_sequence}"
    )
    # The rule reads no randomness: even under a sampling config it is still the argmax sequence.
    tree = build_prefix_tree(np.array(beams)[None])
    logits = np.stack(
        [world.target_logits(CONTEXT + path_tokens(tree, u)) for u in range(tree.size)]
    )[None]
    target = TargetOutput(logits=logits, hidden=np.zeros(logits.shape[:2] + (1,)))
    draft = Draft(root_tokens=np.array([CONTEXT[-1]]), beams=np.array(beams)[None])
    outcomes = enumerate_outcomes(
        lambda chooser: GreedyVerifier().verify_row(
            tree, draft, target, SAMPLINGS[sampling], 0, chooser
        )
    )
    assert len(outcomes) == 1 and outcomes[0][1] == 1.0, (
        f"GreedyVerifier, {sampling}: one outcome, got {outcomes}"
    )


# ----------------------------------------------------------------------------------------
# Sampled drafts: every draft enumerated with its probability

SAMPLED_SHAPES = [
    (3, 1, 3),
    (3, 2, 2),
    (3, 2, 3),
    (3, 3, 2),
    (4, 2, 2),
    (2, 3, 3),  # (V, W, L)
    (2, 1, 5),
    (2, 2, 4),
    (2, 2, 5),
]  # deeper chains: 4 drafted tokens, every draft enumerated


@pytest.mark.parametrize("vocab, width, length", SAMPLED_SHAPES)
@pytest.mark.parametrize("sampling", ["t1", "t0.7-k2", "t1.5-p0.7", "greedy"])
@pytest.mark.parametrize("verifier", [RejectionVerifier(), ExactTreeVerifier()], ids=type)
def test_verifiers_are_exact_for_sampled_drafts(verifier, sampling, vocab, width, length):
    world = World(10 + vocab, vocab)
    context = (0, 1)
    got = sampled_step_distribution(verifier, world, SAMPLINGS[sampling], context, width, length)
    expected = continuations(world, SAMPLINGS[sampling], context, length)
    error = max_error(got, expected)
    assert error < TOLERANCE, (
        f"{type(verifier).__name__}, {sampling}, V={vocab} W={width} L={length}: max error "
        f"{error:.3g}"
    )


def test_rejection_verifier_is_exact_when_the_drafter_is_the_target():
    """A model drafting for itself (draft_probs = target_probs at temperature 1) stays exact."""
    world = World(20, 3)
    world.draft_probs = lambda prefix: target_probs(world.target_logits(prefix), SAMPLINGS["t1"])
    got = sampled_step_distribution(RejectionVerifier(), world, SAMPLINGS["t1"], (0, 1), 1, 3)
    error = max_error(got, continuations(world, SAMPLINGS["t1"], (0, 1), 3))
    assert error < TOLERANCE, f"RejectionVerifier, self-drafting, max error {error:.3g}"


# ----------------------------------------------------------------------------------------
# The lossy rules differ from the target


def test_redrafter_published_is_exact_only_for_one_sampled_beam():
    """With one sampled beam the published rule is plain speculative sampling (exact); with two
    it is not, and with deterministic beams it is not."""
    world = World(30, 3)
    verifier, sampling, context = RedrafterPublishedVerifier(), SAMPLINGS["t1"], (0, 1)
    expected = continuations(world, sampling, context, 3)
    one_beam = sampled_step_distribution(verifier, world, sampling, context, 1, 3)
    assert max_error(one_beam, expected) < TOLERANCE, (
        "RedrafterPublishedVerifier, one sampled beam: exact"
    )
    two_beams = total_variation(
        sampled_step_distribution(verifier, world, sampling, context, 2, 3), expected
    )
    assert two_beams > 0.01, (
        f"RedrafterPublishedVerifier, two sampled beams: total variation {two_beams:.4f} > 0.01"
    )


def test_redrafter_published_constructed_case():
    """V=2, target and drafter both [0.5, 0.5] at the root, deterministic beams [t0] and [t1]:
    every test passes (ratio 1), beam 0 wins the tie, so t0 comes first with probability 1
    instead of 0.5: total variation exactly 0.5."""
    world = World(0, 2, table={(0,): [0.5, 0.5]}, draft_table={(0,): [0.5, 0.5]})
    draft_probs = [[world.draft_probs((0,))], [world.draft_probs((0,))]]  # (W=2, L-1=1, V)
    got = step_distribution(
        RedrafterPublishedVerifier(), world, SAMPLINGS["t1"], (0,), [[0, 0], [0, 1]], draft_probs
    )
    tv = total_variation(got, continuations(world, SAMPLINGS["t1"], (0,), 2))
    assert abs(tv - 0.5) < TOLERANCE, (
        f"RedrafterPublishedVerifier constructed case: total variation {tv} != 0.5"
    )


def test_typical_constructed_case():
    """Root target [0.7, 0.2, 0.1], one drafted child t2: 0.1 > min(0.09, 0.3 e^-H) so t2 is always
    accepted, instead of with probability 0.1: total variation exactly 0.9."""
    world = World(0, 3, table={(0,): [0.7, 0.2, 0.1]})
    got = step_distribution(TypicalVerifier(), world, SAMPLINGS["t1"], (0,), [[0, 2]])
    tv = total_variation(got, continuations(world, SAMPLINGS["t1"], (0,), 2))
    assert abs(tv - 0.9) < TOLERANCE, (
        f"TypicalVerifier constructed case: total variation {tv} != 0.9"
    )


def test_typical_is_greedy_at_temperature_zero():
    world = World(40, 3)
    for beam_set, beams in BEAM_SETS.items():
        beams = [[CONTEXT[-1], *beam] for beam in beams]
        got = step_distribution(TypicalVerifier(), world, SAMPLINGS["greedy"], CONTEXT, beams)
        expected = continuations(world, SAMPLINGS["greedy"], CONTEXT, len(beams[0]))
        assert max_error(got, expected) < TOLERANCE, (
            f"TypicalVerifier at temperature 0, beams {beams}"
        )
