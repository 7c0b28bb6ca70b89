"""Sampled verification on torch (float64) and mlx (float32) emits the target's distribution: a
chi-square test per lossless verifier and world, with its power against a 2% error stated,
computed and shown.

A world is the target's logits after every prefix of up to L-1 tokens (a table), a drafter's
distribution per depth and ROWS rows. Each row's W beams are drawn from the drafter (so they are
``Draft.sampled``, as rejection sampling needs, and fixed before the target's randomness, as the
exact tree walk needs), packed into a prefix tree and verified once with the row's own uniforms.
The tokens a row emits (its accepted drafted tokens, then the bonus) are tested conditionally:
each, given those before it, must follow the target's distribution after them
(``specdec.testing.sampling.conditional_chi_square``, cells expected below 5 pooled), however
many drafted tokens were accepted. The statistic must stay below the chi-square quantile at
ALPHA = 1e-3 (a false alarm has probability 1e-3 before the seeds were fixed).

Power. In ``sharp`` the drafter always proposes token 0, which the target gives 0.95 after the
root. A rejection verifier whose acceptance probability is 2% low accepts it with 0.931 and moves
0.019 of probability from token 0 to the others at the root: non-centrality ROWS * sum (p' - p)^2
/ p = 20000 * 0.0076 = 152, detected with probability above 0.99999 at ALPHA with the test's 18
degrees of freedom (``chi2_power``; the test computes both from the exact distributions,
enumerated with the reference). Then the error is planted: each backend's ``acceptance_probability``
scaled by 0.98 fails the test. ``mixed``: random tables over 5 tokens, 3 beams of 2 drafted tokens,
temperature 0.8 and top-k 4 (the target gives some drafted tokens no probability).
"""

from __future__ import annotations

import importlib.util
import itertools
from types import SimpleNamespace

import numpy as np
import pytest

from specdec.plugins.registry import default_registry
from specdec.reference import verify as reference_verify
from specdec.reference.sampling import target_probs
from specdec.reference.tree import build_prefix_tree
from specdec.testing.checks import to_backend_tree
from specdec.testing.enumeration import enumerate_outcomes
from specdec.testing.sampling import chi2_power, chi2_quantile, conditional_chi_square, emitted_rows
from specdec.types import Draft, SamplingConfig, TargetOutput

ROWS, ALPHA, ROOT = 20000, 1e-3, 0
FRAMEWORKS = {"torch": "torch", "mlx": "mlx.core"}
VERIFY_MODULES = {"torch": "specdec_torch.verify", "mlx": "specdec_mlx.verify"}


def make_world(name: str) -> SimpleNamespace:
    rng = np.random.default_rng({"sharp": 1, "mixed": 2}[name])
    vocab, width, length = {"sharp": (4, 2, 3), "mixed": (5, 3, 3)}[name]
    sampling = (
        SamplingConfig(temperature=1.0)
        if name == "sharp"
        else SamplingConfig(temperature=0.8, top_k=4)
    )
    prefixes = [p for k in range(length) for p in itertools.product(range(vocab), repeat=k)]
    table = {p: np.log(rng.dirichlet(np.ones(vocab))) for p in prefixes}
    draft = rng.dirichlet(np.ones(vocab), size=length - 1)
    if name == "sharp":
        table[()] = np.log([0.95, 0.025, 0.015, 0.01])
        draft[0] = [1.0, 0.0, 0.0, 0.0]
    return SimpleNamespace(
        name=name,
        vocab=vocab,
        width=width,
        length=length,
        sampling=sampling,
        table=table,
        draft=draft,
    )


def conditional(world):
    return lambda prefix: target_probs(world.table[tuple(prefix)], world.sampling)


def world_rows(world, rows: int, seed: int):
    """NumPy inputs of one verification of ``rows`` rows: tree, draft, logits (B, N, V),
    uniforms."""
    rng = np.random.default_rng(seed)
    beams = np.full((rows, world.width, world.length), ROOT, dtype=np.int64)
    for d in range(world.length - 1):
        cdf = np.cumsum(world.draft[d])
        beams[:, :, d + 1] = np.minimum(
            (cdf[None, None, :] <= rng.random((rows, world.width, 1))).sum(-1),
            np.flatnonzero(world.draft[d] > 0).max(),
        )
    tree = build_prefix_tree(beams)
    index = {p: i for i, p in enumerate(world.table)}
    logits_table = np.stack(list(world.table.values()))
    node_prefix = np.zeros(
        tree.tokens.shape, dtype=np.int64
    )  # index of each node's prefix in the table
    prefixes = [[()] * tree.size for _ in range(rows)]
    for b in range(rows):
        for i in range(1, int(tree.num_nodes[b])):
            prefixes[b][i] = prefixes[b][int(tree.parents[b, i])] + (int(tree.tokens[b, i]),)
            node_prefix[b, i] = index[prefixes[b][i]]
    draft_probs = np.broadcast_to(
        world.draft[None, None], (rows, world.width, world.length - 1, world.vocab)
    )
    draft = Draft(
        root_tokens=beams[:, 0, 0].copy(),
        beams=beams,
        draft_probs=np.ascontiguousarray(draft_probs),
        sampled=True,
    )
    uniforms = rng.random((rows, world.length, world.width + 1))
    return tree, draft, logits_table[node_prefix], uniforms


@pytest.fixture(scope="module")
def worlds():
    return {
        name: (world, world_rows(world, ROWS, seed=7))
        for name, world in ((n, make_world(n)) for n in ("sharp", "mixed"))
    }


def framework(name: str):
    """The backend ``name`` and a target for its arrays; skips when its framework is not
    installed."""
    if importlib.util.find_spec(FRAMEWORKS[name].split(".")[0]) is None:
        pytest.skip(f"{name} is not installed")
    backend = default_registry().get("backend", name).factory()
    return backend, SimpleNamespace(
        device=__import__("torch").device("cpu")
    ) if name == "torch" else None


def statistic_on(backend_name: str, verifier_name: str, world, inputs) -> tuple[float, int]:
    backend, target = framework(backend_name)
    tree, draft, logits, uniforms = inputs
    # float64 stays float64 on torch
    put = lambda a: backend.from_numpy(np.asarray(a), target)  # noqa: E731
    verifier = default_registry().get("verifier", verifier_name, backend_name).factory()
    moved = Draft(
        root_tokens=put(draft.root_tokens),
        beams=put(draft.beams),
        draft_probs=put(draft.draft_probs),
        sampled=True,
    )
    verdict = verifier.verify(
        to_backend_tree(tree, backend, target),
        moved,
        TargetOutput(logits=put(logits), hidden=put(np.zeros(logits.shape[:2] + (1,)))),
        world.sampling,
        put(uniforms),
    )
    host = [backend.to_numpy(getattr(verdict, f)) for f in ("path", "num_accepted", "bonus_tokens")]
    rows = emitted_rows(tree.tokens, *host)
    assert max(len(r) for r in rows) == world.length, "some rows had every drafted token accepted"
    return conditional_chi_square(rows, conditional(world))


@pytest.mark.parametrize("world_name", ["sharp", "mixed"])
@pytest.mark.parametrize("verifier", ["exact", "rejection"])
@pytest.mark.parametrize("backend", ["torch", "mlx"])
def test_sampled_verification_emits_the_target_distribution(worlds, backend, verifier, world_name):
    world, inputs = worlds[world_name]
    statistic, df = statistic_on(backend, verifier, world, inputs)
    assert df >= 10, f"{df} degrees of freedom: too few cells for the quantile's approximation"
    assert statistic < chi2_quantile(df, ALPHA), (
        f"{backend} {verifier} on {world_name}: chi-square {statistic:.1f} >= "
        f"{chi2_quantile(df, ALPHA):.1f} ({df} df)"
    )


def root_distribution(world, scale: float, monkeypatch) -> np.ndarray:
    """The exact distribution of the first token the reference's rejection verifier emits in
    ``world``, its acceptance probabilities scaled by ``scale``: every draw of the beams' first
    tokens, every branch of the verifier enumerated."""
    exact = reference_verify.acceptance_probability
    monkeypatch.setattr(
        reference_verify, "acceptance_probability", lambda r, q, t: scale * exact(r, q, t)
    )
    verifier, out = reference_verify.RejectionVerifier(), np.zeros(world.vocab)
    for first in itertools.product(range(world.vocab), repeat=world.width):
        weight = float(np.prod([world.draft[0][t] for t in first]))
        if weight == 0.0:
            continue
        beams = np.array([[[ROOT, t] for t in first]], dtype=np.int64)
        tree = build_prefix_tree(beams)
        logits = np.stack(
            [world.table[() if i == 0 else (int(tree.tokens[0, i]),)] for i in range(tree.size)]
        )[None]
        draft = Draft(
            root_tokens=beams[:, 0, 0],
            beams=beams,
            sampled=True,
            draft_probs=np.broadcast_to(world.draft[0], (1, world.width, 1, world.vocab)).copy(),
        )
        target = TargetOutput(logits=logits, hidden=np.zeros((1, tree.size, 1)))
        run = lambda chooser: verifier.verify_row(  # noqa: E731
            tree, draft, target, world.sampling, 0, chooser
        )
        for (path, bonus), w in enumerate_outcomes(run):
            out[int(tree.tokens[0, path[1]]) if len(path) > 1 else bonus] += weight * w
    monkeypatch.undo()
    return out


@pytest.mark.parametrize("backend", ["torch", "mlx"])
def test_a_two_percent_acceptance_error_fails_the_distribution_test(worlds, backend, monkeypatch):
    """The stated power, computed, then shown: the backend's rejection verifier with its acceptance
    probabilities scaled by 0.98 fails the test on ``sharp``."""
    world, inputs = worlds["sharp"]
    exact, planted = (
        root_distribution(world, 1.0, monkeypatch),
        root_distribution(world, 0.98, monkeypatch),
    )
    np.testing.assert_allclose(exact, target_probs(world.table[()], world.sampling), atol=1e-12)
    noncentrality = ROWS * float(np.sum((planted - exact) ** 2 / exact))
    _, df = statistic_on(backend, "rejection", world, inputs)
    assert noncentrality > 150 and chi2_power(df, noncentrality, ALPHA) > 0.99999, (
        noncentrality,
        df,
    )
    module = importlib.import_module(VERIFY_MODULES[backend])
    scaled = module.acceptance_probability
    monkeypatch.setattr(module, "acceptance_probability", lambda r, q, t: 0.98 * scaled(r, q, t))
    statistic, df = statistic_on(backend, "rejection", world, inputs)
    assert statistic > chi2_quantile(df, ALPHA), (
        f"{backend}: the planted error gave chi-square {statistic:.1f} only"
    )
