"""Check functions a backend plugin runs against the float64 NumPy reference.

Each check raises ``AssertionError`` with a message naming the function, backend and inputs.
Use them in a plugin's own test suite, e.g.::

    from specdec.testing import checks, make_random_model
    def test_my_backend(tmp_path):
        model = make_random_model(tmp_path / "m", vocab_size=64, hidden_size=32, num_layers=2,
                                  num_heads=4, num_kv_heads=2, seed=0)
        checks.check_target(my_backend_name, model, dtype="float32")

Every check computes in float32 unless ``dtype`` says otherwise (the numpy reference always
computes in float64); see docs/writing-a-backend.md and docs/writing-a-drafter.md.
"""

from __future__ import annotations

import warnings
from typing import Sequence

import numpy as np

from specdec.capabilities import drafter_caps, request_end
from specdec.generation.api import generate
from specdec.generation.components import load_drafter
from specdec.generation.loading import load
from specdec.generation.resolve import resolve
from specdec.plugins.registry import PluginRegistry
from specdec.testing.target_checks import (
    FLOAT32,
    FLOAT64,
    _registry,
    check_target,
    random_beams,
    random_verdict,
    to_backend_tree,
)
from specdec.types import Draft, DraftTree, SamplingConfig, TargetOutput


def check_tree_builder(
    backend_name: str,
    target,
    *,
    name: str = "prefix_tree",
    options: dict | None = None,
    drafts: Sequence[Draft] = (),
    registry: PluginRegistry | None = None,
) -> None:
    """The backend's tree builder ``name`` gives the reference's trees for these (NumPy) drafts."""
    registry = _registry(registry)
    backend = registry.get("backend", backend_name).factory()
    reference = registry.get("tree_builder", name, "numpy").factory(**(options or {}))
    builder = registry.get("tree_builder", name, backend_name).factory(**(options or {}))
    for i, draft in enumerate(drafts):
        expected = reference.build(draft)
        moved = Draft(
            root_tokens=backend.from_numpy(draft.root_tokens, target),
            beams=None if draft.beams is None else backend.from_numpy(draft.beams, target),
            head_tokens=None
            if draft.head_tokens is None
            else backend.from_numpy(draft.head_tokens, target),
            beam_lengths=draft.beam_lengths,  # host-side, as drafters give them
        )
        actual = builder.build(moved)
        for field in ("tokens", "parents", "depth", "ancestor_mask", "num_nodes", "beam_to_node"):
            want, got = getattr(expected, field), getattr(actual, field)
            if want is None:
                assert got is None, (
                    f"check_tree_builder({backend_name!r}, {name!r}) draft {i}: {field} should be "
                    "None"
                )
                continue
            got = backend.to_numpy(got)
            assert np.array_equal(np.asarray(want), got), (
                f"check_tree_builder({backend_name!r}, {name!r}) draft {i}: {field} differs\n"
                f"reference {np.asarray(want).tolist()}\nbackend   {got.tolist()}"
            )


__all__ = [
    "FLOAT32",
    "FLOAT64",
    "random_beams",
    "random_verdict",
    "to_backend_tree",
    "check_drafter",
    "check_generation",
    "check_slot_views",
    "check_target",
    "check_tree_builder",
    "check_verifier",
]


def check_verifier(
    backend_name: str,
    target,
    *,
    name: str,
    tree: DraftTree,
    draft: Draft,
    logits: np.ndarray,
    sampling: SamplingConfig,
    uniforms: np.ndarray | None,
    registry: PluginRegistry | None = None,
) -> None:
    """The backend's verifier ``name`` gives the reference's verdict for the same logits and
    uniforms."""
    registry = _registry(registry)
    backend = registry.get("backend", backend_name).factory()
    reference = registry.get("verifier", name, "numpy").factory()
    verifier = registry.get("verifier", name, backend_name).factory()
    hidden = np.zeros(logits.shape[:2] + (1,))
    expected = reference.verify(
        tree, draft, TargetOutput(logits=logits, hidden=hidden), sampling, uniforms
    )
    put = lambda a: None if a is None else backend.from_numpy(np.asarray(a), target)
    moved_draft = Draft(
        root_tokens=put(draft.root_tokens),
        beams=put(draft.beams),
        head_tokens=put(draft.head_tokens),
        draft_probs=put(draft.draft_probs),
        sampled=draft.sampled,
        beam_lengths=draft.beam_lengths,
    )
    actual = verifier.verify(
        to_backend_tree(tree, backend, target),
        moved_draft,
        TargetOutput(logits=put(logits), hidden=put(hidden)),
        sampling,
        put(uniforms),
    )
    for field in ("path", "num_accepted", "bonus_tokens"):
        want, got = np.asarray(getattr(expected, field)), backend.to_numpy(getattr(actual, field))
        assert np.array_equal(want, got), (
            f"check_verifier({backend_name!r}, {name!r}, {sampling}): {field} {got.tolist()}, "
            f"reference {want.tolist()}"
        )


def check_generation(
    backend_name: str,
    model_path,
    drafter,
    *,
    prompts,
    dtype: str | None = "float32",
    max_new_tokens: int = 8,
    registry: PluginRegistry | None = None,
    **options,
) -> None:
    """``generate`` on ``backend_name`` in ``dtype`` emits the same tokens as on the numpy reference
    (same seed). ``drafter`` must be available on both backends: a name registered for every
    backend ("none", "lookup"), or one (or a checkpoint of one) registered for both. ``dtype``
    applies to every backend but numpy (float64 only). Returns None; raises AssertionError
    naming the tokens that differ."""
    expected = generate(
        model_path,
        prompts,
        drafter=drafter,
        backend="numpy",
        max_new_tokens=max_new_tokens,
        registry=registry,
        **options,
    ).tokens
    actual = generate(
        model_path,
        prompts,
        drafter=drafter,
        backend=backend_name,
        dtype=None if backend_name == "numpy" else dtype,
        max_new_tokens=max_new_tokens,
        registry=registry,
        **options,
    ).tokens
    assert actual == expected, (
        f"check_generation({backend_name!r}, drafter={drafter}, dtype={dtype}"
        f"{_listed(options)}): tokens "
        f"differ\nreference {expected}\nbackend   {actual}"
    )


def check_drafter(
    drafter,
    model_path,
    *,
    backends: Sequence[str] = ("numpy",),
    dtype: str | None = "float32",
    prompts: Sequence[Sequence[int]] = ((1, 2, 3, 1, 2, 3, 1, 2), (4, 5, 6), (7,)),
    max_new_tokens: int = 16,
    seed: int = 0,
    registry: PluginRegistry | None = None,
    **options,
) -> dict[str, tuple[int, int]]:
    """Drafter ``drafter`` (a name or a checkpoint folder) is lossless on each of ``backends``: its
    greedy tokens equal plain decoding's (``drafter="none"``) on that backend and the numpy
    reference's, and a seeded sampled generation (temperature 1) runs, every draft checked by the
    decode loop. Every step drafts (``speculation="always"`` unless ``options`` names another):
    under "auto" a drafter that does not pay on the kit's random model would be checked on
    few drafts. A drafter that drafts no token in the greedy runs fails: nothing of it was
    checked (give ``prompts`` on which it drafts). Returns each backend's greedy
    ``(drafted tokens, accepted tokens)``. On the reference, the prompts decoded on a target with
    one slot (one request after another, the slot reused) and with one slot per prompt give the
    same tokens and draft
    the same (the drafted and accepted token counts, every request drafting every step), greedy
    and sampled with per-prompt seeds: what a stateful drafter keeps per slot must start afresh
    with each request. Tokens alone cannot show it: a kept state changes the drafts, and drafts
    never change a request's tokens. A stateful drafter that shows its per-slot view
    (``slot_tokens``) is held to the requests' histories (``check_slot_views``). ``dtype``
    applies to every backend but numpy (float64 only)."""
    plain = generate(
        model_path,
        [list(p) for p in prompts],
        drafter="none",
        backend="numpy",
        max_new_tokens=max_new_tokens,
        stop_at_eos=False,
        registry=registry,
    ).tokens
    options = {"speculation": "always", **options}
    counts = {}
    for backend in backends:
        where = (
            f"check_drafter({drafter!s}, backend={backend!r}, dtype={dtype!r}{_listed(options)})"
        )
        run = dict(
            backend=backend,
            dtype=None if backend == "numpy" else dtype,
            max_new_tokens=max_new_tokens,
            stop_at_eos=False,
            registry=registry,
        )
        baseline = (
            plain
            if backend == "numpy"
            else generate(model_path, [list(p) for p in prompts], drafter="none", **run).tokens
        )
        assert baseline == plain, (
            f"{where}: plain decoding differs from the reference's; check the backend first"
        )
        greedy = generate(model_path, [list(p) for p in prompts], drafter=drafter, **run, **options)
        tokens = greedy.tokens
        assert tokens == plain, (
            f"{where}: greedy tokens differ from plain decoding\nplain   {plain}\ndrafted {tokens}"
        )
        counts[backend] = (greedy.stats.drafted_tokens, greedy.stats.accepted_tokens)
        assert greedy.stats.drafted_tokens > 0, (
            f"{where}: the drafter drafted no token in {greedy.stats.steps} steps over "
            f"{len(prompts)} prompts, so nothing of it was checked (a drafter that never "
            "proposes is lossless whatever its code does); fix its propose, or pass prompts= "
            "on which it drafts"
        )
        drafting = greedy.stats.drafting_row_steps
        if greedy.stats.drafted_tokens <= drafting:
            warnings.warn(
                f"{where}: the drafter proposed one token a step at most "
                f"({greedy.stats.drafted_tokens} tokens in {drafting} drafting steps), so its "
                "longer drafts, and any option that sets their length, went unchecked; the "
                "kit's random model repeats its last token, where a drafter that copies what "
                "followed the latest match finds one token: pass prompts= on which it drafts "
                "more",
                stacklevel=2,
            )
        sampled = generate(
            model_path,
            [list(p) for p in prompts],
            drafter=drafter,
            temperature=1.0,
            seed=seed,
            **run,
            **options,
        ).tokens
        assert [len(row) for row in sampled] == [max_new_tokens] * len(prompts), (
            f"{where}: sampled rows cut short"
        )
    seeds = [seed + b for b in range(len(prompts))]

    def decode(slots, temperature):
        result = generate(
            load(model_path, backend="numpy", slots=slots, registry=registry),
            [list(p) for p in prompts],
            drafter=drafter,
            backend="numpy",
            max_new_tokens=max_new_tokens,
            stop_at_eos=False,
            temperature=temperature,
            seed=seeds,
            registry=registry,
            **options,
        )
        return result.tokens, result.stats.drafted_tokens, result.stats.accepted_tokens

    for temperature in (0.0, 1.0):
        runs = {slots: decode(slots, temperature) for slots in (1, len(prompts))}
        differ = [
            f"{name}: {a} in one slot, {b} side by side"
            for name, a, b in zip(
                ("tokens", "drafted tokens", "accepted tokens"), runs[1], runs[len(prompts)]
            )
            if a != b
        ]
        assert not differ, (
            f"check_drafter({drafter!s}{_listed(options)}): at temperature {temperature} the "
            "prompts decoded one after another in one slot differ from decoding them side by "
            "side, so the drafter keeps something of a request past its end (look at begin, "
            "which must start the slot afresh, and end): " + "; ".join(differ)
        )
    check_slot_views(
        drafter,
        model_path,
        prompts=prompts,
        max_new_tokens=max_new_tokens,
        seed=seed,
        registry=registry,
        **options,
    )
    return counts


# generate's own options; the others in a check's ``options`` go to the drafter's factory
GENERATE_OPTIONS = ("verifier", "tree_builder", "stop_at_eos", "speculation", "lookup")


def check_slot_views(
    drafter,
    model_path,
    *,
    prompts: Sequence[Sequence[int]] = ((1, 2, 3, 1, 2, 3, 1, 2), (4, 5, 6), (7,)),
    max_new_tokens: int = 16,
    seed: int = 0,
    registry: PluginRegistry | None = None,
    **options,
) -> int:
    """A stateful drafter's per-slot view equals each request's history, on the reference.

    A drafter that shows what its state for a slot stands for (the optional ``slot_tokens(slot)``,
    docs/writing-a-drafter.md) is watched through a greedy and a seeded sampled generation, on a
    target with fewer slots than prompts (so a slot serves a second request): after ``begin`` its
    view must be the prompt, at every ``propose`` the row's ``DraftContext.history`` without its
    root (the tokens in the target's cache), after every ``observe`` the prompt and every token
    committed since (roots and accepted drafted tokens). An observer that is off by one (that
    drops the root, or adds the bonus token) stays lossless, since drafts never change a
    request's tokens, but drafts from the wrong text; this check names the first difference.
    ``drafter``: a name, a checkpoint folder or a Drafter object; ``options`` as
    ``check_drafter``'s. Returns the number of views compared (0: the drafter is not stateful or
    shows no view)."""
    registry = _registry(registry)
    drafter_options = {k: v for k, v in options.items() if k not in GENERATE_OPTIONS}
    run_options = {k: v for k, v in options.items() if k in GENERATE_OPTIONS}
    slots = max(1, len(prompts) - 1)
    target = load(model_path, backend="numpy", slots=slots, registry=registry)
    backend = registry.get("backend", "numpy").factory()
    named = resolve("drafter", drafter, registry, backend.name)
    inner = load_drafter(named, target, backend, registry, drafter_options)
    caps = drafter_caps(inner, named.source)
    shows_view = callable(getattr(inner, "slot_tokens", None))
    if caps.stateful and not shows_view:
        warnings.warn(
            f"check_slot_views({drafter!s}): a stateful drafter without slot_tokens: its per-slot "
            "state is judged only by the drafts it changes, which on a small random model may "
            "be none; give it slot_tokens(slot) (docs/writing-a-drafter.md) to have the state "
            "itself compared",
            stacklevel=2,
        )
    if not caps.stateful or not shows_view:
        return 0
    # named after the drafter's class: an error the decode loop raises names the drafter
    watcher_class = type(type(inner).__name__, (_ViewWatcher,), {})
    compared = 0
    for temperature in (0.0, 1.0):
        watcher = watcher_class(inner, f"check_slot_views({drafter!s}{_listed(options)})")
        generate(
            target,
            [list(p) for p in prompts],
            drafter=watcher,
            backend="numpy",
            max_new_tokens=max_new_tokens,
            temperature=temperature,
            seed=[seed + b for b in range(len(prompts))],
            registry=registry,
            **{"speculation": "always", "stop_at_eos": False, **run_options},
        )
        compared += watcher.compared
    return compared


def _listed(options: dict) -> str:
    """``options`` as a call's keywords after the ones before them (nothing when there are none)."""
    return "".join(f", {name}={value!r}" for name, value in options.items())


class _ViewWatcher:
    """A stateful drafter, its every call passed on, its per-slot view compared with what the
    request holds before and after (``check_slot_views``)."""

    def __init__(self, inner, where: str):
        self.inner, self.where, self.compared = inner, where, 0
        self.caps = inner.caps
        self._end = request_end(inner)
        self.expected: dict[int, list[int]] = {}

    def __getattr__(self, name):  # sample_shape and the like: the wrapped drafter's
        return getattr(self.inner, name)

    def _compare(self, slot: int, expected, when: str) -> None:
        view = [int(t) for t in np.asarray(self.inner.slot_tokens(slot)).reshape(-1)]
        expected = [int(t) for t in expected]
        if view != expected:
            first = next(
                (i for i, (a, b) in enumerate(zip(view, expected, strict=False)) if a != b),
                min(len(view), len(expected)),
            )
            raise AssertionError(
                f"{self.where}: {when}, slot_tokens({slot}) holds {len(view)} tokens where the "
                f"request has {len(expected)}, first differing at position {first}: view "
                f"{view[first : first + 4]}..., request {expected[first : first + 4]}...; the "
                "drafter's per-slot state no longer follows the request (look at begin, which "
                "starts the slot afresh, end, which drops it, and observe, which gets the root "
                "and the accepted drafted tokens, accepted.tokens[b, : num_accepted[b] + 1], and "
                "not the bonus token)"
            )
        self.compared += 1

    def begin(self, slot, prompt, output):
        self.inner.begin(slot, prompt, output)
        self.expected[int(slot)] = [int(t) for t in np.asarray(prompt)]
        self._compare(int(slot), self.expected[int(slot)], "after begin")

    def propose(self, context):
        for b, slot in enumerate(np.asarray(context.slots).tolist()):
            history = np.asarray(context.history[b])
            self._compare(slot, history[:-1], "at propose (the history without its root)")
        return self.inner.propose(context)

    def observe(self, accepted):
        self.inner.observe(accepted)
        tokens = np.asarray(accepted.tokens)
        for b, slot in enumerate(np.asarray(accepted.slots).tolist()):
            count = int(np.asarray(accepted.num_accepted)[b]) + 1
            self.expected[slot] += tokens[b, :count].tolist()
            self._compare(slot, self.expected[slot], "after observe")

    def end(self, slot, reason):
        self.expected.pop(int(slot), None)
        self._end(slot, reason)
