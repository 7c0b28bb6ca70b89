"""Exact enumeration of a randomised computation, for exactness proofs in tests: instead of random
numbers, a chooser takes every branch in turn, and each outcome comes with its exact probability.

A verifier (or drafter) that draws through ``chooser.categorical(probs, depth)`` and
``chooser.accept(probability, depth, beam)`` (``specdec.reference.verify.Chooser``) can be run
under ``enumerate_outcomes`` to get the whole distribution of what it emits.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np

from specdec.reference.sampling import target_probs


class ScriptedChooser:
    """Replays a script of branch indices, then takes branch 0 of every new choice and records
    the other branches as scripts still to run. ``weight`` is the probability of this run."""

    def __init__(self, script: list[int]):
        self.script, self.taken, self.pending, self.weight = script, [], [], 1.0

    def _choose(self, options: list[tuple[object, float]]):
        step = len(self.taken)
        if step < len(self.script):
            index = self.script[step]
        else:
            index = 0
            self.pending.extend(self.taken + [other] for other in range(1, len(options)))
        value, weight = options[index]
        self.taken.append(index)
        self.weight *= weight
        return value

    def categorical(self, probs, depth):
        probs = np.asarray(probs, dtype=np.float64) / np.sum(probs)
        return self._choose([(int(t), float(probs[t])) for t in np.flatnonzero(probs > 0)])

    def accept(self, probability, depth, beam):
        return self._choose(
            [(v, w) for v, w in ((True, probability), (False, 1.0 - probability)) if w > 0]
        )


def enumerate_outcomes(run) -> list[tuple[object, float]]:
    """Every outcome of ``run(chooser)`` with its exact probability."""
    outcomes, scripts = [], [[]]
    while scripts:
        chooser = ScriptedChooser(scripts.pop())
        outcomes.append((run(chooser), chooser.weight))
        scripts.extend(chooser.pending)
    return outcomes


def target_joint(target, sampling):
    """``joint(prefix, length)``: the distribution {next ``length`` tokens: probability} that
    ``target`` (a float64 reference target with a free slot 0) gives after the token tuple
    ``prefix`` under ``sampling``, from its own one-token conditionals (cached per prefix)."""

    @lru_cache(maxsize=None)
    def conditional(prefix):
        probs = target_probs(np.asarray(target.admit(0, list(prefix)).logits)[None], sampling)[0]
        target.release(0)
        return probs

    def joint(prefix, length):
        if length == 0:
            return {(): 1.0}
        probs = conditional(tuple(prefix))
        return {
            (int(t),) + rest: probs[t] * w
            for t in np.flatnonzero(probs > 0)
            for rest, w in joint(tuple(prefix) + (int(t),), length - 1).items()
        }

    return joint
