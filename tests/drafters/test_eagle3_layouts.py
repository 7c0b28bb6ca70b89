"""EAGLE-3 in the engines' layouts (docs/scale-out.md): folders written here by hand from the
upstream names (SafeAILab/EAGLE ``eagle/traineagle3/cnets.py`` and SpecForge
``specforge/modeling/draft/llama3_eagle.py`` for the SpecForge layout; vLLM's speculators format,
``speculators/models/eagle3/config.py``, and vLLM's ``llama_eagle3.py`` loader, which renames
``midlayer.`` to ``layers.0.``, ``d2t`` to ``draft_id_to_target_id`` and drops ``t2d``) load as
drafters and decode losslessly; export then import is bit-identical; what a layout cannot hold is
refused."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import specdec
from specdec.errors import InvalidInputError
from specdec.plugins.export import detect_layout, export, import_drafter
from specdec.testing import make_random_model
from specdec_eagle3.checkpoint import load_eagle3_checkpoint, make_random_eagle3

V, H, LAYERS = 96, 32, 6
# name -> shape, as the upstream modules declare them (H = 32, 4 heads of 8, 2 KV heads, I = 64)
UPSTREAM = {
    "fc.weight": (H, 3 * H),
    "midlayer.hidden_norm.weight": (H,),
    "midlayer.input_layernorm.weight": (H,),
    "midlayer.post_attention_layernorm.weight": (H,),
    "midlayer.self_attn.q_proj.weight": (32, 2 * H),
    "midlayer.self_attn.k_proj.weight": (16, 2 * H),
    "midlayer.self_attn.v_proj.weight": (16, 2 * H),
    "midlayer.self_attn.o_proj.weight": (H, 32),
    "midlayer.mlp.gate_proj.weight": (64, H),
    "midlayer.mlp.up_proj.weight": (64, H),
    "midlayer.mlp.down_proj.weight": (H, 64),
    "norm.weight": (H,),
    "lm_head.weight": (40, H),
}


@pytest.fixture(scope="module")
def deep_model(tmp_path_factory):
    return make_random_model(
        tmp_path_factory.mktemp("deep") / "llama",
        vocab_size=V,
        hidden_size=H,
        num_layers=LAYERS,
        num_heads=4,
        num_kv_heads=2,
        intermediate_size=64,
        seed=1,
        with_tokenizer=True,
    )


def upstream_tensors(seed: int, prefix: str) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    tensors = {}
    for name, shape in UPSTREAM.items():
        scale = 1.0 if name.endswith("norm.weight") else 1.0 / np.sqrt(shape[-1])
        tensors[name.replace("midlayer.", prefix)] = (
            scale * (1 + 0.1 * rng.normal(size=shape))
            if len(shape) == 1
            else scale * rng.normal(size=shape)
        ).astype(np.float32)
    used = np.sort(rng.choice(V, size=40, replace=False))
    tensors["d2t"] = (used - np.arange(40)).astype(np.int64)
    t2d = np.zeros(V, dtype=bool)
    t2d[used] = True
    tensors["t2d"] = t2d
    return tensors


def llama_json() -> dict:
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": H,
        "intermediate_size": 64,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 8,
        "num_hidden_layers": 1,
        "rms_norm_eps": 1e-6,
        "rope_theta": 10000.0,
        "vocab_size": V,
        "max_position_embeddings": 2048,
        "tie_word_embeddings": False,
        "hidden_act": "silu",
    }


def write_folder(folder: Path, config: dict, tensors: dict) -> Path:
    from safetensors.numpy import save_file

    folder.mkdir(parents=True)
    save_file(tensors, str(folder / "model.safetensors"))
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def specforge_folder(tmp_path: Path, seed: int = 0) -> Path:
    config = {**llama_json(), "architectures": ["LlamaForCausalLMEagle3"], "draft_vocab_size": 40}
    return write_folder(tmp_path / "specforge", config, upstream_tensors(seed, "midlayer."))


def speculators_folder(tmp_path: Path, seed: int = 0, layer_ids=(1, 3, 6)) -> Path:
    config = {
        "architectures": ["Eagle3Speculator"],
        "speculators_model_type": "eagle3",
        "transformer_layer_config": llama_json(),
        "draft_vocab_size": 40,
        "norm_before_residual": True,
        "target_hidden_size": H,
        "eagle_aux_hidden_state_layer_ids": list(layer_ids),
        "speculators_config": {
            "algorithm": "eagle3",
            "default_proposal_method": "greedy",
            "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": 3}],
            "verifier": {"name_or_path": "llama", "architectures": ["LlamaForCausalLM"]},
        },
    }
    return write_folder(tmp_path / "speculators", config, upstream_tensors(seed, "layers.0."))


PROMPTS = [[1, 2, 3, 1, 2, 3, 1], [9, 10], [40, 41, 42, 43, 44]]


@pytest.mark.parametrize("layout", ["specforge", "speculators"])
def test_an_upstream_folder_loads_and_decodes_losslessly(tmp_path, deep_model, layout):
    folder = (specforge_folder if layout == "specforge" else speculators_folder)(tmp_path)
    assert detect_layout(folder) == ("eagle3", layout)
    config, weights = load_eagle3_checkpoint(folder)
    if layout == "specforge":  # no layer ids: the default three of the target, resolved on loading
        assert config.hidden_layers is None and not config.norm_before_residual
    else:  # vLLM's input-of-layer ids (1, 3, 6) are outputs of layers (0, 2, 5)
        assert config.hidden_layers == (0, 2, 5) and config.norm_before_residual
    np.testing.assert_array_equal(
        weights["lm_head.weight"], upstream_tensors(0, "x")["lm_head.weight"]
    )
    plain = specdec.generate(
        deep_model, PROMPTS, drafter="none", backend="numpy", max_new_tokens=12
    ).tokens
    for backend, dtype in (("numpy", None), ("torch", "float32")):
        if backend == "torch":
            pytest.importorskip("torch")
        got = specdec.generate(
            deep_model,
            PROMPTS,
            drafter=str(folder),
            backend=backend,
            dtype=dtype,
            max_new_tokens=12,
        )
        assert got.tokens == plain, f"{layout} on {backend}"


@pytest.mark.parametrize("layout", ["specforge", "speculators"])
def test_export_then_import_is_bit_identical(tmp_path, deep_model, layout):
    source = make_random_eagle3(
        tmp_path / "ours", deep_model, seed=5, draft_vocab_size=50, hidden_layers=(1, 2, 4)
    )
    config, weights = load_eagle3_checkpoint(source)
    result = export(str(source), layout, tmp_path / "out")
    assert detect_layout(result.path) == ("eagle3", layout)
    raw = json.loads((result.path / "config.json").read_text())
    if layout == "speculators":
        assert (
            raw["eagle_aux_hidden_state_layer_ids"] == [2, 3, 5]
            and raw["norm_before_residual"] is False
        )
    else:
        assert raw["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [1, 2, 4]
    back = import_drafter(result.path, tmp_path / "back")
    config2, weights2 = load_eagle3_checkpoint(back.path)
    assert config2 == config
    assert set(weights2) == set(weights)
    for name in weights:
        np.testing.assert_array_equal(weights2[name], weights[name], err_msg=name)
    from safetensors.numpy import load_file

    tensors = load_file(str(result.path / "model.safetensors"))
    assert tensors["t2d"].dtype == bool and int(tensors["t2d"].sum()) == 50
    assert ("layers.0.self_attn.q_proj.weight" in tensors) == (layout == "speculators")


def test_refusals_name_the_problem_and_the_fix(tmp_path, deep_model):
    normed = make_random_eagle3(tmp_path / "normed", deep_model, seed=1, norm_before_residual=True)
    with pytest.raises(InvalidInputError, match="--format speculators"):
        export(str(normed), "specforge", tmp_path / "x")
    config = {
        **llama_json(),
        "architectures": ["LlamaForCausalLMEagle3"],
        "draft_vocab_size": 40,
        "norm_output": True,
    }
    folder = write_folder(tmp_path / "v31", config, upstream_tensors(0, "midlayer."))
    with pytest.raises(InvalidInputError, match="EAGLE-3.1 head"):
        load_eagle3_checkpoint(folder)
    tensors = {
        **upstream_tensors(0, "midlayer."),
        "embed_tokens.weight": np.zeros((V, H), dtype=np.float32),
    }
    folder = write_folder(tmp_path / "own-embed", {**llama_json(), "draft_vocab_size": 40}, tensors)
    with pytest.raises(InvalidInputError, match="its own token embedding"):
        load_eagle3_checkpoint(folder)
    wide = speculators_folder(tmp_path / "deeper", layer_ids=(2, 4, 9))
    with pytest.raises(InvalidInputError, match="has 6 decoder layers"):
        specdec.generate(deep_model, PROMPTS, drafter=str(wide), backend="numpy", max_new_tokens=2)
