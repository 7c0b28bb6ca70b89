"""A drafter that knows the answer: it proposes the target's own greedy continuation, with a
controllable share of corrupted tokens, so accepted paths of every length get exercised."""

from __future__ import annotations

from typing import Sequence

import numpy as np

from specdec.capabilities import DrafterCaps
from specdec.generation.api import generate
from specdec.types import Draft, DraftContext


def greedy_continuations(
    target, prompts, num_tokens: int, *, backend: str = "numpy", registry=None
) -> list[list[int]]:
    """Plain greedy decoding of ``num_tokens`` tokens per prompt (EOS ignored)."""
    result = generate(
        target,
        [list(p) for p in prompts],
        drafter="none",
        backend=backend,
        max_new_tokens=num_tokens,
        stop_at_eos=False,
        registry=registry,
    )
    return result.tokens


class OracleDrafter:
    """Proposes ``beam_width`` beams of length ``beam_length`` from known continuations.

    continuations: per prompt of ``prompts``, the tokens plain greedy decoding emits (the root
    included at index ``num_generated - 1``); a row finds its own by the prompt that starts its
    history, whatever slot it runs in. Each drafted token is replaced, with probability
    ``corruption``, by a different token drawn from ``rng``. Beam 0 is corrupted with
    ``corruption`` too, so with ``corruption=0`` every beam is the truth and every drafted token
    is accepted.
    """

    caps = DrafterCaps()

    def __init__(
        self,
        continuations: Sequence[Sequence[int]],
        *,
        prompts: Sequence[Sequence[int]],
        vocab_size: int,
        backend,
        target,
        beam_width: int = 2,
        beam_length: int = 4,
        corruption: float = 0.3,
        rng: np.random.Generator | None = None,
    ):
        if not 0.0 <= corruption <= 1.0:
            raise ValueError(f"corruption must be in [0, 1], got {corruption}")
        self.continuations = {
            tuple(int(t) for t in p): list(c) for p, c in zip(prompts, continuations, strict=True)
        }
        self.vocab_size = vocab_size
        self.backend, self.target = backend, target
        self.beam_width, self.beam_length, self.corruption = beam_width, beam_length, corruption
        self.rng = rng if rng is not None else np.random.default_rng(0)

    def propose(self, context: DraftContext) -> Draft:
        roots = self.backend.to_numpy(context.root_tokens)
        batch, width, length = roots.shape[0], self.beam_width, self.beam_length
        beams = np.zeros((batch, width, length), dtype=np.int64)
        for b in range(batch):
            start = int(context.num_generated[b])
            prompt = tuple(int(t) for t in context.history[b][: len(context.history[b]) - start])
            truth = self.continuations[prompt][start : start + length - 1]
            truth = truth + [0] * (length - 1 - len(truth))
            for i in range(width):
                drafted = np.array(truth, dtype=np.int64)
                corrupt = self.rng.random(length - 1) < self.corruption
                shift = self.rng.integers(1, self.vocab_size, size=length - 1)
                drafted = np.where(corrupt, (drafted + shift) % self.vocab_size, drafted)
                beams[b, i] = np.concatenate([[roots[b]], drafted])
        return Draft(
            root_tokens=context.root_tokens, beams=self.backend.from_numpy(beams, self.target)
        )
