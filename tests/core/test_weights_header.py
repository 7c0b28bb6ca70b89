"""Every backend checks config.json against the weights' safetensors headers before it builds a
layer: 10^7 layers over a 2-layer file, a wrong size, a missing LM head or integer weights are
refused with the file and the fix named, and the framework's model builder is never called."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

import specdec
from specdec.errors import InvalidInputError, ModelLoadError
from specdec.models.llama import LlamaConfig
from specdec.reference.weights import check_weights_header

BACKENDS = ["numpy", "torch", "mlx"]


def edited(model_dir, tmp_path, *, config=None, tensors=None):
    """A copy of ``model_dir`` with config.json fields replaced and tensors edited in place
    (``tensors(dict) -> None``)."""
    folder = tmp_path / "model"
    shutil.copytree(model_dir, folder)
    if config:
        settings = json.loads((folder / "config.json").read_text())
        settings.update(config)
        (folder / "config.json").write_text(json.dumps(settings))
    if tensors:
        weights = load_file(str(folder / "model.safetensors"))
        tensors(weights)
        save_file(weights, str(folder / "model.safetensors"))
    return folder


def never_build(monkeypatch, backend):
    """Make the backend's model builder fail the test if it is reached."""

    def refuse(*args, **kwargs):
        raise AssertionError(
            f"the {backend} backend built the model before checking the weights' header"
        )

    if backend == "torch":
        transformers = pytest.importorskip("transformers")
        pytest.importorskip("torch")
        monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", refuse)
    elif backend == "mlx":
        pytest.importorskip("mlx.core")
        utils = pytest.importorskip("mlx_lm.utils")
        monkeypatch.setattr(utils, "load_model", refuse)
    else:
        from specdec.reference import model

        monkeypatch.setattr(model.ReferenceTarget, "__init__", refuse)


def load(folder, backend):
    return specdec.load(folder, backend=backend, dtype="float32" if backend != "numpy" else None)


HOSTILE = {
    "ten million layers": (
        dict(config={"num_hidden_layers": 10**7}),
        "num_hidden_layers=10000000, but the weights hold 2 (model.layers.0 to 1)",
    ),
    "a wider hidden size": (
        dict(config={"hidden_size": 64, "head_dim": 8}),
        "has shape (96, 32), but",
    ),
    "no lm head and not tied": (
        dict(
            config={"tie_word_embeddings": False}, tensors=lambda w: w.pop("lm_head.weight", None)
        ),
        "lack tensor 'lm_head.weight'",
    ),
    "int8 weights": (
        dict(
            tensors=lambda w: w.update(
                {
                    "model.layers.1.mlp.up_proj.weight": w[
                        "model.layers.1.mlp.up_proj.weight"
                    ].astype(np.int8)
                }
            )
        ),
        "is stored as I8; specdec loads float weights",
    ),
    "a missing layer": (
        dict(tensors=lambda w: [w.pop(k) for k in list(w) if k.startswith("model.layers.0.")]),
        "the weights hold layers 1",
    ),
}


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_each_backend_refuses_weights_that_disagree_with_the_config(
    model_dir, tmp_path, monkeypatch, backend, case
):
    edit, expected = HOSTILE[case]
    folder = edited(model_dir, tmp_path, **edit)
    never_build(monkeypatch, backend)
    with pytest.raises((InvalidInputError, ModelLoadError)) as caught:
        load(folder, backend)
    message = str(caught.value)
    assert expected in message and (
        "fix config.json" in message or "convert the checkpoint" in message
    ), message


def test_agreeing_weights_pass_and_load(model_dir):
    check_weights_header(model_dir, LlamaConfig.from_folder(model_dir))
    assert load(model_dir, "numpy").num_layers == 2


def test_a_quantized_folder_is_checked_for_its_layer_count_only(model_dir, tmp_path):
    folder = edited(
        model_dir,
        tmp_path,
        config={"quantization": {"group_size": 64, "bits": 4}},
        tensors=lambda w: w.update(
            {"model.layers.0.mlp.up_proj.scales": np.ones((2,), np.float32)}
        ),
    )
    check_weights_header(folder, LlamaConfig.from_folder(folder))
    too_many = edited(folder, tmp_path / "more", config={"num_hidden_layers": 3})
    with pytest.raises(InvalidInputError, match="num_hidden_layers=3"):
        check_weights_header(too_many, LlamaConfig.from_folder(too_many))
