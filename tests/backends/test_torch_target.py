"""The torch target against the float64 reference and against transformers' own modules.

Runs when torch is importable, and must run (import failure stops the run, see tests/conftest.py) when
SPECDEC_TEST_BACKENDS names "torch". SPECDEC_TORCH_DEVICE picks the device (default cpu).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

torch = pytest.importorskip("torch")  # required when SPECDEC_TEST_BACKENDS names torch (conftest)

from specdec.errors import InvalidInputError
from specdec.reference.model import load_target
from specdec.reference.tree import build_prefix_tree
from specdec.testing import checks, make_random_model
from specdec.testing.strategies import model_shapes
from specdec.types import Verdict
from specdec_torch.backend import TorchBackend

DEVICE = os.environ.get("SPECDEC_TORCH_DEVICE", "cpu")
PROMPTS = ((1, 2, 3), (4,), (5, 6, 7, 8, 9))


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("torch_target")
    shape = dict(vocab_size=64, hidden_size=32, num_layers=2, num_heads=4, num_kv_heads=2)
    return {
        "llama": make_random_model(root / "llama", seed=0, **shape),
        "qwen2": make_random_model(root / "qwen2", seed=1, architecture="qwen2", **shape),
        "untied": make_random_model(root / "untied", seed=2, tie_word_embeddings=False, with_tokenizer=True,
                                    eos_token_id=7, **shape),
    }


def _edit_config(folder, **changes):
    path = folder / "config.json"
    config = json.loads(path.read_text())
    config.update(changes)
    path.write_text(json.dumps(config))
    return folder


@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("kind", ["llama", "qwen2", "untied"])
def test_prefill_tree_forward_and_commit_match_reference(models, kind, dtype):
    """Prefill and tree logits/hidden within 1e-9 (float64) or 2e-4 (float32) of the reference,
    over several tree steps with random accepted paths (so commit is checked by the next step)."""
    checks.check_target("torch", models[kind], dtype=dtype, device=DEVICE, prompts=PROMPTS, steps=4, width=3, length=4)


@settings(max_examples=6)
@given(shape=model_shapes(), seed=st.integers(0, 1000), width=st.integers(1, 4), length=st.integers(1, 5))
def test_random_architectures_match_reference_float64(tmp_path_factory, shape, seed, width, length):
    folder = make_random_model(tmp_path_factory.mktemp("arch") / "m", seed=seed, **shape)
    checks.check_target("torch", folder, dtype="float64", device=DEVICE, steps=3, width=width, length=length, seed=seed)


def test_llama3_rope_scaling_matches_reference_and_transformers(tmp_path):
    """llama3 rotary scaling: the whole model against the reference, the rotary angles against
    transformers' own rotary module."""
    folder = make_random_model(tmp_path / "m", vocab_size=48, hidden_size=32, num_layers=1, num_heads=2,
                               num_kv_heads=1, seed=3)
    _edit_config(folder, rope_theta=500000.0, rope_scaling=dict(
        rope_type="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0, original_max_position_embeddings=16))
    checks.check_target("torch", folder, dtype="float64", device=DEVICE, prompts=[list(range(40))], steps=2)
    _check_rotary_against_transformers(folder)


def test_default_rope_matches_transformers_rotary_module(models):
    _check_rotary_against_transformers(models["qwen2"])


def _check_rotary_against_transformers(folder):
    from transformers import AutoModelForCausalLM

    from specdec.reference.loading import LlamaConfig
    from specdec_torch.layers import inverse_frequencies, rotary_cos_sin

    model = AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32)
    positions = torch.arange(0, 600, 7)[None]  # (1, n)
    hf_cos, hf_sin = model.model.rotary_emb(torch.zeros(1, dtype=torch.float32), positions)
    config = LlamaConfig.from_folder(folder)
    cos, sin = rotary_cos_sin(positions, inverse_frequencies(config, torch.device("cpu")), torch.float32)
    # transformers computes the angles in float32: allow its rounding (position * 6e-8 radians).
    assert torch.allclose(cos[:, 0], hf_cos, atol=1e-4), f"rotary cos differs from transformers for {folder.name}"
    assert torch.allclose(sin[:, 0], hf_sin, atol=1e-4), f"rotary sin differs from transformers for {folder.name}"


def test_mistral_sliding_window_matches_reference(tmp_path):
    folder = make_random_model(tmp_path / "m", vocab_size=48, hidden_size=32, num_layers=2, num_heads=4,
                               num_kv_heads=2, seed=4)
    _edit_config(folder, model_type="mistral", architectures=["MistralForCausalLM"], sliding_window=5)
    checks.check_target("torch", folder, dtype="float64", device=DEVICE, prompts=[list(range(9)), [3, 4]],
                        steps=4, width=2, length=4)


def test_prefill_in_chunks_and_cache_growth_match_reference(models, monkeypatch):
    """Prompts longer than a prefill chunk, and enough tree steps to outgrow the first allocation."""
    import specdec_torch.model as torch_model

    monkeypatch.setattr(torch_model, "PREFILL_CHUNK", 7)
    prompts = [[t % 64 for t in range(230)], [5, 6]]
    checks.check_target("torch", models["llama"], dtype="float64", device=DEVICE, prompts=prompts, steps=12,
                        width=4, length=5)


def test_target_attributes_and_fingerprint_match_reference(models):
    folder = models["untied"]
    reference = load_target(folder)
    target = TorchBackend().load_target(folder, dtype="bfloat16", device=DEVICE)
    assert target.fingerprint == reference.fingerprint, "TorchTarget.fingerprint differs from the reference's"
    assert (target.vocab_size, target.hidden_size) == (reference.vocab_size, reference.hidden_size)
    assert target.eos_token_ids == reference.eos_token_ids == (7,)
    assert target.name == reference.name == "untied"
    assert target.tokenizer is not None and target.tokenizer.encode("x").ids is not None
    assert target.embed_tokens.shape == target.lm_head.shape == (64, 32)
    assert target.dtype == torch.bfloat16 and target.embed_tokens.dtype == torch.bfloat16


def test_model_object_source_gives_same_outputs_and_fingerprint(models):
    from transformers import AutoModelForCausalLM

    folder = models["llama"]
    model = AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float64)
    from_object = TorchBackend().load_target(model)
    from_folder = TorchBackend().load_target(folder, dtype="float64", device="cpu")
    assert from_object.fingerprint == from_folder.fingerprint == load_target(folder).fingerprint
    a, b = from_object.prefill([[1, 2, 3]]), from_folder.prefill([[1, 2, 3]])
    assert torch.equal(a.logits, b.logits), "a model object and its folder give different prefill logits"


def test_errors_name_the_problem(models):
    backend = TorchBackend()
    target = backend.load_target(models["llama"], dtype="float32", device=DEVICE)
    tree = checks.to_backend_tree(build_prefix_tree(np.array([[[1, 2]]])), backend, target)
    with pytest.raises(InvalidInputError, match="call prefill"):
        target.forward_tree(tree)
    target.prefill([[1, 2]])
    verdict = Verdict(path=backend.from_numpy(np.array([[0, 1]]), target),
                      num_accepted=backend.from_numpy(np.array([1]), target),
                      bonus_tokens=backend.from_numpy(np.array([3]), target))
    with pytest.raises(InvalidInputError, match="no tree is staged"):
        target.commit(tree, verdict)
    with pytest.raises(InvalidInputError, match="outside"):
        target.prefill([[1, 64]])
    with pytest.raises(InvalidInputError, match="unknown dtype"):
        backend.load_target(models["llama"], dtype="int8")
    with pytest.raises(InvalidInputError, match="Llama-family"):
        backend.load_target(torch.nn.Linear(2, 2))


def test_backend_moves_arrays_both_ways(models):
    backend = TorchBackend()
    target = backend.load_target(models["llama"], dtype="bfloat16", device=DEVICE)
    array = np.arange(6, dtype=np.int64).reshape(2, 3)
    tensor = backend.from_numpy(array, target)
    assert tensor.device.type == torch.device(DEVICE).type and tensor.dtype == torch.int64
    assert np.array_equal(backend.to_numpy(tensor), array)
    half = torch.tensor([1.5, -2.25], dtype=torch.bfloat16)
    assert backend.to_numpy(half).dtype == np.float32 and backend.to_numpy(half).tolist() == [1.5, -2.25]


def test_plugin_module_does_not_import_torch():
    code = "import sys, specdec_torch.plugin, specdec; specdec.default_registry(); print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False", f"importing specdec_torch.plugin loaded torch: {out.stdout} {out.stderr}"


def test_missing_torch_names_the_extra():
    code = (
        "import sys; sys.modules['torch'] = None\n"
        "import specdec\n"
        "try:\n    specdec.load('x', backend='torch')\n"
        "except specdec.MissingDependencyError as exc:\n    print(exc)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert "pip install 'specdec[torch]'" in out.stdout, f"no install hint: {out.stdout} {out.stderr}"
