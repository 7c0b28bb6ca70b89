"""The shipped EAGLE (``drafters/specdec_eagle/weights/smollm2-135m``) loads offline, names its
target, and drafts losslessly for the real SmolLM2-135M when it is in the specdec cache (a skip
without it fails under SPECDEC_TEST_SHIPPED=1, as .ci/run sets: the ``shipped_model`` fixture)."""

from __future__ import annotations

from importlib import resources

import numpy as np
import pytest

import specdec
from specdec_eagle.checkpoint import load_eagle_checkpoint
from specdec_redrafter.checkpoint import load_redrafter_checkpoint

NAME, VOCAB, HIDDEN = "smollm2-135m", 49152, 576
PROMPT = [{"role": "user", "content": "Count from one to ten: one, two, three,"}]


def shipped(package: str = "specdec_eagle"):
    return resources.files(package) / "weights" / NAME


def test_shipped_checkpoint_loads_and_names_its_target():
    config, weights = load_eagle_checkpoint(shipped())
    assert (config.vocab_size, config.hidden_size) == (VOCAB, HIDDEN)
    assert config.target["name"] == NAME and len(config.target["fingerprint"]) == 64
    assert {name: tuple(w.shape) for name, w in weights.items()} == config.weight_shapes()
    for name, array in weights.items():
        assert np.isfinite(array).all() and np.abs(array).max() > 0, name
    ids = weights["vocab_shortlist"]
    assert (
        len(np.unique(ids)) == len(ids) == config.shortlist_size
        and 0 <= ids.min()
        and ids.max() < VOCAB
    )
    redrafter, _ = load_redrafter_checkpoint(shipped("specdec_redrafter"))
    assert config.target["fingerprint"] == redrafter.target["fingerprint"]


def test_shipped_checkpoint_drafts_for_the_real_model(shipped_model):
    pytest.importorskip("torch")
    target = specdec.load(shipped_model, backend="torch", dtype="float32")
    assert target.fingerprint == load_eagle_checkpoint(shipped())[0].target["fingerprint"]
    plain = specdec.generate(target, PROMPT, drafter="none", backend="torch", max_new_tokens=12)
    drafted = specdec.generate(target, PROMPT, drafter="eagle", backend="torch", max_new_tokens=12)
    assert drafted.tokens == plain.tokens and drafted.stats.accepted_tokens > 0, (
        drafted.tokens,
        plain.tokens,
    )
