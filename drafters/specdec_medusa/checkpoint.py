"""Medusa checkpoints: a folder with ``config.json`` (``MedusaConfig.to_dict``) and
``model.safetensors`` (float32 weights, names as in ``specdec_medusa.config``)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Mapping

import numpy as np
from safetensors.numpy import load_file, save_file

from specdec_medusa.config import MedusaConfig
from specdec_medusa.reference import check_weights, init_random_weights

CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"


def save_medusa(path: str | Path, config: MedusaConfig, weights: Mapping[str, np.ndarray]) -> Path:
    """Write ``config.json`` and ``model.safetensors`` (float32) into folder ``path``; return it."""
    check_weights(config, weights)
    folder = Path(path)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / CONFIG_FILE).write_text(json.dumps(config.to_dict(), indent=2) + "\n")
    arrays = {name: np.ascontiguousarray(array, dtype=np.float32) for name, array in weights.items()}
    save_file(arrays, str(folder / WEIGHTS_FILE), metadata={"format": "np", "model_type": config.model_type})
    return folder


def load_medusa_checkpoint(path: str | Path) -> tuple[MedusaConfig, dict[str, np.ndarray]]:
    """Read a folder written by ``save_medusa``. -> (config, weights as float64 arrays)."""
    folder = Path(path)
    for name in (CONFIG_FILE, WEIGHTS_FILE):
        if not (folder / name).is_file():
            raise ValueError(
                f"{folder} is not a Medusa checkpoint: {name} is missing (expected {CONFIG_FILE} and {WEIGHTS_FILE})"
            )
    config = MedusaConfig.from_dict(json.loads((folder / CONFIG_FILE).read_text()))
    weights = {name: array.astype(np.float64) for name, array in load_file(str(folder / WEIGHTS_FILE)).items()}
    check_weights(config, weights)
    return config, weights


def make_random_medusa(path: str | Path, model_path: str | Path, *, seed: int, **config_overrides) -> Path:
    """A random (untrained) Medusa drafter for the target folder ``model_path``, saved at ``path``.

    Reads ``hidden_size`` and ``vocab_size`` from the target's ``config.json``; the target's
    name is its folder name. ``config_overrides`` are further ``MedusaConfig`` fields
    (``num_heads``, ``head``, ``choices``, ``target`` ...). Weights come from
    ``numpy.random.default_rng(seed)`` and give decisive logits (``init_random_weights``).
    """
    model_folder = Path(model_path)
    config_file = model_folder / CONFIG_FILE
    if not config_file.is_file():
        raise ValueError(f"{model_folder} has no {CONFIG_FILE}; pass the folder of a Hugging Face-format target model")
    target_config = json.loads(config_file.read_text())
    missing = [key for key in ("hidden_size", "vocab_size") if key not in target_config]
    if missing:
        raise ValueError(
            f"{config_file} lacks {missing}; a Medusa drafter needs the target's hidden and vocabulary sizes"
        )
    hidden_size, vocab_size = int(target_config["hidden_size"]), int(target_config["vocab_size"])
    fields = dict(
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        target={"name": model_folder.resolve().name, "vocab_size": vocab_size, "hidden_size": hidden_size},
    )
    fields.update(config_overrides)
    config = MedusaConfig(**fields)
    weights = init_random_weights(config, np.random.default_rng(seed))
    return save_medusa(path, config, weights)
