"""Settings decoded side by side with plain decoding, prompt by prompt.

A virtual machine's speed drifts by 10-20% over minutes even where no other work runs in it: the
other guests of its host share the memory bandwidth a forward streams its weights over, and no
clock of this process sees them. A figure made of plain decoding over every prompt, then a
setting over every prompt, carries that drift. Measured on a quiet 2-core cloud VM (AMD EPYC,
AVX-512 BF16; SmolLM2-135M in bfloat16, ReDrafter W=2 L=3 drafting every step, MT-Bench's 8
category prompts, 64 tokens, one process): decoded so, it ran 1.36x and then 1.98x over plain
decoding; decoded prompt by prompt, plain decoding and the setting in turn, 1.71x and 1.73x.

So ``side_by_side`` decodes each prompt with plain decoding and with every setting in turn (the
order rotated by one per prompt, so that no setting always runs first), and a setting's figure
compares it with plain decoding of the same prompts, seconds apart.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence

import attrs
import numpy as np

import specdec
from specdec.errors import InvalidInputError
from specdec.tuning.machine import Measured

__all__ = ["Decoded", "PLAIN", "decode_once", "side_by_side"]

PLAIN = ("none", {})  # plain decoding, as a setting of side_by_side


@attrs.frozen(kw_only=True)
class Decoded:
    """One setting over the prompts: each prompt's decode-phase tokens per second (``rates``;
    the prefill left out, and the first token, which comes from the prompt's forward), the
    tokens ``emitted`` and ``seconds`` taken in the decode phase over all prompts, tokens per
    step (the bonus counted) and tree nodes verified per step, and whether other work took the
    cores while it decoded (``busy``, its own clock)."""

    rates: np.ndarray
    emitted: int
    seconds: float
    tokens_per_step: float
    nodes_per_step: float
    busy: bool

    @property
    def rate(self) -> float:
        """Decode-phase tokens per second over all prompts."""
        return self.emitted / max(self.seconds, 1e-9)


def decode_once(target, prompt, drafter, options: dict, *, backend: str, tokens: int, stop_at_eos):
    """``generate``'s stats for one prompt, every step drafting (``speculation="always"``:
    under "auto" a setting whose drafts do not pay decodes mostly plainly, near 1.00x whatever
    its trees)."""
    always = {} if drafter == "none" else {"speculation": "always"}
    return specdec.generate(
        target,
        prompt,
        drafter=drafter,
        backend=backend,
        max_new_tokens=tokens,
        stop_at_eos=stop_at_eos,
        **always,
        **options,
    ).stats


def _decoded(stats: list, clock: Measured) -> Decoded:
    seconds = [s.time_draft + s.time_verify + s.time_other for s in stats]
    emitted = [s.new_tokens - 1 for s in stats]
    steps = sum(s.steps - 1 for s in stats)
    return Decoded(
        rates=np.array([e / max(t, 1e-9) for e, t in zip(emitted, seconds)]),
        emitted=sum(emitted),
        seconds=float(sum(seconds)),
        tokens_per_step=sum(emitted) / max(steps, 1),
        nodes_per_step=sum(s.verified_tokens for s in stats) / max(steps, 1),
        busy=not clock.quiet,
    )


def side_by_side(
    target,
    prompts: Sequence,
    settings: dict[Hashable, tuple[str, dict]],
    *,
    backend: str,
    tokens: int,
    clock: Measured,
    stop_at_eos: bool = True,
    on_decode: Callable[[Hashable], object] | None = None,
) -> dict[Hashable, Decoded | None]:
    """Each of ``settings`` (key -> (drafter, options); plain decoding is ``PLAIN``) decoded over
    ``prompts`` (module docstring), timed inside ``clock`` and each on a clock of its own. A
    setting the drafter refuses (``InvalidInputError`` at its first prompt) is None.
    ``on_decode(key)`` follows each prompt a setting decoded (progress)."""
    keys = list(settings)
    clocks = {key: Measured() for key in keys}
    stats: dict[Hashable, list] = {key: [] for key in keys}
    refused: set = set()
    for i, prompt in enumerate(prompts):
        turn = i % len(keys)
        for key in keys[turn:] + keys[:turn]:
            if key in refused:
                continue
            drafter, options = settings[key]
            try:
                with clock, clocks[key]:
                    once = decode_once(
                        target,
                        prompt,
                        drafter,
                        options,
                        backend=backend,
                        tokens=tokens,
                        stop_at_eos=stop_at_eos,
                    )
            except InvalidInputError:
                if i:  # a setting is refused at its first prompt, or not at all
                    raise
                refused.add(key)
                continue
            stats[key].append(once)
            if on_decode is not None:
                on_decode(key)
    return {key: None if key in refused else _decoded(stats[key], clocks[key]) for key in keys}
