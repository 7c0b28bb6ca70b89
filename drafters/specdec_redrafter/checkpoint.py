"""ReDrafter checkpoints: a folder with ``config.json`` (``RedrafterConfig.to_dict``) and
``model.safetensors`` (float32 weights, names as in ``specdec_redrafter.config``).

Also random (untrained) drafters for a target folder, scaled so their logits are decisive
(standard deviation ~3), which makes tests and demos see real accept/reject patterns.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any, Mapping

import numpy as np
from safetensors.numpy import load_file, save_file

from specdec_redrafter.config import MODEL_TYPE, RedrafterConfig, check_weights
from specdec_redrafter.reference import drafter_features, rnn_step

__all__ = [
    "load_redrafter_checkpoint",
    "make_random_redrafter",
    "random_redrafter_weights",
    "save_redrafter",
]

CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"


def save_redrafter(path: str | Path, config: RedrafterConfig, weights: Mapping[str, np.ndarray]) -> Path:
    """Write ``config.json`` and ``model.safetensors`` (float32) into folder ``path``; return it."""
    check_weights(config, weights)
    folder = Path(path)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / CONFIG_FILE).write_text(json.dumps(config.to_dict(), indent=2) + "\n")
    arrays = {name: np.ascontiguousarray(array, dtype=np.float32) for name, array in weights.items()}
    save_file(arrays, str(folder / WEIGHTS_FILE), metadata={"format": "np", "model_type": MODEL_TYPE})
    return folder


def load_redrafter_checkpoint(path: str | Path) -> tuple[RedrafterConfig, dict[str, np.ndarray]]:
    """Read a folder written by ``save_redrafter``. -> (config, weights as float64 arrays)."""
    folder = Path(path)
    for name in (CONFIG_FILE, WEIGHTS_FILE):
        if not (folder / name).is_file():
            raise ValueError(
                f"{folder} is not a ReDrafter checkpoint: {name} is missing (expected {CONFIG_FILE} and {WEIGHTS_FILE})"
            )
    config = RedrafterConfig.from_dict(json.loads((folder / CONFIG_FILE).read_text()))
    weights = {name: array.astype(np.float64) for name, array in load_file(str(folder / WEIGHTS_FILE)).items()}
    check_weights(config, weights)
    return config, weights


def random_redrafter_weights(
    config: RedrafterConfig,
    rng: np.random.Generator,
    *,
    embed_rms: float = 1.0,
    lm_head_rms: float | None = None,
    logit_std: float = 3.0,
) -> dict[str, np.ndarray]:
    """Random float64 weights for ``config`` whose drafter logits have std ~``logit_std``.

    embed_rms / lm_head_rms: the root-mean-square entry of the target's embedding and LM head
    (lm_head_rms defaults to embed_rms, as for tied embeddings); the target's hidden state is
    assumed to have unit RMS (it comes out of an RMSNorm). Hidden layers are scaled 1/sqrt(fan_in);
    the head is then calibrated on a sample of drafter features.
    """
    hidden, exit_dim, vocab = config.hidden_size, config.exit_dim, config.vocab_size
    lm_head_rms = embed_rms if lm_head_rms is None else lm_head_rms

    def normal(shape: tuple[int, ...], std: float) -> np.ndarray:
        return rng.normal(0.0, std, size=shape)

    weights: dict[str, np.ndarray] = {}
    if exit_dim != 2 * hidden:
        weights["input_proj.weight"] = normal((exit_dim, 2 * hidden), 1.0 / np.sqrt(2 * hidden))
        weights["input_proj.bias"] = np.zeros(exit_dim)
    for i in range(config.num_draft_layers):
        weights[f"lm_head.{i}.linear.weight"] = normal((exit_dim, exit_dim), 1.0 / np.sqrt(exit_dim))
        weights[f"lm_head.{i}.linear.bias"] = np.zeros(exit_dim)
    if config.rnn:
        weights["rnn_w.weight"] = normal((hidden, hidden), 1.0 / (np.sqrt(hidden) * embed_rms))  # W e ~ unit scale
        weights["rnn_u.weight"] = normal((hidden, hidden), 0.5 / np.sqrt(hidden))
        weights["rnn_u.bias"] = np.zeros(hidden)

    # Calibrate the head on features of random contexts after one and two recurrence steps.
    samples = 64
    h = normal((samples, hidden), 1.0)
    state = rnn_step(config, weights, np.zeros((samples, hidden)), normal((samples, hidden), embed_rms), first=True)
    state = np.concatenate([state, rnn_step(config, weights, state, normal((samples, hidden), embed_rms), first=False)])
    features = drafter_features(config, weights, np.concatenate([h, h]), state)  # (2 * samples, E)
    feature_rms = float(np.sqrt(np.mean(features**2))) or 1.0
    head_std = logit_std / (feature_rms * np.sqrt(exit_dim))  # a full head then has output std logit_std
    if config.head == "full":
        weights[f"lm_head.{config.num_draft_layers}.weight"] = normal((vocab, exit_dim), head_std)
    else:  # logits = lm_head @ head_proj @ x: divide out the LM head's own gain sqrt(H) * rms
        weights["head_proj.weight"] = normal((hidden, exit_dim), head_std / (lm_head_rms * np.sqrt(hidden)))
    return weights


_SAFETENSORS_DTYPES = {"F64": "<f8", "F32": "<f4", "F16": "<f2", "BF16": "<u2"}


def _tensor_rms(file: Path, name: str, max_values: int = 1 << 20) -> float | None:
    """RMS of (a prefix of) tensor ``name`` in a safetensors file, read without loading the file."""
    with open(file, "rb") as handle:
        (header_size,) = struct.unpack("<Q", handle.read(8))
        header = json.loads(handle.read(header_size))
        info = header.get(name)
        if info is None or info.get("dtype") not in _SAFETENSORS_DTYPES:
            return None
        dtype = np.dtype(_SAFETENSORS_DTYPES[info["dtype"]])
        start, end = info["data_offsets"]
        count = min((end - start) // dtype.itemsize, max_values)
        handle.seek(8 + header_size + start)
        values = np.frombuffer(handle.read(count * dtype.itemsize), dtype=dtype)
    if info["dtype"] == "BF16":  # bfloat16 is the upper half of a float32
        values = (values.astype(np.uint32) << 16).view(np.float32)
    values = values.astype(np.float64)
    return float(np.sqrt(np.mean(values**2))) if values.size else None


def _target_rms(folder: Path, names: tuple[str, ...]) -> float | None:
    for file in sorted(folder.glob("*.safetensors")):
        for name in names:
            rms = _tensor_rms(file, name)
            if rms:
                return rms
    return None


def make_random_redrafter(path: str | Path, model_path: str | Path, *, seed: int, **config_overrides) -> Path:
    """A random (untrained) ReDrafter for the target folder ``model_path``, saved at ``path``.

    Reads ``hidden_size`` and ``vocab_size`` from the target's ``config.json``; the target's
    name is its folder name; the head is tied to the target's LM head unless overridden.
    ``config_overrides`` are further ``RedrafterConfig`` fields. Weights come from
    ``numpy.random.default_rng(seed)``, scaled with the RMS of the target's embedding and LM
    head read from its safetensors files (else its ``initializer_range``, default 0.02).
    """
    model_folder = Path(model_path)
    config_file = model_folder / CONFIG_FILE
    if not config_file.is_file():
        raise ValueError(f"{model_folder} has no {CONFIG_FILE}; pass the folder of a Hugging Face-format target model")
    target_config = json.loads(config_file.read_text())
    missing = [key for key in ("hidden_size", "vocab_size") if key not in target_config]
    if missing:
        raise ValueError(f"{config_file} lacks {missing}; a ReDrafter needs the target's hidden and vocabulary sizes")
    hidden_size, vocab_size = int(target_config["hidden_size"]), int(target_config["vocab_size"])
    fields: dict[str, Any] = dict(
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        head="tied",
        target={"name": model_folder.resolve().name, "vocab_size": vocab_size, "hidden_size": hidden_size},
    )
    fields.update(config_overrides)
    config = RedrafterConfig(**fields)
    fallback = float(target_config.get("initializer_range", 0.02))
    embed_rms = _target_rms(model_folder, ("model.embed_tokens.weight", "embed_tokens.weight")) or fallback
    lm_head_rms = _target_rms(model_folder, ("lm_head.weight",)) or embed_rms
    weights = random_redrafter_weights(
        config, np.random.default_rng(seed), embed_rms=embed_rms, lm_head_rms=lm_head_rms
    )
    return save_redrafter(path, config, weights)
