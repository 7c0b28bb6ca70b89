"""Medusa checkpoints: a folder with ``config.json`` (``MedusaConfig.to_dict``) and
``model.safetensors`` (float32 weights, names as in ``specdec_medusa.config``)."""

from __future__ import annotations

from pathlib import Path
from typing import Mapping

import numpy as np

from specdec.models.checkpoints import read_checkpoint, read_target_config, save_checkpoint
from specdec.plugins.export import detect_layout

from specdec_medusa.config import MedusaConfig
from specdec_medusa.export_read import read_fasterdecoding, read_vllm
from specdec_medusa.reference import check_weights, init_random_weights


def save_medusa(
    path: str | Path, config: MedusaConfig, weights: Mapping[str, np.ndarray], *, dtype=np.float32
) -> Path:
    """Write ``config.json`` and ``model.safetensors`` (float32, or float16 to ship) into ``path``;
    return it."""
    check_weights(config, weights)
    return save_checkpoint(path, config.to_dict(), weights, dtype=dtype)


def load_medusa_checkpoint(path: str | Path) -> tuple[MedusaConfig, dict[str, np.ndarray]]:
    """Read a folder written by ``save_medusa``, or one in FasterDecoding's or vLLM's layout
    (``specdec_medusa.export_read``). -> (config, weights as float64 arrays)."""
    layout = detect_layout(path)
    if layout in (("medusa", "fasterdecoding"), ("medusa", "vllm")):
        config, weights, _ = (read_fasterdecoding if layout[1] == "fasterdecoding" else read_vllm)(
            path
        )
        return config, weights
    config, weights = read_checkpoint(path, label="Medusa")
    config = MedusaConfig.from_dict(config)
    check_weights(config, weights)
    return config, weights


def make_random_medusa(
    path: str | Path, model_path: str | Path, *, seed: int, **config_overrides
) -> Path:
    """A random (untrained) Medusa drafter for the target folder ``model_path``, saved at ``path``.

    Reads ``hidden_size`` and ``vocab_size`` from the target's ``config.json``; the target's
    name is its folder name. ``config_overrides`` are further ``MedusaConfig`` fields
    (``num_heads``, ``head``, ``choices``, ``target`` ...). Weights come from
    ``numpy.random.default_rng(seed)`` and give decisive logits (``init_random_weights``).
    """
    _, record = read_target_config(model_path, label="Medusa")
    fields = dict(vocab_size=record["vocab_size"], hidden_size=record["hidden_size"], target=record)
    fields.update(config_overrides)
    config = MedusaConfig(**fields)
    weights = init_random_weights(config, np.random.default_rng(seed))
    return save_medusa(path, config, weights)
