"""The conformance kit's drafter check on the built-in drafters (the examples run it as installed
third-party distributions): greedy output equals plain decoding, and one slot reused request after
request gives what one slot per prompt gives."""

from __future__ import annotations

import numpy as np
import pytest

import specdec
from specdec import Draft, DrafterCaps, PluginRegistry, hookimpl
from specdec.plugins.specs import DrafterSpec
from specdec.testing import checks, make_random_drafter


@pytest.mark.parametrize("drafter", ["lookup", "redrafter", "medusa"])
def test_check_drafter_passes_for_the_built_in_drafters(model_dir, tmp_path, drafter):
    if drafter in ("redrafter", "medusa"):
        drafter = make_random_drafter(tmp_path / drafter, model_dir, kind=drafter, seed=11)
    counts = checks.check_drafter(drafter, model_dir, backends=["numpy"], max_new_tokens=10)
    drafted, accepted = counts["numpy"]
    assert drafted > 0 and 0 <= accepted <= drafted


def test_check_drafter_fails_a_drafter_that_never_drafts(model_dir, monkeypatch):
    """A plugin whose propose never matched drafted nothing in every step, and the kit passed it:
    lossless, as a drafter that never proposes always is, with nothing of it checked. It
    decodes every step drafting (under "auto" a drafter may be left idle on the random model)."""
    monkeypatch.delenv("SPECDEC_SPECULATION", raising=False)  # the user's default, auto
    with pytest.raises(AssertionError, match=r"drafted no token in \d+ steps over 3 prompts"):
        checks.check_drafter("none", model_dir, backends=["numpy"], max_new_tokens=10)


class OneTokenDrafter:
    """Drafts the root repeated once, whatever its ``length`` option says (a drafter copying what
    followed the latest match does that on the kit's random model, whose text repeats)."""

    caps = DrafterCaps()

    def propose(self, context):
        roots = np.asarray(context.root_tokens).astype(np.int64)
        return Draft(root_tokens=context.root_tokens, beams=np.repeat(roots[:, None, None], 2, 2))


class OneTokenPlugin:
    @hookimpl
    def specdec_register_drafter_specs(register):
        register(
            DrafterSpec(
                name="one",
                implementations={
                    "*": lambda target, checkpoint=None, *, backend: OneTokenDrafter()
                },
            )
        )


def test_the_kit_says_when_a_drafter_never_drafted_more_than_a_token(model_dir):
    """A plugin whose length option had no effect on the kit's model passed at every length with
    the same counts, and nothing said its longer drafts were never checked."""
    registry = PluginRegistry([OneTokenPlugin], entry_points=True)
    with pytest.warns(UserWarning, match=r"one token a step at most \(\d+ tokens in \d+ drafting"):
        checks.check_drafter("one", model_dir, max_new_tokens=6, registry=registry)


class LeakyDrafter:
    """Keeps a per-slot count of the requests the slot has served and never resets it: a slot's
    first request is drafted a token the target does not choose, later ones the root repeated
    (which the random target, repeating its last token, accepts). With one slot reused, the
    second and third requests are drafted differently than side by side, so they accept other
    drafts (their tokens stay the same: drafts never change them)."""

    caps = DrafterCaps(stateful=True)

    def __init__(self):
        self.served = {}

    def begin(self, slot, prompt, output):
        self.served[slot] = (
            self.served.get(slot, 0) + 1
        )  # the bug: a new request should start afresh

    def propose(self, context):
        roots = np.asarray(context.root_tokens).tolist()
        slots = context.slots.tolist()
        guess = [
            r if self.served[s] > 1 else (r + 1) % 96 for r, s in zip(roots, slots, strict=True)
        ]
        beams = np.array(
            [[[r, g, g, g]] for r, g in zip(roots, guess, strict=True)], dtype=np.int64
        )
        return Draft(root_tokens=context.root_tokens, beams=beams)

    def observe(self, accepted):
        pass

    def end(self, slot):
        pass


class LeakyPlugin:
    @hookimpl
    def specdec_register_drafter_specs(register):
        register(
            DrafterSpec(
                name="leaky",
                implementations={"*": lambda target, checkpoint=None, *, backend: LeakyDrafter()},
            )
        )


def test_check_drafter_catches_state_kept_across_requests(model_dir):
    registry = PluginRegistry([LeakyPlugin], entry_points=True)
    with pytest.raises(AssertionError, match="one after another in one slot differ") as raised:
        checks.check_drafter(
            "leaky", model_dir, backends=["numpy"], max_new_tokens=10, registry=registry
        )
    # it names what differs (the drafts; tokens never do)
    assert "drafted tokens: " in str(raised.value) and "tokens: [" not in str(raised.value)


def test_a_stateful_drafter_without_a_slot_view_is_warned_about(model_dir):
    """Without slot_tokens its state is judged only by the drafts it changes: the kit says so."""
    registry = PluginRegistry([LeakyPlugin], entry_points=True)
    with pytest.warns(UserWarning, match="stateful drafter without slot_tokens"):
        assert checks.check_slot_views("leaky", model_dir, registry=registry) == 0


class TextDrafter:
    """A stateful drafter of tokens only that keeps each request's text per slot and drafts what
    followed the root's last earlier occurrence (docs/writing-a-drafter.md's SuffixDrafter), and
    shows its text (``slot_tokens``). ``skip_root``: its observe drops each step's root, the
    off-by-one that leaves it lossless while its text drifts from the request's."""

    caps = DrafterCaps(stateful=True, prompt_states=False)

    def __init__(self, *, skip_root: bool = False):
        self.skip_root, self.texts = skip_root, {}

    def begin(self, slot, prompt, output):
        self.texts[slot] = np.asarray(prompt).tolist()

    def propose(self, context):
        roots = np.asarray(context.root_tokens).astype(np.int64)
        beams = np.repeat(roots[:, None, None], 4, axis=2)
        for b, slot in enumerate(context.slots.tolist()):
            text = self.texts[slot] + [int(roots[b])]
            earlier = [i for i in range(len(text) - 1) if text[i] == text[-1]]
            if earlier:
                follow = text[earlier[-1] + 1 : earlier[-1] + 4]
                beams[b, 0, 1 : 1 + len(follow)] = follow
        return Draft(root_tokens=context.root_tokens, beams=beams)

    def observe(self, accepted):
        first = 1 if self.skip_root else 0
        for b, slot in enumerate(accepted.slots.tolist()):
            self.texts[slot] += accepted.tokens[b, first : accepted.num_accepted[b] + 1].tolist()

    def end(self, slot, reason):
        del self.texts[slot]

    def slot_tokens(self, slot):
        return self.texts[slot]


def test_check_drafter_holds_a_drafters_slot_view_to_the_requests_history(model_dir):
    """The off-by-one observer is lossless and drafts the same one slot reused as side by side,
    so only its view shows the drift: check_drafter fails it there, naming the slot, and passes
    the same drafter observing right."""
    assert checks.check_slot_views(TextDrafter(), model_dir, max_new_tokens=10) > 0
    checks.check_drafter(TextDrafter(), model_dir, backends=["numpy"], max_new_tokens=10)
    with pytest.raises(AssertionError, match=r"slot_tokens\(\d\) holds \d+ tokens where"):
        checks.check_drafter(
            TextDrafter(skip_root=True), model_dir, backends=["numpy"], max_new_tokens=10
        )


class DroppingTarget:
    """The reference target, except that a forward with prompt chunks returns one output fewer."""

    def __init__(self, inner):
        self.inner = inner

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def forward_tree(self, tree, slots, *, context=(), layers=()):
        import attrs

        output = self.inner.forward_tree(tree, slots, context=context, layers=layers)
        return attrs.evolve(output, context=output.context[:-1]) if output.context else output


class DroppingBackend:
    name = "dropping"

    def __init__(self):
        from specdec.plugins.builtin import NumpyBackend

        self.inner = NumpyBackend()

    def load_target(self, source, *, dtype=None, device=None, slots=1, capacity=None):
        return DroppingTarget(self.inner.load_target(source, slots=slots, capacity=capacity))

    def to_numpy(self, array):
        return self.inner.to_numpy(array)

    def from_numpy(self, array, target):
        return self.inner.from_numpy(array, target)


class DroppingPlugin:
    @hookimpl
    def specdec_register_backends(register):
        register("dropping", DroppingBackend)


def test_check_target_fails_a_backend_that_returns_fewer_chunk_outputs(model_dir):
    """Outputs are compared pairwise only after their counts: a missing last chunk is not a shorter
    zip."""
    registry = PluginRegistry([DroppingPlugin], entry_points=True)
    with pytest.raises(AssertionError, match="returned 1 context outputs for 2 prompt chunks"):
        checks.check_target("dropping", model_dir, dtype=None, registry=registry)
    checks.check_target(
        "numpy", model_dir, dtype=None
    )  # the same check passes the reference itself


@pytest.mark.parametrize("kind", ["eagle", "eagle3"])
def test_shipped_stateful_drafters_show_their_slot_view(kind, model_dir, tmp_path):
    """EAGLE's and EAGLE-3's draft caches say which tokens they stand for, so the kit holds them to
    each request's history (a drafter without the view would be compared 0 times)."""
    from specdec.testing.drafters import make_random_drafter

    head = make_random_drafter(tmp_path / kind, model_dir, kind=kind, seed=3)
    assert checks.check_slot_views(str(head), model_dir, max_new_tokens=10) > 0


def test_check_generation_runs_on_the_reference_with_its_own_dtype(model_dir):
    """numpy computes in float64 only: check_generation, like check_drafter, does not ask it for
    the float32 it asks the other backends for."""
    checks.check_generation("numpy", model_dir, "lookup", prompts=[[1, 2, 3, 1, 2, 3]])


class OutOfVocabularyDrafter(TextDrafter):
    """Proposes a token past any vocabulary."""

    def propose(self, context):
        draft = super().propose(context)
        beams = np.asarray(draft.beams).copy()
        beams[:, 0, 1] = 10**6
        return Draft(root_tokens=context.root_tokens, beams=beams)


def test_check_slot_views_names_the_drafter_in_a_bad_drafts_error(model_dir):
    """The decode loop's error on a bad draft names the drafter's own class, not the kit's
    watcher around it."""
    with pytest.raises(specdec.PluginOutputError) as raised:
        checks.check_slot_views(OutOfVocabularyDrafter(), model_dir, max_new_tokens=6)
    message = str(raised.value)
    assert "OutOfVocabularyDrafter" in message and "Watcher" not in message, message
