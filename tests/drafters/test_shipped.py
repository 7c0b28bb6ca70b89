"""The shipped checkpoints (``drafters/*/weights/smollm2-135m``, and ReDrafter's for
``qwen2.5-coder-1.5b``) load offline and name their target.

Loading and the config/weight checks need no download. The greedy steps run on the real
SmolLM2-135M when it is in the specdec cache (``specdec.models.bundled.cache_dir()``); they skip
without it, except under SPECDEC_TEST_SHIPPED=1 (``.ci/run``, which fetches it), where that fails
(the ``shipped_model`` fixture of tests/conftest.py).
"""

from __future__ import annotations

from importlib import resources

import numpy as np
import pytest

import specdec
from specdec_medusa.checkpoint import load_medusa_checkpoint
from specdec_redrafter.checkpoint import load_redrafter_checkpoint

NAME, VOCAB, HIDDEN = "smollm2-135m", 49152, 576
LOADERS = {
    "redrafter": ("specdec_redrafter", load_redrafter_checkpoint),
    "medusa": ("specdec_medusa", load_medusa_checkpoint),
}
PROMPT, NEW = [{"role": "user", "content": "Count from one to ten: one, two, three,"}], 8


def shipped(kind: str):
    package, loader = LOADERS[kind]
    folder = resources.files(package) / "weights" / NAME
    return folder, *loader(folder)


@pytest.mark.parametrize("kind", sorted(LOADERS))
def test_shipped_checkpoint_loads_and_names_its_target(kind):
    _, config, weights = shipped(kind)
    assert (config.vocab_size, config.hidden_size) == (VOCAB, HIDDEN)
    assert config.target["name"] == NAME and len(config.target["fingerprint"]) == 64
    assert (config.target["vocab_size"], config.target["hidden_size"]) == (VOCAB, HIDDEN)
    expected = dict(config.weight_shapes())
    assert {name: tuple(w.shape) for name, w in weights.items()} == expected
    for name, array in weights.items():
        assert np.isfinite(array).all() and np.abs(array).max() > 0, (
            f"{kind} {name}: non-finite or all zero"
        )


def test_shipped_checkpoints_share_one_target_and_the_shortlist_is_valid():
    _, redrafter, weights = shipped("redrafter")
    _, medusa, _ = shipped("medusa")
    assert redrafter.target["fingerprint"] == medusa.target["fingerprint"]
    ids = weights["vocab_shortlist"]
    assert ids.dtype.kind == "i" and len(ids) == redrafter.shortlist_size
    assert len(np.unique(ids)) == len(ids) and 0 <= ids.min() and ids.max() < VOCAB


@pytest.fixture(scope="module")
def real_target(shipped_model):
    pytest.importorskip("torch")
    target = specdec.load(shipped_model, backend="torch", dtype="float32", device="cpu")
    plain = specdec.generate(target, PROMPT, drafter="none", backend="torch", max_new_tokens=NEW)
    return target, plain.tokens


@pytest.mark.parametrize("kind", sorted(LOADERS))
def test_shipped_checkpoint_drafts_for_the_real_model(kind, real_target):
    """The fingerprint the checkpoint names is the cached model's; a few greedy steps equal plain
    decoding."""
    folder, config, _ = shipped(kind)
    target, plain = real_target
    assert target.fingerprint == config.target["fingerprint"]
    spec = specdec.generate(
        target, PROMPT, drafter=str(folder), backend="torch", max_new_tokens=NEW
    )
    assert spec.tokens == plain and spec.stats.accepted_tokens > 0, (spec.tokens, plain, spec.stats)


TIER, TIER_VOCAB, TIER_HIDDEN = "qwen2.5-coder-1.5b", 151936, 1536


def test_the_tier_redrafter_loads_and_names_its_target():
    """The bandwidth-bound tier's ReDrafter ships beside SmolLM2-135M's and is found by the target's
    name."""
    from types import SimpleNamespace

    from specdec.models.checkpoints import require_checkpoint

    folder = resources.files("specdec_redrafter") / "weights" / TIER
    assert (
        require_checkpoint(
            "redrafter", None, SimpleNamespace(name=TIER), package="specdec_redrafter"
        )
        == folder
    )
    config, weights = load_redrafter_checkpoint(folder)
    assert config.target["name"] == TIER and len(config.target["fingerprint"]) == 64
    assert (
        (config.vocab_size, config.hidden_size)
        == (TIER_VOCAB, TIER_HIDDEN)
        == (config.target["vocab_size"], config.target["hidden_size"])
    )
    assert {name: tuple(w.shape) for name, w in weights.items()} == dict(config.weight_shapes())
    ids = weights["vocab_shortlist"]
    assert (
        len(np.unique(ids)) == len(ids) == config.shortlist_size
        and 0 <= ids.min()
        and ids.max() < TIER_VOCAB
    )
    for name, array in weights.items():
        assert np.isfinite(array).all() and np.abs(array).max() > 0, (
            f"{name}: non-finite or all zero"
        )
