"""EAGLE-3 in the engines' layouts (docs/scale-out.md): folders written here by hand from the
upstream names (SafeAILab/EAGLE ``eagle/traineagle3/cnets.py`` and SpecForge
``specforge/modeling/draft/llama3_eagle.py`` for the SpecForge layout; vLLM's speculators format,
``speculators/models/eagle3/config.py``, and vLLM's ``llama_eagle3.py`` loader, which renames
``midlayer.`` to ``layers.0.``, ``d2t`` to ``draft_id_to_target_id`` and drops ``t2d``) load as
drafters and decode losslessly; export then import is bit-identical; what a layout cannot hold is
refused."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import attrs
import numpy as np
import pytest

import specdec
from specdec.errors import InvalidInputError, SpecdecError
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
    wide = speculators_folder(tmp_path / "deeper", layer_ids=(2, 4, 9))
    with pytest.raises(InvalidInputError, match="has 6 decoder layers"):
        specdec.generate(deep_model, PROMPTS, drafter=str(wide), backend="numpy", max_new_tokens=2)


# ---------------------------------------------------------------------------------------------
# The optional tensors of the published layouts: the head's own token embedding and input_norm.
# vLLM speculators' Eagle3DraftModel (src/speculators/models/eagle3/core.py) leaves only
# verifier_norm.weight and verifier_lm_head.weight out on save, so embed_tokens.weight is saved
# (trained when embed_requires_grad), and with norm_before_fc it holds input_norm, an RMSNorm of
# 3H over the fused layers before fc; vLLM's llama_eagle3.py loads a draft's embed_tokens when
# the file has one (includes_embed_tokens) and shares the target's otherwise; SpecForge's
# LlamaForCausalLMEagle3 (specforge/modeling/draft/llama3_eagle.py) has embed_tokens too.


def target_embedding(model) -> np.ndarray:
    from specdec.reference.model import load_target

    return np.asarray(load_target(model).embed_tokens)


def head_with_own_tensors(tmp_path: Path, layout: str, *, embedding, input_norm: bool) -> Path:
    """The hand-written upstream folder of ``layout`` with ``embed_tokens.weight`` (when
    ``embedding`` is given) and ``input_norm.weight`` + ``norm_before_fc`` (when ``input_norm``)."""
    folder = (specforge_folder if layout == "specforge" else speculators_folder)(tmp_path)
    from safetensors.numpy import load_file, save_file

    tensors = load_file(str(folder / "model.safetensors"))
    if embedding is not None:
        tensors["embed_tokens.weight"] = np.asarray(embedding, dtype=np.float32)
    config = json.loads((folder / "config.json").read_text())
    if input_norm:
        rng = np.random.default_rng(11)
        tensors["input_norm.weight"] = (1 + 0.2 * rng.normal(size=3 * H)).astype(np.float32)
        config["norm_before_fc"] = True
    save_file(tensors, str(folder / "model.safetensors"))
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def own_embedding(seed: int = 7) -> np.ndarray:
    return np.random.default_rng(seed).normal(size=(V, H)).astype(np.float32)


def draft_beams(config, weights, embed) -> np.ndarray:
    """The reference drafter's beams for two prompts, their fused layers drawn from a fixed seed."""
    from specdec.types import DraftContext, PromptOutput
    from specdec_eagle3.config import resolve_layers
    from specdec_eagle3.reference import Eagle3Drafter

    config = resolve_layers(config, LAYERS)
    drafter = Eagle3Drafter(config, weights, embed_tokens=embed, top_k=3, depth=3, total_tokens=8)
    rng = np.random.default_rng(4)
    for slot, prompt in enumerate(PROMPTS[:2]):
        layers = {i: rng.normal(size=(len(prompt), H)) for i in config.hidden_layers}
        output = PromptOutput(logits=np.zeros(V), hidden=np.zeros((len(prompt), H)), layers=layers)
        drafter.begin(slot, prompt, output)
    context = DraftContext(
        root_tokens=np.array([5, 17]), hidden=np.zeros((2, H)), slots=np.arange(2)
    )
    return drafter.propose(context).beams


@pytest.mark.parametrize("layout", ["specforge", "speculators"])
def test_a_head_with_its_own_embedding_drafts_with_it_and_decodes_losslessly(
    tmp_path, deep_model, layout
):
    """A head whose embed_tokens.weight differs from the target's loads (no longer refused),
    drafts with that table (its beams are the reference's with the head's table as the
    embedding, not the target's), and every backend's output is plain decoding's."""
    table = own_embedding()
    folder = head_with_own_tensors(tmp_path, layout, embedding=table, input_norm=False)
    config, weights = load_eagle3_checkpoint(folder)
    assert config.own_embedding and not config.norm_before_fc
    np.testing.assert_array_equal(weights["embed_tokens.weight"], table)
    target_table = target_embedding(deep_model)
    assert not np.allclose(table, target_table)
    without = {k: v for k, v in weights.items() if k != "embed_tokens.weight"}
    plain_config = attrs.evolve(config, own_embedding=False)
    own = draft_beams(config, weights, target_table)
    np.testing.assert_array_equal(own, draft_beams(plain_config, without, table))
    assert not np.array_equal(own, draft_beams(plain_config, without, target_table))
    plain = specdec.generate(
        deep_model, PROMPTS, drafter="none", backend="numpy", max_new_tokens=12
    ).tokens
    for backend, dtype in (("numpy", None), ("torch", "float32"), ("mlx", "float32")):
        if backend == "torch":
            pytest.importorskip("torch")
        if backend == "mlx" and importlib.util.find_spec("mlx_lm") is None:
            pytest.skip("mlx is not installed")  # found, not imported: the backend loads it
        got = specdec.generate(
            deep_model,
            PROMPTS,
            drafter=str(folder),
            backend=backend,
            dtype=dtype,
            max_new_tokens=12,
        )
        assert got.tokens == plain, f"{layout} on {backend}"


def test_a_head_carrying_the_targets_own_embedding_drafts_as_without_it(tmp_path, deep_model):
    """The same head with a copy of the target's embedding saved in it drafts the same trees as
    without it."""
    folder = head_with_own_tensors(
        tmp_path, "speculators", embedding=target_embedding(deep_model), input_norm=False
    )
    config, weights = load_eagle3_checkpoint(folder)
    without = {k: v for k, v in weights.items() if k != "embed_tokens.weight"}
    np.testing.assert_array_equal(
        draft_beams(config, weights, np.zeros((V, H))),
        draft_beams(
            attrs.evolve(config, own_embedding=False), without, target_embedding(deep_model)
        ),
    )


@pytest.mark.parametrize("layout", ["specforge", "speculators"])
def test_input_norm_of_norm_before_fc_is_applied_and_decodes_losslessly(
    tmp_path, deep_model, layout
):
    """norm_before_fc with input_norm.weight (3H,): the fused layers pass one RMSNorm before fc
    (the reference's features), and decoding stays plain decoding."""
    from specdec_eagle3.config import resolve_layers
    from specdec_eagle3.reference import features

    folder = head_with_own_tensors(tmp_path, layout, embedding=own_embedding(), input_norm=True)
    config, weights = load_eagle3_checkpoint(folder)
    assert config.norm_before_fc and config.own_embedding
    config = resolve_layers(config, LAYERS)
    rng = np.random.default_rng(3)
    layers = {i: rng.normal(size=(2, H)) for i in config.hidden_layers}
    fused = np.concatenate([layers[i] for i in config.hidden_layers], axis=-1)
    normed = fused / np.sqrt(np.mean(fused**2, axis=-1, keepdims=True) + config.rms_norm_eps)
    expected = (normed * weights["input_norm.weight"]) @ weights["fc.weight"].T
    np.testing.assert_allclose(features(config, weights, layers), expected, rtol=1e-12)
    plain = specdec.generate(
        deep_model, PROMPTS, drafter="none", backend="numpy", max_new_tokens=10
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
            max_new_tokens=10,
        )
        assert got.tokens == plain, f"{layout} on {backend}"


@pytest.mark.parametrize("layout", ["specforge", "speculators"])
def test_a_head_with_its_optional_tensors_exports_and_imports_bit_identically(
    tmp_path, deep_model, layout
):
    source = make_random_eagle3(
        tmp_path / "ours",
        deep_model,
        seed=5,
        hidden_layers=(1, 2, 4),
        own_embedding=True,
        norm_before_fc=True,
    )
    config, weights = load_eagle3_checkpoint(source)
    result = export(str(source), layout, tmp_path / "out")
    from safetensors.numpy import load_file

    tensors = load_file(str(result.path / "model.safetensors"))
    assert tensors["embed_tokens.weight"].shape == (V, H)
    assert tensors["input_norm.weight"].shape == (3 * H,)
    assert json.loads((result.path / "config.json").read_text())["norm_before_fc"] is True
    back = import_drafter(result.path, tmp_path / "back")
    config2, weights2 = load_eagle3_checkpoint(back.path)
    assert config2 == config
    assert set(weights2) == set(weights)
    for name in weights:
        np.testing.assert_array_equal(weights2[name], weights[name], err_msg=name)
    pytest.importorskip("gguf")
    with pytest.raises(InvalidInputError, match="embed_tokens.weight.*--format speculators"):
        export(str(source), "gguf", tmp_path / "gguf", model=deep_model)


def test_key_mismatches_name_the_files_own_keys(tmp_path, deep_model):
    """A speculators file whose tensors do not match its config.json is refused naming its own
    keys (layers.0.*), not specdec's internal midlayer.* names, and without advice to run
    `specdec import` (the command that was reading it, or a drafter= folder)."""
    folder = speculators_folder(tmp_path)
    from safetensors.numpy import load_file, save_file

    tensors = load_file(str(folder / "model.safetensors"))
    del tensors["layers.0.mlp.up_proj.weight"]
    tensors["layers.0.self_attn.q_proj.weight"] = np.zeros((24, 2 * H), dtype=np.float32)
    tensors["layers.0.extra.weight"] = np.zeros(H, dtype=np.float32)
    save_file(tensors, str(folder / "model.safetensors"))
    attempts = [
        lambda: load_eagle3_checkpoint(folder),
        lambda: import_drafter(folder, tmp_path / "imported"),
        lambda: specdec.generate(
            deep_model, PROMPTS, drafter=str(folder), backend="numpy", max_new_tokens=2
        ),
    ]
    for attempt in attempts:
        with pytest.raises(SpecdecError) as raised:
            attempt()
        message = str(raised.value)
        assert "layers.0.mlp.up_proj.weight" in message, message
        assert "layers.0.self_attn.q_proj.weight: (24, 64) != (32, 64)" in message, message
        assert "layers.0.extra.weight" in message, message
        assert "midlayer" not in message and "specdec import" not in message, message


def test_a_bad_d2t_or_config_value_is_named_without_advice_to_import(tmp_path):
    from safetensors.numpy import load_file, save_file

    folder = speculators_folder(tmp_path)
    tensors = load_file(str(folder / "model.safetensors"))
    tensors["d2t"] = np.full(40, 200, dtype=np.int64)  # ids past the target's vocabulary
    save_file(tensors, str(folder / "model.safetensors"))
    for attempt in (
        lambda: load_eagle3_checkpoint(folder),
        lambda: import_drafter(folder, tmp_path / "imported"),
    ):
        with pytest.raises(SpecdecError, match="d2t must map draft ids") as raised:
            attempt()
        assert "specdec import" not in str(raised.value), raised.value
    config = json.loads((folder / "config.json").read_text())
    config["transformer_layer_config"]["num_key_value_heads"] = 3
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(SpecdecError, match="multiple of num_kv_heads") as raised:
        import_drafter(folder, tmp_path / "imported2")
    assert "specdec import" not in str(raised.value), raised.value


def test_an_input_norm_the_config_does_not_turn_on_is_named_with_the_fix(tmp_path):
    folder = head_with_own_tensors(tmp_path, "speculators", embedding=None, input_norm=True)
    config = json.loads((folder / "config.json").read_text())
    del config["norm_before_fc"]
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(InvalidInputError, match='input_norm.weight.*"norm_before_fc": true'):
        load_eagle3_checkpoint(folder)


def test_the_speculators_export_names_the_verifier_as_vllm_resolves_it(tmp_path):
    """verifier.name_or_path: the bundled model's public hub id for a head trained on it; the
    model= folder's own hub id (_name_or_path) or, failing that, its path; without either, the
    recorded name with a note saying to pass the target."""
    named = make_random_model(
        tmp_path / "smollm2-135m",
        vocab_size=V,
        hidden_size=H,
        num_layers=LAYERS,
        num_heads=4,
        num_kv_heads=2,
        intermediate_size=64,
        seed=2,
    )
    head = make_random_eagle3(tmp_path / "head", named, seed=1, hidden_layers=(1, 2, 4))

    def verifier(out: str, **options):
        result = export(str(head), "speculators", tmp_path / out, **options)
        raw = json.loads((result.path / "config.json").read_text())
        return raw["speculators_config"]["verifier"]["name_or_path"], result.notes

    name, _ = verifier("bundled")
    assert name == "HuggingFaceTB/SmolLM2-135M-Instruct"
    other = make_random_model(
        tmp_path / "local-llama",
        vocab_size=V,
        hidden_size=H,
        num_layers=LAYERS,
        num_heads=4,
        num_kv_heads=2,
        intermediate_size=64,
        seed=2,
    )
    assert verifier("folder", model=str(other))[0] == str(other.resolve())
    config = json.loads((other / "config.json").read_text())
    (other / "config.json").write_text(json.dumps({**config, "_name_or_path": "org/Llama-Tiny"}))
    assert verifier("hub", model=str(other))[0] == "org/Llama-Tiny"
    unnamed = make_random_eagle3(tmp_path / "head2", other, seed=1, hidden_layers=(1, 2, 4))
    result = export(str(unnamed), "speculators", tmp_path / "unnamed")
    raw = json.loads((result.path / "config.json").read_text())
    assert raw["speculators_config"]["verifier"]["name_or_path"] == "local-llama"
    assert any("--model" in note for note in result.notes), result.notes


# ---------------------------------------------------------------------------------------------
# What a hand-written or partly saved head may lack.


def rewrite_config(folder: Path, change) -> None:
    config = json.loads((folder / "config.json").read_text())
    change(config)
    (folder / "config.json").write_text(json.dumps(config))


def test_a_speculators_head_without_its_model_type_key_is_read_by_its_architecture(tmp_path):
    folder = speculators_folder(tmp_path)
    rewrite_config(folder, lambda config: config.pop("speculators_model_type"))
    assert detect_layout(folder) == ("eagle3", "speculators")
    config, weights = load_eagle3_checkpoint(folder)
    assert config.hidden_layers == (0, 2, 5)
    np.testing.assert_array_equal(weights["d2t"], upstream_tensors(0, "x")["d2t"])


def test_layer_ids_out_of_range_are_named_by_the_files_own_key_and_convention(tmp_path):
    folder = speculators_folder(tmp_path, layer_ids=(0, 3, 6))  # SGLang's ids in vLLM's key
    with pytest.raises(SpecdecError) as raised:
        load_eagle3_checkpoint(folder)
    message = str(raised.value)
    assert "eagle_aux_hidden_state_layer_ids [0, 3, 6]" in message, message
    assert "input-of-layer" in message and "hidden_layers" not in message, message


def test_a_head_without_d2t_reads_its_draft_vocabulary_from_t2d(tmp_path):
    from safetensors.numpy import load_file, save_file

    folder = speculators_folder(tmp_path)
    tensors = load_file(str(folder / "model.safetensors"))
    expected = tensors.pop("d2t")
    save_file(tensors, str(folder / "model.safetensors"))
    config, weights = load_eagle3_checkpoint(folder)
    np.testing.assert_array_equal(weights["d2t"], expected)
    del tensors["t2d"]  # neither: which 40 of the 96 target tokens are drafted is unknown
    save_file(tensors, str(folder / "model.safetensors"))
    with pytest.raises(SpecdecError, match="neither d2t nor t2d"):
        load_eagle3_checkpoint(folder)


def test_export_commands_name_the_target_where_it_is_known(tmp_path, deep_model):
    head = make_random_eagle3(tmp_path / "head", deep_model, seed=3, hidden_layers=(1, 2, 4))
    for layout in ("speculators", "specforge"):
        named = export(str(head), layout, tmp_path / f"{layout}-named", model=str(deep_model))
        assert str(deep_model.resolve()) in named.commands[0], named.commands
        unnamed = export(str(head), layout, tmp_path / f"{layout}-unnamed")
        assert "TARGET_HF_FOLDER" in unnamed.commands[0], unnamed.commands
        assert any("TARGET_HF_FOLDER in the command" in note for note in unnamed.notes)


def test_a_speculators_head_drafts_as_deep_as_its_speculative_tokens(tmp_path):
    """A hand-written speculators head (no specdec block) drafted at depth 4, specdec's default,
    while its config said speculative_tokens 3 (what vLLM's chain drafts, and what the
    speculators export writes): its acceptance differed from the same head exported."""
    from specdec_eagle3.export_read import read_speculators

    folder = speculators_folder(tmp_path)
    config, _, notes = read_speculators(folder)
    assert config.depth == 3
    assert any("depth 3: speculators_config's speculative_tokens" in n for n in notes), notes
    rewrite_config(
        folder, lambda c: c["speculators_config"]["proposal_methods"][0].pop("speculative_tokens")
    )
    assert read_speculators(folder)[0].depth == 4  # the default where it says none


def test_a_head_whose_layer_constants_differ_from_the_targets_is_named():
    """A hand-written head that left rope_theta and rms_norm_eps out of its config.json read
    transformers' defaults (10000, 1e-6) against SmolLM2's 100000 and 1e-5, with no word."""
    from specdec.models.llama import LlamaConfig
    from specdec_eagle3.config import Eagle3Config
    from specdec_eagle3.plugin import layer_constant_notes

    shape = dict(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=4)
    shape.update(num_attention_heads=4, num_key_value_heads=2, model_type="llama", head_dim=8)
    target = LlamaConfig(**shape, rope_theta=100000.0, rms_norm_eps=1e-5)
    head = Eagle3Config(
        vocab_size=64, hidden_size=32, draft_vocab_size=64, hidden_layers=(0, 1, 2),
        num_heads=4, num_kv_heads=2, head_dim=8, intermediate_size=48,
    )  # fmt: skip
    notes = layer_constant_notes(head, target)
    assert notes == [
        "specdec: the EAGLE-3 head's rope_theta is 10000 and the target's 100000 (a config.json "
        "without rope_theta reads 10000, transformers' default): give the value the head was "
        "trained with in its config.json",
        "specdec: the EAGLE-3 head's rms_norm_eps is 1e-06 and the target's 1e-05 (a config.json "
        "without rms_norm_eps reads 1e-06, transformers' default): give the value the head was "
        "trained with in its config.json",
    ]
    same = attrs.evolve(head, rope_theta=100000.0, rms_norm_eps=1e-5)
    assert layer_constant_notes(same, target) == []
    # a head's optional parts, said where drafter= loads it (only `specdec import` said them)
    from specdec_eagle3.plugin import part_notes

    assert part_notes(head) == []
    assert part_notes(attrs.evolve(head, own_embedding=True)) == [
        "specdec: the EAGLE-3 head drafts with its own token embedding (embed_tokens.weight), "
        "not the target's"
    ]


def test_export_commands_name_the_written_folder_by_its_whole_path(
    tmp_path, deep_model, monkeypatch
):
    """The printed engine commands named a relative --out as given ("eagle3/try-speculators"),
    which breaks once pasted in another folder or on another machine."""
    head = make_random_eagle3(tmp_path / "head", deep_model, seed=3, hidden_layers=(1, 2, 4))
    monkeypatch.chdir(tmp_path)
    for layout in ("speculators", "specforge"):
        done = export(str(head), layout, f"out/{layout}", model=str(deep_model))
        assert str(tmp_path / "out" / layout) in done.commands[0], done.commands
