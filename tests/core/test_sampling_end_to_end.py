"""Sampling end to end through ``generate()``: the emitted tokens have the target's distribution,
on the float64 reference, on torch in float64 and on mlx in float32 (mlx has no float64).

A fixed-seed chi-square test per backend, drafter and lossless verifier. The target is a random
model with a 4-token vocabulary, sampled at temperature 2.5; ROWS = 3000 copies of one prompt decode
NEW = 3 tokens in one batch (every row has its own random stream), so the emitted tokens fall
into 64 cells whose exact probabilities come from the reference target's own conditionals.
Cells expected to hold fewer than 5 samples are pooled (12 cells remain, 11 degrees of
freedom). The statistic must stay below the chi-square quantile at ALPHA = 1e-3 (a false alarm
has probability 1e-3 before the seed is fixed). Power: a deviation of non-centrality
N * sum (p' - p)^2 / p = 60, e.g. 0.032 of probability moved between two cells of probability
0.1, is detected with probability about 0.99; and the lossy verifiers, run the same way, must
be detected (their statistics are in the thousands). Every verifier must read each uniform of a
step at most once (checked on the reference), and the drafters must have tokens accepted. A 2%
error in the acceptance probability moves these cells too little for this test: the tests of
tests/backends/test_sampled_verification.py have the power for it, stated there. mlx decodes the
rows 300 at a time (a loaded target with 300 slots): its step cost grows with the slots held.
"""

from __future__ import annotations

import importlib.util
import itertools
import math

import numpy as np
import pytest

import specdec
from specdec.reference import verify as reference_verify
from specdec.reference.sampling import target_probs
from specdec.testing import make_random_drafter, make_random_model
from specdec.testing.batch import Batch
from specdec.types import SamplingConfig

V, NEW, ROWS, ALPHA = 4, 3, 3000, 1e-3
PROMPT = [1, 2, 3, 1, 2]
SAMPLING = SamplingConfig(temperature=2.5)
Z_ALPHA = 3.0902  # the standard normal's upper 1e-3 quantile


def chi2_quantile(df: int) -> float:
    """Upper ALPHA quantile of chi-square(df), Wilson-Hilferty (within 0.5% for df >= 10)."""
    c = 2.0 / (9.0 * df)
    return df * (1.0 - c + Z_ALPHA * math.sqrt(c)) ** 3


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    root = tmp_path_factory.mktemp("e2e")
    model = make_random_model(
        root / "model",
        vocab_size=V,
        hidden_size=16,
        num_layers=1,
        num_heads=2,
        num_kv_heads=1,
        seed=4,
    )
    target = Batch(specdec.load(model, backend="numpy"))
    joint = {}
    for cell in itertools.product(range(V), repeat=NEW):
        p = 1.0
        for i in range(NEW):
            logits = target.prefill([PROMPT + list(cell[:i])]).logits[0, 0]
            p *= float(target_probs(np.asarray(logits, dtype=np.float64), SAMPLING)[cell[i]])
        joint[cell] = p
    assert abs(sum(joint.values()) - 1.0) < 1e-9
    drafters = {
        "none": "none",
        "lookup": "lookup",
        "redrafter": make_random_drafter(root / "redrafter", model, kind="redrafter", seed=1),
        "medusa": make_random_drafter(
            root / "medusa",
            model,
            kind="medusa",
            seed=2,
            top_t=2,
            choices=[[0], [1], [0, 0], [0, 1], [1, 0]],
        ),
        "eagle": make_random_drafter(root / "eagle", model, kind="eagle", seed=3),
        "draft_model": "draft_model",
    }
    draft = make_random_model(
        root / "draft",
        vocab_size=V,
        hidden_size=16,
        num_layers=1,
        num_heads=2,
        num_kv_heads=1,
        seed=6,
    )
    return model, joint, drafters, draft


BACKENDS = {
    "numpy": (None, ()),
    "torch": ("float64", ("torch",)),
    "mlx": ("float32", ("mlx.core", "mlx_lm")),
}


def on_backend(model, backend: str):
    """(target or model folder, dtype) for ``backend``; skips when its framework is not
    installed."""
    dtype, modules = BACKENDS[backend]
    if any(importlib.util.find_spec(m.split(".")[0]) is None for m in modules):
        pytest.skip(f"{backend} is not installed")
    if backend == "mlx":
        return specdec.load(model, backend="mlx", dtype=dtype, slots=300, capacity=32), dtype
    return model, dtype


def chi_square(world, drafter: str, verifier: str | None, seed: int = 5, backend: str = "numpy"):
    model, joint, drafters, draft = world
    options = {"beam_width": 2, "beam_length": 3} if drafter.startswith("redrafter") else {}
    if (
        drafter == "redrafter-sampled"
    ):  # beams drawn from the drafter (rejection verifier by default)
        drafter, options["sample"] = "redrafter", True
    if drafter.startswith(
        "draft_model"
    ):  # a chain of 2 drawn from the draft model (rejection), or its argmax
        options.update(draft_model=draft, draft_length=2, sample=drafter == "draft_model")
        drafter = "draft_model"
    if drafter == "lookup":  # a match for every root the prompt holds: chains from the first
        options["min_ngram"] = 1  # step (a row without one drafts nothing)
    if verifier is not None:
        options["verifier"] = verifier
    target, dtype = on_backend(model, backend)
    steps = specdec.stream(
        target,
        [PROMPT] * ROWS,
        drafter=drafters[drafter],
        backend=backend,
        dtype=dtype,
        max_new_tokens=NEW,
        temperature=SAMPLING.temperature,
        seed=seed,
        stop_at_eos=False,
        **options,
    )
    rows, accepted = [[] for _ in range(ROWS)], 0
    for step in steps:
        for b, new in enumerate(step.new_tokens):
            rows[b].extend(new)
        # what the verifier accepted, the last step's too (generate's stats count only what
        # the rows kept, and a row's last step is cut to its length)
        accepted += int(np.sum(step.num_accepted))
    counts = {}
    for row in rows:
        counts[tuple(row)] = counts.get(tuple(row), 0) + 1
    big = [cell for cell, p in joint.items() if p * ROWS >= 5]
    small = [cell for cell in joint if cell not in big]
    observed = [counts.get(cell, 0) for cell in big] + [sum(counts.get(cell, 0) for cell in small)]
    expected = [joint[cell] * ROWS for cell in big] + [sum(joint[cell] for cell in small) * ROWS]
    statistic = sum((o - e) ** 2 / e for o, e in zip(observed, expected, strict=True) if e > 0)
    assert len(observed) - 1 >= 10, "too few cells for the quantile's approximation"
    return statistic, chi2_quantile(len(observed) - 1), accepted


class OnceChooser(reference_verify.UniformChooser):
    """A UniformChooser that fails when a uniform of its row is read a second time."""

    def __init__(self, uniforms):
        super().__init__(uniforms)
        self.used = set()

    def _take(self, key):
        assert key not in self.used, f"uniform {key} of a step read twice"
        self.used.add(key)

    def categorical(self, probs, depth):
        self._take((depth, 0))
        return super().categorical(probs, depth)

    def accept(self, probability, depth, beam):
        self._take((depth, 1 + beam))
        return super().accept(probability, depth, beam)


@pytest.mark.parametrize(
    "drafter, verifier",
    [  # None: the default verifier (exact, or rejection for sampled beams)
        ("none", None),
        ("lookup", None),
        ("redrafter", None),
        ("redrafter-sampled", None),
        ("redrafter-sampled", "exact"),
        ("medusa", None),
        ("eagle", None),
        ("draft_model", None),
        ("draft_model-argmax", None),
    ],
)
@pytest.mark.parametrize("backend", sorted(BACKENDS))
def test_emitted_tokens_have_the_target_distribution(
    world, backend, drafter, verifier, monkeypatch
):
    monkeypatch.setattr(reference_verify, "UniformChooser", OnceChooser)
    statistic, quantile, accepted = chi_square(world, drafter, verifier, backend=backend)
    assert statistic < quantile, (
        f"{backend} drafter={drafter} verifier={verifier}: chi-square {statistic:.1f} >= "
        f"{quantile:.1f}"
    )
    if drafter != "none":  # drafted tokens were accepted, so the accept path is what was tested
        assert accepted > ROWS // 4, accepted


@pytest.mark.parametrize(
    "drafter, verifier", [("medusa", "typical"), ("redrafter", "redrafter_published")]
)
def test_lossy_verifiers_are_detected(world, drafter, verifier):
    """The test's power, shown: rules known to change the distribution fail it."""
    statistic, quantile, _ = chi_square(world, drafter, verifier)
    assert statistic > quantile, (
        f"drafter={drafter} verifier={verifier}: chi-square {statistic:.1f} < {quantile:.1f}"
    )


def test_a_greedy_verifier_is_refused_for_sampled_requests(model_dir):
    """verifier="greedy" ignores temperature: asking it to sample was silently greedy; generate
    refuses it (naming the verifiers that sample), and so does an engine built on it."""
    import pytest

    import specdec
    from specdec.errors import InvalidInputError

    with pytest.raises(InvalidInputError, match="decodes greedily"):
        specdec.generate(
            model_dir, [1, 2, 3], drafter="lookup", backend="numpy", max_new_tokens=4,
            temperature=1.0, seed=1, verifier="greedy",
        )  # fmt: skip
    greedy = specdec.generate(
        model_dir, [1, 2, 3], drafter="lookup", backend="numpy", max_new_tokens=4, verifier="greedy"
    )
    assert len(greedy.tokens) == 4
    with specdec.Engine(model_dir, drafter="lookup", backend="numpy", verifier="greedy") as engine:
        assert len(engine.generate([1, 2, 3], max_new_tokens=3).tokens) == 3
        with pytest.raises(InvalidInputError, match="verifier decodes greedily"):
            engine.submit([1, 2, 3], max_new_tokens=3, temperature=0.7, seed=2)
