"""The target check of the conformance kit (``specdec.testing.checks.check_target``) and the
helpers every check shares: tolerances by dtype, comparisons that name what differs, random beams
and verdicts, trees put on a backend."""

from __future__ import annotations

from typing import Sequence

import numpy as np

from specdec.errors import InvalidInputError
from specdec.plugins.registry import PluginRegistry, default_registry
from specdec.reference.model import load_target
from specdec.reference.tree import build_prefix_tree
from specdec.types import DraftTree, Verdict

FLOAT32 = dict(rtol=2e-4, atol=2e-4)
FLOAT64 = dict(rtol=1e-9, atol=1e-9)


def _tolerance(dtype: str | None) -> dict:
    return FLOAT64 if dtype == "float64" else FLOAT32


def _registry(registry: PluginRegistry | None) -> PluginRegistry:
    return registry or default_registry()


def to_backend_tree(tree: DraftTree, backend, target) -> DraftTree:
    """Copy a reference DraftTree's arrays to ``backend``."""
    convert = lambda a: None if a is None else backend.from_numpy(np.asarray(a), target)
    return DraftTree(
        tokens=convert(tree.tokens),
        parents=convert(tree.parents),
        depth=convert(tree.depth),
        ancestor_mask=convert(tree.ancestor_mask),
        num_nodes=convert(tree.num_nodes),
        beam_to_node=convert(tree.beam_to_node),
    )


def _compare(name: str, expected, actual, tolerance: dict) -> None:
    expected, actual = np.asarray(expected, dtype=np.float64), np.asarray(actual, dtype=np.float64)
    assert expected.shape == actual.shape, (
        f"{name}: shape {actual.shape}, reference {expected.shape}"
    )
    if not np.allclose(actual, expected, **tolerance):
        worst = float(np.max(np.abs(actual - expected)))
        raise AssertionError(f"{name}: max abs difference {worst:.3g} exceeds {tolerance}")


def random_beams(
    rng: np.random.Generator, roots: np.ndarray, width: int, length: int, vocab: int
) -> np.ndarray:
    """(B, W, L) beams sharing each row's root, drawn from a few tokens so prefixes repeat."""
    alphabet = rng.choice(vocab, size=min(vocab, 3), replace=False)
    beams = alphabet[rng.integers(0, len(alphabet), size=(len(roots), width, length))]
    beams[:, :, 0] = roots[:, None]
    return beams.astype(np.int64)


def random_verdict(rng: np.random.Generator, tree: DraftTree, beams: np.ndarray) -> Verdict:
    """An accepted path along a random beam, of random length, with a random bonus token."""
    batch, _, length = beams.shape
    path = np.full((batch, length), -1, dtype=np.int64)
    num_accepted = rng.integers(0, length, size=batch)
    for b in range(batch):
        beam = rng.integers(0, beams.shape[1])
        path[b, : num_accepted[b] + 1] = tree.beam_to_node[b, beam, : num_accepted[b] + 1]
    return Verdict(
        path=path, num_accepted=num_accepted.astype(np.int64), bonus_tokens=beams[:, 0, 0].copy()
    )


def check_target(
    backend_name: str,
    model_path,
    *,
    dtype: str | None = "float32",
    device: str | None = None,
    prompts: Sequence[Sequence[int]] = ((1, 2, 3), (4,), (5, 6, 7, 8, 9)),
    steps: int = 3,
    width: int = 3,
    length: int = 4,
    seed: int = 0,
    registry: PluginRegistry | None = None,
) -> None:
    """Admissions, tree forwards over some slots, commits and releases of ``backend_name`` match
    the reference on ``model_path``: the prompts go to slots in a scrambled order (two slots stay
    free), every step runs a different subset of them, and midway one request is released and a
    new one admitted into its slot. Then prompt chunks are packed into forwards: two chunks alone
    (claiming the free slots), then their next chunks beside the tree rows, then a tree step over
    every slot. Layer outputs (first and last decoder layer) are compared too."""
    registry = _registry(registry)
    backend = registry.get("backend", backend_name).factory()
    num_slots = len(prompts) + 2
    reference = load_target(model_path, slots=num_slots, capacity=64)
    target = backend.load_target(
        model_path, dtype=dtype, device=device, slots=num_slots, capacity=64
    )
    tolerance = _tolerance(dtype)
    where = f"check_target(backend={backend_name!r}, dtype={dtype!r}, model={model_path})"
    layers = sorted({0, reference.num_layers - 1})
    rng = np.random.default_rng(seed)
    slots = rng.permutation(num_slots)[: len(prompts)]
    roots = {}

    def compare_prompt(what: str, expected, actual) -> None:
        _compare(
            f"{where} {what} logits", expected.logits, backend.to_numpy(actual.logits), tolerance
        )
        _compare(
            f"{where} {what} hidden", expected.hidden, backend.to_numpy(actual.hidden), tolerance
        )
        for layer in layers:
            _compare(
                f"{where} {what} layer {layer}",
                expected.layers[layer],
                backend.to_numpy(actual.layers[layer]),
                tolerance,
            )

    def admit(slot: int, prompt) -> None:
        expected, actual = (
            reference.admit(slot, prompt, layers=layers),
            target.admit(slot, prompt, layers=layers),
        )
        compare_prompt(f"admit slot {slot}", expected, actual)
        roots[slot] = int(np.argmax(expected.logits))

    def forward(step: str, active: np.ndarray, context=()) -> list:
        """A forward of tree rows over ``active`` (none: chunks only) and prompt ``context``;
        commits a random path per row; returns the reference's PromptOutput of each chunk."""
        tree = beams = None
        if len(active):
            beams = random_beams(
                rng, np.array([roots[int(s)] for s in active]), width, length, reference.vocab_size
            )
            tree = build_prefix_tree(beams)
        expected = reference.forward_tree(tree, active, context=context, layers=layers)
        actual = target.forward_tree(
            None if tree is None else to_backend_tree(tree, backend, target),
            active.copy(),
            context=[(slot, np.asarray(tokens)) for slot, tokens in context],
            layers=layers,
        )
        assert len(actual.context) == len(expected.context) == len(context), (
            f"{where} step {step}: forward_tree returned {len(actual.context)} context outputs for "
            f"{len(context)} prompt chunks (the reference: {len(expected.context)}); it must "
            "return one PromptOutput per chunk"
        )
        for (slot, _), want, got in zip(context, expected.context, actual.context, strict=True):
            compare_prompt(f"step {step} chunk of slot {slot}", want, got)
        if tree is None:
            return list(expected.context)
        mask = np.arange(tree.size)[None, :] < tree.num_nodes[:, None]  # compare real nodes only
        for name, want, got in [
            ("logits", expected.logits, actual.logits),
            ("hidden", expected.hidden, actual.hidden),
            *[(f"layer {i}", expected.layers[i], actual.layers[i]) for i in layers],
        ]:
            _compare(
                f"{where} step {step} slots {active.tolist()} tree {name}",
                want[mask],
                backend.to_numpy(got)[mask],
                tolerance,
            )
        verdict = random_verdict(rng, tree, beams)
        reference.commit(tree, verdict)
        target.commit(
            to_backend_tree(tree, backend, target),
            Verdict(
                path=backend.from_numpy(verdict.path, target),
                num_accepted=backend.from_numpy(verdict.num_accepted, target),
                bonus_tokens=backend.from_numpy(verdict.bonus_tokens, target),
            ),
        )
        roots.update({int(s): int(t) for s, t in zip(active, verdict.bonus_tokens, strict=True)})
        return list(expected.context)

    for slot, prompt in zip(slots, prompts, strict=True):
        admit(int(slot), prompt)
    for step in range(steps):
        if step == steps // 2 and len(roots) > 1:  # a request ends, another takes its slot
            freed = int(sorted(roots)[0])
            reference.release(freed), target.release(freed), roots.pop(freed)
            admit(freed, list(prompts[-1])[::-1] + [1])
        active = np.array(sorted(roots), dtype=np.int64)
        if step % 2 == 1 and len(active) > 1:
            active = active[rng.permutation(len(active))][:-1]  # a subset, in another order
        forward(str(step), active)
    free = [s for s in range(num_slots) if s not in roots]
    # the second chunk's token is outside the vocabulary
    bad = [
        (free[0], [1, 2]),
        (free[1], [reference.vocab_size]),
    ]
    try:
        target.forward_tree(None, np.zeros(0, dtype=np.int64), context=bad)
    except InvalidInputError:
        pass
    else:
        raise AssertionError(
            f"{where}: forward_tree(context={bad}) did not refuse a token outside the vocabulary"
        )
    for slot in free:  # a failed forward claims no slot and commits nothing
        try:
            actual = target.admit(slot, [3, 4], layers=layers)
        except InvalidInputError as error:
            raise AssertionError(
                f"{where}: after a refused forward_tree(context={bad}), slot {slot} cannot be "
                f"admitted into ({error}): a failed forward must claim no slot"
            ) from error
        compare_prompt(
            f"admit slot {slot} after a refused forward",
            reference.admit(slot, [3, 4], layers=layers),
            actual,
        )
        reference.release(slot), target.release(slot)
    chunks = {
        slot: rng.integers(0, reference.vocab_size, size=3 + 2 * i).tolist()
        for i, slot in enumerate(free)
    }
    forward("chunks", np.zeros(0, dtype=np.int64), [(s, c[:2]) for s, c in chunks.items()])
    last = forward(
        "packed", np.array(sorted(roots), dtype=np.int64), [(s, c[2:]) for s, c in chunks.items()]
    )
    roots.update({slot: int(np.argmax(out.logits)) for slot, out in zip(chunks, last, strict=True)})
    forward("after chunks", np.array(sorted(roots), dtype=np.int64)[::-1].copy())
