"""A stateful drafter that needs no hidden states of the prompt (``DrafterCaps(stateful=True,
prompt_states=False)``) has its requests prefilled in chunks like any other, is told ``begin``
once the prompt is in (with the states at its last position), and decodes exactly as plain
decoding does; one that asks for them (the default) is admitted whole by ``TargetModel.admit``.

The drafter here keeps its own copy of each request's text from ``begin`` and ``observe`` and
proposes what followed the root's last earlier occurrence in it (a suffix lookup on its state),
checking its copy against the loop's ``history`` at every step. Exact on the float64 reference.
"""

from __future__ import annotations

import numpy as np
import pytest

import specdec
from specdec.reference.model import load_target
from specdec.testing.requests import decoding_plan, run_schedule

LONG = [7, 8, 9, 10, 7, 8, 9, 10, 7, 8, 9]  # 11 tokens: four chunks of at most 3


class TokenState:
    """A stateful drafter of tokens only: per slot, the text committed so far."""

    def __init__(self, prompt_states: bool, length: int = 3):
        self.caps = specdec.DrafterCaps(stateful=True, prompt_states=prompt_states)
        self.length, self.texts, self.events, self.accepted = length, {}, [], 0

    def begin(self, slot, prompt, output):
        assert slot not in self.texts, f"slot {slot} began twice without end"
        positions = len(prompt) if self.caps.prompt_states else 1
        assert output.hidden.shape[0] == positions and output.logits.ndim == 1
        self.texts[slot] = prompt.tolist()
        self.events.append(("begin", slot))

    def propose(self, context):
        roots = np.asarray(context.root_tokens, dtype=np.int64)
        beams = np.repeat(roots[:, None, None], self.length + 1, axis=2)  # (B, 1, L)
        for b, slot in enumerate(context.slots.tolist()):
            text = self.texts[slot] + [int(roots[b])]
            assert text == context.history[b].tolist(), "begin and observe gave the request's text"
            earlier = [i for i in range(len(text) - 1) if text[i] == text[-1]]
            if earlier:
                follow = text[earlier[-1] + 1 : earlier[-1] + 1 + self.length]
                beams[b, 0, 1 : 1 + len(follow)] = follow
        return specdec.Draft(root_tokens=context.root_tokens, beams=beams)

    def observe(self, accepted):
        self.accepted += int(np.sum(accepted.num_accepted))
        for b, slot in enumerate(accepted.slots.tolist()):
            self.texts[slot] += accepted.tokens[b, : int(accepted.num_accepted[b]) + 1].tolist()

    def end(self, slot, reason):
        self.texts.pop(slot)
        self.events.append(("end", slot))


class Counted:
    """Counts the target's whole-prompt admissions and the prompt chunks of its forwards (the
    reference's ``admit`` runs its prompt as chunks: those are not counted); ``order`` records
    per slot "chunk" and "row" (a tree row) forwards, and the drafter's ``begin``."""

    def __init__(self, target, drafter):
        self.admits, self.chunks, self.order, self.inside = 0, 0, [], False
        forward, admit, begin = target.forward_tree, target.admit, drafter.begin

        def forward_tree(tree, slots, *, context=(), layers=()):
            if not self.inside:
                self.chunks += len(context)
                self.order += [("chunk", int(s)) for s, _ in context]
                self.order += [] if tree is None else [("row", int(s)) for s in np.asarray(slots)]
            return forward(tree, slots, context=context, layers=layers)

        def admitting(slot, prompt, *, layers=()):
            self.admits += 1
            self.inside = True
            try:
                return admit(slot, prompt, layers=layers)
            finally:
                self.inside = False

        def beginning(slot, prompt, output):
            self.order.append(("begin", int(slot)))
            begin(slot, prompt, output)

        target.forward_tree, target.admit, drafter.begin = forward_tree, admitting, beginning


def schedule():
    greedy = [specdec.Request(prompt=p, max_new_tokens=12) for p in (LONG, [1, 2, 3], [4, 5, 4, 5])]
    sampled = specdec.Request(
        prompt=LONG[:7], max_new_tokens=10, seed=5, sampling=specdec.SamplingConfig(temperature=0.9)
    )
    return [(0, greedy[0], None), (0, greedy[1], None), (1, sampled, None), (3, greedy[2], None)]


@pytest.mark.parametrize("prompt_states", [False, True])
def test_only_a_drafter_that_asks_for_prompt_states_is_admitted_whole(model_dir, prompt_states):
    target = load_target(model_dir, slots=2, capacity=64)
    drafter = TokenState(prompt_states)
    counted = Counted(target, drafter)
    tokens = run_schedule(decoding_plan(target, drafter), schedule(), max_prefill_tokens=3)
    alone = load_target(model_dir, slots=1, capacity=64)
    plain = run_schedule(decoding_plan(alone, "none"), schedule())
    assert tokens == plain, "a stateful drafter's requests decode as plain decoding does"
    if prompt_states:
        assert (counted.admits, counted.chunks) == (4, 0)
    else:
        assert counted.admits == 0
        assert counted.chunks >= 4 + 1 + 3 + 2  # at most 3 prompt tokens a step
    assert [e[0] for e in drafter.events].count("begin") == 4
    assert not drafter.texts, "every request ended"
    assert drafter.accepted > 0, "its proposals were accepted: the test decodes speculatively"


def test_chunks_come_before_begin_and_rows_after(model_dir):
    target = load_target(model_dir, slots=1, capacity=64)
    drafter = TokenState(prompt_states=False)
    counted = Counted(target, drafter)
    request = specdec.Request(prompt=LONG, max_new_tokens=6)
    run_schedule(decoding_plan(target, drafter), [(0, request, None)], max_prefill_tokens=3)
    kinds = [kind for kind, _ in counted.order]
    assert kinds[:5] == ["chunk"] * 4 + ["begin"] and set(kinds[5:]) == {"row"}, kinds
    assert counted.admits == 0
