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

from typing import Sequence

import numpy as np

from specdec.capabilities import drafter_caps, request_end
from specdec.errors import InvalidInputError
from specdec.generation.api import generate
from specdec.generation.components import load_drafter
from specdec.generation.loading import load
from specdec.generation.resolve import resolve
from specdec.plugins.registry import PluginRegistry, default_registry
from specdec.reference.model import load_target
from specdec.reference.tree import build_prefix_tree
from specdec.types import Draft, DraftTree, SamplingConfig, TargetOutput, Verdict

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
    bad = [
        (free[0], [1, 2]),
        (free[1], [reference.vocab_size]),
    ]  # the second chunk's token is outside the vocabulary
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
    backend ("none", "lookup"), or one (or a checkpoint of one) registered for both."""
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
        dtype=dtype,
        max_new_tokens=max_new_tokens,
        registry=registry,
        **options,
    ).tokens
    assert actual == expected, (
        f"check_generation({backend_name!r}, drafter={drafter}, dtype={dtype}, {options}): tokens "
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
) -> None:
    """Drafter ``drafter`` (a name or a checkpoint folder) is lossless on each of ``backends``: its
    greedy tokens equal plain decoding's (``drafter="none"``) on that backend and the numpy
    reference's, and a seeded sampled generation (temperature 1) runs, every draft checked by the
    decode loop. On the reference, the prompts decoded on a target with one slot (one request
    after another, the slot reused) and with one slot per prompt give the same tokens and draft
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
    for backend in backends:
        where = f"check_drafter({drafter!s}, backend={backend!r}, dtype={dtype!r}, {options})"
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
        tokens = generate(
            model_path, [list(p) for p in prompts], drafter=drafter, **run, **options
        ).tokens
        assert tokens == plain, (
            f"{where}: greedy tokens differ from plain decoding\nplain   {plain}\ndrafted {tokens}"
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
            **{"speculation": "always", **options},
        )
        return result.tokens, result.stats.drafted_tokens, result.stats.accepted_tokens

    for temperature in (0.0, 1.0):
        runs = {slots: decode(slots, temperature) for slots in (1, len(prompts))}
        assert runs[1] == runs[len(prompts)], (
            f"check_drafter({drafter!s}, {options}): at temperature {temperature} the prompts "
            "decoded one after another in one slot differ from decoding them side by side (tokens, "
            f"drafted tokens, accepted tokens)\none slot {runs[1]}\n"
            f"side by side {runs[len(prompts)]}"
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
    if not caps.stateful or not callable(getattr(inner, "slot_tokens", None)):
        return 0
    compared = 0
    for temperature in (0.0, 1.0):
        watcher = _ViewWatcher(inner, f"check_slot_views({drafter!s}, {options})")
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
                "drafter's per-slot state no longer follows the request (look at begin and "
                "observe: observe gets the root and the accepted drafted tokens, "
                "accepted.tokens[b, : num_accepted[b] + 1], and not the bonus token)"
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
