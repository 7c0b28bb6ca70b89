"""One check of an EAGLE-family drafter's backend twin against its float64 NumPy reference,
shared by EAGLE's and EAGLE-3's tests: three slots begin, four steps observe (drafting at steps
0 and 3 only, so step 3 catches up the entries of steps 1 and 2 in one forward), and every
slot's draft cache ends equal to the reference's.

What differs between the two drafters is given as an ``Inputs``: the target's outputs the
drafter reads (EAGLE: the last hidden state; EAGLE-3: the fused layers, and a zero hidden) and
how the reference's tree for one row is built (its margins decide which examples are used).
"""

from __future__ import annotations

from typing import Any, Callable

import attrs
import numpy as np
from hypothesis import assume

from specdec.types import Accepted, DraftContext, PromptOutput


def float32_exact(array):
    return np.asarray(array, dtype=np.float32).astype(np.float64)


def host(array) -> np.ndarray:
    return np.array(array.tolist()) if not isinstance(array, np.ndarray) else array


@attrs.frozen
class Inputs:
    """outputs(rng, shape): the NumPy fields of a ``PromptOutput`` / ``Accepted`` (``hidden``,
    and ``layers`` where the drafter reads them) for tokens of ``shape`` (length,) or (rows,
    width); root_hidden(rng, rows): the ``DraftContext.hidden`` of a step; tree(ref, slot,
    root, hidden): the reference's tree for one row (its ``margin`` is checked); cache: the
    slot fields compared besides ``keys`` and ``values``."""

    outputs: Callable[[np.random.Generator, tuple], dict]
    root_hidden: Callable[[np.random.Generator, int], np.ndarray]
    tree: Callable[[Any, Any, int, np.ndarray], Any]
    cache: tuple[str, ...] = ()


def _on_twin(fields: dict, to) -> dict:
    return {
        name: {i: to(a) for i, a in value.items()} if isinstance(value, dict) else to(value)
        for name, value in fields.items()
    }


def check_against_reference(pair, inputs: Inputs, *, vocab: int, margin: float, tolerance: dict):
    """``pair``: (reference, twin, to, ints, rng) as each test's ``make_pair`` returns them."""
    ref, twin, to, ints, rng = pair
    slots, lengths = [2, 0, 1], [5, 1, 9]
    for slot, length in zip(slots, lengths, strict=True):
        prompt, fields = rng.integers(0, vocab, length), inputs.outputs(rng, (length,))
        ref.begin(slot, prompt, PromptOutput(logits=np.zeros(vocab), **fields))
        twin.begin(slot, prompt, PromptOutput(logits=to(np.zeros(vocab)), **_on_twin(fields, to)))
    for step in range(4):  # steps 1 and 2 do not draft: their entries wait for step 3
        roots, hidden = rng.integers(0, vocab, 3), inputs.root_hidden(rng, 3)
        if step in (0, 3):
            trees = [inputs.tree(ref, s, int(roots[b]), hidden[b]) for b, s in enumerate(slots)]
            assume(min(t.margin for t in trees) > margin)
            expected = ref.propose(
                DraftContext(root_tokens=roots, hidden=hidden, slots=np.array(slots))
            )
            actual = twin.propose(
                DraftContext(root_tokens=ints(roots), hidden=to(hidden), slots=np.array(slots))
            )
            where = f"{type(twin).__name__}.propose(step {step})"
            np.testing.assert_array_equal(host(actual.beams), expected.beams, err_msg=where)
        counts = rng.integers(0, 3, 3)
        tokens = np.full((3, counts.max() + 1), -1)
        for b in range(3):
            tokens[b, : counts[b] + 1] = [roots[b], *rng.integers(0, vocab, counts[b])]
        fields = inputs.outputs(rng, (3, counts.max() + 1))
        common = dict(
            slots=np.array(slots),
            tokens=tokens,
            num_accepted=counts,
            bonus_tokens=rng.integers(0, vocab, 3),
        )
        ref.observe(Accepted(**fields, **common))
        twin.observe(Accepted(**_on_twin(fields, to), **common))
    twin.context(np.array(slots))  # the last step's entries wait until a slot drafts
    for slot in slots:
        expected, state = ref.slots[slot], twin.slots[slot]
        state = state if isinstance(state, dict) else attrs.asdict(state, recurse=False)
        assert state["length"] == expected.length
        assert twin.slot_tokens(slot) == ref.slot_tokens(slot)
        for name in ("keys", "values"):
            np.testing.assert_allclose(
                host(state[name])[:, : expected.length], getattr(expected, name), **tolerance
            )
        for name in inputs.cache:
            np.testing.assert_allclose(host(state[name]), getattr(expected, name), **tolerance)
