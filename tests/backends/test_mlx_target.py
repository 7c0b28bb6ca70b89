"""The mlx backend's target: plugin wiring, loading, and conformance with the float64 reference.

Tolerances: float32 against float64 on random models whose logits have standard deviation ~4,
``specdec.testing.checks.FLOAT32`` (rtol = atol = 2e-4) for logits and hidden states.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("mlx_lm", reason="mlx is not installed")  # required when SPECDEC_TEST_BACKENDS names mlx (conftest)

import mlx.core as mx  # noqa: E402

from specdec.errors import InvalidInputError, MissingDependencyError  # noqa: E402
from specdec.reference.model import load_target as load_reference  # noqa: E402
from specdec.testing import checks, make_random_model  # noqa: E402
from specdec.types import DraftTree, Verdict  # noqa: E402
from specdec_mlx.backend import MlxBackend  # noqa: E402


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """A tied llama with a tokenizer and an eos id, an untied qwen2 (biases on q, k, v)."""
    root = tmp_path_factory.mktemp("mlx_models")
    shape = dict(vocab_size=64, hidden_size=32, num_layers=2, num_heads=4, num_kv_heads=2)
    return {
        "llama": make_random_model(root / "llama", **shape, seed=1, eos_token_id=3, with_tokenizer=True),
        "qwen2": make_random_model(root / "qwen2", **shape, seed=2, architecture="qwen2", tie_word_embeddings=False),
    }


def test_plugin_import_loads_no_framework():
    code = ("import sys, specdec, specdec_mlx.plugin; from specdec.plugins import default_registry; "
            "assert 'mlx' in default_registry().names('backend'); "
            "print(sorted(m for m in ('mlx', 'mlx.core', 'mlx_lm') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]", f"import specdec_mlx.plugin loaded {out.strip()}"


def test_missing_mlx_names_the_extra():
    code = ("import sys; sys.modules['mlx'] = None; sys.modules['mlx.core'] = None\n"
            "from specdec.plugins import default_registry\n"
            "from specdec.errors import MissingDependencyError\n"
            "try:\n    default_registry().get('backend', 'mlx').factory()\n"
            "except MissingDependencyError as exc:\n    print(exc)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert "pip install 'specdec[mlx]'" in out, f"mlx backend factory without mlx said: {out!r}"
    assert issubclass(MissingDependencyError, ImportError)


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_prefill_tree_forward_and_commit_match_reference(models, arch):
    """Ragged prompts (one longer than a prefill chunk), three trees, random accepted paths."""
    checks.check_target("mlx", models[arch], dtype="float32",
                        prompts=((1, 2, 3), (4,), tuple(range(5, 64)) * 3), steps=3, width=3, length=4)
    checks.check_target("mlx", models[arch], dtype="float32", prompts=((9, 8, 7),), steps=2, width=1, length=3)


def test_cache_growth_keeps_the_committed_entries(models, monkeypatch):
    """A 189-token prompt fills the first 256 slots; 24 chain steps grow the cache past them."""
    from specdec_mlx import kvcache

    grown = []
    reserve = kvcache.MlxKVCache.reserve

    def spy(cache, slots):
        before = cache.capacity
        reserve(cache, slots)
        grown.append(cache.capacity > before)

    monkeypatch.setattr(kvcache.MlxKVCache, "reserve", spy)
    checks.check_target("mlx", models["llama"], dtype="float32", prompts=(tuple(range(1, 64)) * 3, (5,)),
                        steps=24, width=1, length=8)
    assert any(grown), "test precondition: the cache must have grown during the check"


@pytest.mark.parametrize("change", [
    dict(model_type="mistral", architectures=["MistralForCausalLM"], sliding_window=3),
    dict(rope_theta=500000.0, rope_scaling=dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0,
                                                high_freq_factor=4.0, original_max_position_embeddings=16)),
], ids=["mistral-sliding-window", "llama3-rope-scaling"])
def test_config_variants_match_reference(tmp_path, change):
    folder = make_random_model(tmp_path / "m", vocab_size=64, hidden_size=32, num_layers=2, num_heads=4,
                               num_kv_heads=2, seed=4)
    config = json.loads((folder / "config.json").read_text())
    config.update(change)
    (folder / "config.json").write_text(json.dumps(config))
    checks.check_target("mlx", folder, dtype="float32", prompts=(tuple(range(1, 40)), (7,), (8, 9, 10)), steps=4)


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_attributes_match_reference(models, arch):
    reference = load_reference(models[arch])
    target = MlxBackend().load_target(models[arch])
    where = f"MlxTarget attributes ({arch})"
    assert (target.vocab_size, target.hidden_size) == (reference.vocab_size, reference.hidden_size), where
    assert target.eos_token_ids == reference.eos_token_ids, where
    assert target.name == reference.name == Path(models[arch]).name, where
    assert target.fingerprint == reference.fingerprint, f"{where}: fingerprint differs from the reference's"
    assert (target.tokenizer is None) == (reference.tokenizer is None), where
    for name in ("embed_tokens", "lm_head"):
        np.testing.assert_array_equal(np.array(getattr(target, name)), getattr(reference, name).astype(np.float32),
                                      err_msg=f"{where}: {name}")
    assert target.dtype == mx.float32, where


def test_model_object_and_pair_load_like_the_folder(models):
    from mlx_lm.utils import load_model

    folder = models["qwen2"]
    model, _ = load_model(Path(folder))
    backend = MlxBackend()
    from_folder = backend.load_target(folder)
    for source in (model, (model, None)):
        target = backend.load_target(source)
        assert target.fingerprint == from_folder.fingerprint, "fingerprint of an mlx-lm model object"
        prompts = [[1, 2, 3], [4]]
        np.testing.assert_array_equal(backend.to_numpy(target.prefill(prompts).logits),
                                      backend.to_numpy(from_folder.prefill(prompts).logits),
                                      err_msg=f"prefill logits of {type(source).__name__} vs folder")
    assert backend.load_target(from_folder) is from_folder, "an MlxTarget passes through load_target"


def test_errors_name_the_problem(models):
    backend = MlxBackend()
    with pytest.raises(InvalidInputError, match="float64 is the numpy backend's"):
        backend.load_target(models["llama"], dtype="float64")
    with pytest.raises(InvalidInputError, match="runs on"):
        backend.load_target(models["llama"], device="tpu")
    target = backend.load_target(models["llama"])
    tree = DraftTree(tokens=mx.zeros((1, 1), dtype=mx.int32), parents=mx.full((1, 1), -1), depth=mx.zeros((1, 1)),
                     ancestor_mask=mx.ones((1, 1, 1), dtype=mx.bool_), num_nodes=mx.ones((1,)))
    with pytest.raises(InvalidInputError, match="call prefill"):
        target.forward_tree(tree)
    target.prefill([[1, 2]])
    verdict = Verdict(path=mx.zeros((1, 1)), num_accepted=mx.zeros((1,)), bonus_tokens=mx.zeros((1,)))
    with pytest.raises(InvalidInputError, match="needs a preceding forward_tree"):
        target.commit(tree, verdict)
    with pytest.raises(InvalidInputError, match=r"outside \[0, 64\)"):
        target.prefill([[1, 64]])


def test_bfloat16_runs_and_agrees_where_the_margin_is_wide(models):
    """bf16 keeps ~3 significant digits: compare argmaxes only where float32's top two logits
    differ by more than 0.5 (several times bf16's error on logits of size ~10)."""
    backend = MlxBackend()
    prompts = [[1, 2, 3, 4], [5, 6]]
    exact = backend.to_numpy(backend.load_target(models["llama"]).prefill(prompts).logits)[:, 0]
    low = backend.load_target(models["llama"], dtype="bfloat16")
    assert low.dtype == mx.bfloat16 and low.embed_tokens.dtype == mx.bfloat16
    rough = backend.to_numpy(low.prefill(prompts).logits)[:, 0]
    top2 = np.sort(exact, axis=-1)[:, -2:]
    wide = top2[:, 1] - top2[:, 0] > 0.5
    assert wide.any(), "test precondition: some row has a wide top-2 margin"
    assert np.all(np.isfinite(rough)), "bfloat16 prefill logits must be finite"
    np.testing.assert_array_equal(np.argmax(rough, -1)[wide], np.argmax(exact, -1)[wide],
                                  err_msg="bfloat16 vs float32 argmax where the margin is wide")


def test_quantized_mlx_lm_model_decodes_like_mlx_lm(models):
    """Quantized layers are reused as modules: greedy tokens equal mlx-lm's on the same model."""
    import mlx.nn as nn
    from mlx_lm.generate import generate_step
    from mlx_lm.utils import load_model

    import specdec

    model, _ = load_model(Path(models["qwen2"]))
    nn.quantize(model, group_size=32, bits=8)
    prompt = [1, 2, 3, 4]
    steps = list(generate_step(mx.array(prompt), model, max_tokens=8, sampler=lambda x: mx.argmax(x, axis=-1)))
    for _, log_probs in steps:
        top2 = np.sort(np.array(log_probs).ravel())[-2:]
        assert top2[1] - top2[0] > 1e-3, "test precondition: no near-tie in mlx-lm's greedy choice"
    target = MlxBackend().load_target((model, None))
    assert target.embed_tokens.shape == (64, 32), "embed_tokens of a quantized model is dequantized (V, H)"
    tokens = specdec.generate(target, prompt, drafter="none", backend="mlx", max_new_tokens=8, stop_at_eos=False).tokens
    assert tokens == [int(t) for t, _ in steps], f"quantized qwen2: mlx backend {tokens} vs mlx-lm"
