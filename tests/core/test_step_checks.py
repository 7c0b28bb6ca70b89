"""The loop checks every draft, tree and verdict, and each error names the plugin that made the
value."""

from __future__ import annotations

import types

import attrs
import numpy as np
import pytest

import specdec
from specdec.errors import PluginOutputError
from specdec.plugins.registry import PluginRegistry
from specdec.plugins import builtin as numpy_plugin
from specdec.reference.verify import GreedyVerifier


class ChainDrafter:
    """One beam repeating the root, which the random target (it repeats its last token) accepts."""

    caps = specdec.DrafterCaps()

    def __init__(self, tokens=None):
        self.tokens = tokens

    def propose(self, context):
        roots = np.asarray(context.root_tokens)
        beams = np.repeat(roots[:, None, None], 3, axis=2)
        if self.tokens is not None:
            beams[:, 0, 1:] = self.tokens
        return specdec.Draft(root_tokens=roots, beams=beams)


class Corrupting(GreedyVerifier):
    """Greedy verification, then ``change(verdict)``."""

    def __init__(self, change):
        self.change = change

    def verify(self, *args):
        return self.change(super().verify(*args))


def float_path(verdict):
    return attrs.evolve(verdict, path=verdict.path.astype(np.float64))


def bonus_outside(verdict):
    return attrs.evolve(verdict, bonus_tokens=verdict.bonus_tokens + 1000)


def skips_a_node(verdict):
    path = np.zeros_like(verdict.path)
    path[:, 1] = 2  # node 2's parent is node 1, not the root
    return attrs.evolve(verdict, path=path, num_accepted=np.ones_like(verdict.num_accepted))


def too_many_accepted(verdict):
    return attrs.evolve(verdict, num_accepted=verdict.num_accepted + 10)


@pytest.mark.parametrize(
    "change, message",
    [
        (float_path, r"returned Verdict.path of dtype float64; it must hold integers"),
        (
            bonus_outside,
            r"returned Verdict.bonus_tokens\[0\] = \d+, outside the vocabulary \[0, 96\)",
        ),
        (
            skips_a_node,
            r"returned a Verdict.path that is not a chain of parent links in row 0: \[0, 2\]",
        ),
        (too_many_accepted, r"returned Verdict.num_accepted \[1\d\] outside \[0, 2\]"),
    ],
)
def test_a_bad_verdict_names_the_verifier(target, change, message):
    with pytest.raises(
        PluginOutputError, match=r"^verifier Corrupting \(an object passed in\) " + message
    ):
        specdec.generate(
            target,
            [5, 6],
            drafter=ChainDrafter(),
            backend="numpy",
            max_new_tokens=6,
            verifier=Corrupting(change),
        )


def test_a_registered_verifier_is_named_with_its_plugin(target):
    plugin = types.ModuleType("skippy_plugin")

    @specdec.hookimpl
    def specdec_register_verifiers(register):
        register("skippy", "numpy", lambda: Corrupting(skips_a_node), lossless=True)

    plugin.specdec_register_verifiers = specdec_register_verifiers
    registry = PluginRegistry([numpy_plugin, plugin])
    with pytest.raises(
        PluginOutputError, match=r"^verifier 'skippy' \(plugin 'skippy_plugin', local\) returned"
    ):
        specdec.generate(
            target,
            [5, 6],
            drafter=ChainDrafter(),
            backend="numpy",
            max_new_tokens=6,
            verifier="skippy",
            registry=registry,
        )


def test_a_draft_outside_the_vocabulary_names_the_drafter(target):
    """The target fails first (an index error in its embedding); the error blames the drafter."""
    with pytest.raises(
        PluginOutputError,
        match=r"^drafter ChainDrafter \(an object passed in\) returned "
        r"Draft.beams\[0, 0, 1\] = 500, outside the vocabulary",
    ):
        specdec.generate(
            target, [5, 6], drafter=ChainDrafter(tokens=500), backend="numpy", max_new_tokens=6
        )


def test_a_negative_draft_token_names_the_drafter_before_the_tree_builder_fails(target):
    """A negative id (a drafter proposing its own -1 padding, say) fails in the tree builder
    first, as a ValueError of its own; the error still blames the drafter, as a plugin error."""
    with pytest.raises(
        PluginOutputError,
        match=r"^drafter ChainDrafter \(an object passed in\) returned "
        r"Draft.beams\[0, 0, 1\] = -1, outside the vocabulary",
    ) as caught:
        specdec.generate(
            target, [5, 6], drafter=ChainDrafter(tokens=-1), backend="numpy", max_new_tokens=6
        )
    assert isinstance(caught.value.__cause__, ValueError), "the tree builder's error is kept"


def test_good_plugins_pass_the_checks(target):
    plain = specdec.generate(target, [5, 6], drafter="none", backend="numpy", max_new_tokens=6)
    chained = specdec.generate(
        target, [5, 6], drafter=ChainDrafter(), backend="numpy", max_new_tokens=6
    )
    assert chained.tokens == plain.tokens and chained.stats.accepted_tokens > 0


def test_a_target_returning_fewer_chunk_outputs_is_named_before_a_request_is_lost(model_dir):
    """The loop pairs each prompt chunk with its PromptOutput: one missing fails the step, naming
    the target."""
    from specdec.reference.model import load_target

    target = load_target(model_dir, slots=2, capacity=32)
    forward = target.forward_tree

    def forward_tree(tree, slots, *, context=(), layers=()):
        output = forward(tree, slots, context=context, layers=layers)
        return attrs.evolve(output, context=output.context[:-1]) if output.context else output

    target.forward_tree = forward_tree
    with pytest.raises(
        PluginOutputError,
        match=r"'numpy' target ReferenceTarget returned 1 context outputs from "
        r"forward_tree for 2 prompt chunks",
    ):
        specdec.generate(target, [[1, 2], [3]], drafter="none", backend="numpy", max_new_tokens=3)
