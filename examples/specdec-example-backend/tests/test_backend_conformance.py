"""The numpy32 backend against specdec's float64 reference, with specdec's conformance kit.

Run after ``pip install -e .`` (specdec finds the backend through its entry point).
"""

import warnings

import numpy as np
import pytest

import specdec
from specdec.reference.tree import build_prefix_tree
from specdec.testing import checks, make_random_model


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return make_random_model(
        tmp_path_factory.mktemp("m") / "llama",
        vocab_size=64,
        hidden_size=32,
        num_layers=2,
        num_heads=4,
        num_kv_heads=2,
        seed=0,
    )


@pytest.mark.parametrize("architecture", ["llama", "qwen2"])
def test_target_matches_the_reference(tmp_path, architecture):
    folder = make_random_model(
        tmp_path / architecture,
        vocab_size=64,
        hidden_size=32,
        num_layers=2,
        num_heads=4,
        num_kv_heads=2,
        seed=1,
        architecture=architecture,
    )
    checks.check_target("numpy32", folder)  # dtype="float32": prefill, tree forwards and commits
    checks.check_target("numpy32", folder, prompts=[list(range(1, 30))], steps=4, width=1, length=5)


def test_tree_builder_and_verifiers(model):
    target = specdec.load(model, backend="numpy32")
    beams = np.array([[[5, 1, 2, 3], [5, 1, 4, 3], [5, 6, 2, 2]]], dtype=np.int64)  # (B, W, L)
    draft = specdec.Draft(root_tokens=beams[:, 0, 0], beams=beams)
    checks.check_tree_builder("numpy32", target, drafts=[draft])
    tree = build_prefix_tree(beams)
    logits = np.random.default_rng(0).normal(size=(1, tree.size, 64)) * 3
    uniforms = np.random.default_rng(1).random((1, 4, 4))
    for name, sampling, u in (
        ("greedy", specdec.SamplingConfig(), None),
        ("exact", specdec.SamplingConfig(temperature=0.8), uniforms),
    ):
        checks.check_verifier(
            "numpy32",
            target,
            name=name,
            tree=tree,
            draft=draft,
            logits=logits,
            sampling=sampling,
            uniforms=u,
        )


@pytest.mark.parametrize("drafter", ["none", "lookup"])
def test_generation_matches_the_reference(model, drafter):
    prompts = [[1, 2, 3, 1, 2, 3, 1, 2], [7, 8]]
    checks.check_generation("numpy32", model, drafter, prompts=prompts, max_new_tokens=12)


def test_generate_loads_by_name(model):
    result = specdec.generate(
        model, [1, 2, 3], drafter="lookup", backend="numpy32", max_new_tokens=8
    )
    plain = specdec.generate(model, [1, 2, 3], drafter="none", backend="numpy32", max_new_tokens=8)
    assert result.tokens == plain.tokens and len(result.tokens) == 8


@pytest.mark.parametrize("kind", ["redrafter", "medusa", "eagle", "eagle3", "draft_model"])
def test_every_shipped_drafter_decodes_losslessly_here(model, tmp_path, kind):
    """numpy32 brings no drafter of its own: ReDrafter, Medusa (and its tree builder), EAGLE and
    EAGLE-3 run their NumPy references on the host (a warning says so once), the draft model
    drafts on numpy32 itself; every output equals plain decoding."""
    from specdec.plugins import on_host
    from specdec.testing import make_random_drafter

    on_host._warn_once.cache_clear()  # said once per process: again for this test

    if kind == "draft_model":
        drafter, options = "draft_model", {"draft_model": str(model)}
    else:
        drafter, options = str(make_random_drafter(tmp_path / kind, model, kind=kind, seed=1)), {}
    prompt = [1, 2, 3, 4, 1, 2, 3, 4, 1, 2]
    plain = specdec.generate(model, prompt, drafter="none", backend="numpy32", max_new_tokens=16)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = specdec.generate(
            model,
            prompt,
            drafter=drafter,
            backend="numpy32",
            max_new_tokens=16,
            speculation="always",
            **options,
        )
    assert result.tokens == plain.tokens
    assert result.stats.drafted_tokens > 0  # it drafted: the reference ran
    host = [w for w in caught if issubclass(w.category, on_host.ReferenceOnHostWarning)]
    assert bool(host) == (kind != "draft_model"), [str(w.message) for w in caught]


def test_a_checkpoint_that_records_its_targets_fingerprint_runs_here(model, tmp_path):
    """numpy32's targets offer no ``fingerprint`` (optional in the target protocol): a drafter
    checkpoint that records the fingerprint of the target it was trained for (as the shipped
    ones do) is checked by sizes and name alone here, and decodes."""
    import json

    from specdec.testing import make_random_drafter

    head = make_random_drafter(tmp_path / "rd", model, kind="redrafter", seed=1)
    config = json.loads((head / "config.json").read_text())
    config["target"]["fingerprint"] = "0" * 64
    (head / "config.json").write_text(json.dumps(config))
    prompt = [1, 2, 3, 4, 1, 2, 3, 4]
    plain = specdec.generate(model, prompt, drafter="none", backend="numpy32", max_new_tokens=8)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        result = specdec.generate(
            model, prompt, drafter=str(head), backend="numpy32", max_new_tokens=8
        )
    assert result.tokens == plain.tokens

