"""ReDrafter checkpoints: a folder with ``config.json`` (``RedrafterConfig.to_dict``) and
``model.safetensors`` (float32 weights, names as in ``specdec_redrafter.config``).

Also random (untrained) drafters for a target folder, scaled so their logits are decisive
(standard deviation ~3), which makes tests and demos see real accept/reject patterns.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

import numpy as np

from specdec.models.checkpoints import read_checkpoint, read_target_config, save_checkpoint
from specdec.models.llama import load_tensors

from specdec.plugins.export import detect_layout
from specdec_redrafter.config import RedrafterConfig, check_weights
from specdec_redrafter.export import read_apple
from specdec_redrafter.reference import drafter_features, rnn_step

__all__ = [
    "load_redrafter_checkpoint",
    "make_random_redrafter",
    "random_redrafter_weights",
    "save_redrafter",
]


def save_redrafter(
    path: str | Path,
    config: RedrafterConfig,
    weights: Mapping[str, np.ndarray],
    *,
    dtype=np.float32,
) -> Path:
    """Write ``config.json`` and ``model.safetensors`` (float32, or float16 to ship) into ``path``;
    return it."""
    check_weights(config, weights)
    return save_checkpoint(path, config.to_dict(), weights, dtype=dtype)


def load_redrafter_checkpoint(path: str | Path) -> tuple[RedrafterConfig, dict[str, np.ndarray]]:
    """Read a folder written by ``save_redrafter``, or one in Apple's layout
    (``specdec_redrafter.export``). -> (config, weights as float64 arrays)."""
    if detect_layout(path) == ("redrafter", "apple"):
        config, weights, _ = read_apple(path)
        return config, weights
    config, weights = read_checkpoint(path, label="ReDrafter")
    config = RedrafterConfig.from_dict(config)
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
        weights[f"lm_head.{i}.linear.weight"] = normal(
            (exit_dim, exit_dim), 1.0 / np.sqrt(exit_dim)
        )
        weights[f"lm_head.{i}.linear.bias"] = np.zeros(exit_dim)
    if config.rnn:
        # W e ~ unit scale
        weights["rnn_w.weight"] = normal((hidden, hidden), 1.0 / (np.sqrt(hidden) * embed_rms))
        weights["rnn_u.weight"] = normal((hidden, hidden), 0.5 / np.sqrt(hidden))
        weights["rnn_u.bias"] = np.zeros(hidden)

    # Calibrate the head on features of random contexts after one and two recurrence steps.
    samples = 64
    h = normal((samples, hidden), 1.0)
    state = rnn_step(
        config,
        weights,
        np.zeros((samples, hidden)),
        normal((samples, hidden), embed_rms),
        first=True,
    )
    state = np.concatenate(
        [state, rnn_step(config, weights, state, normal((samples, hidden), embed_rms), first=False)]
    )
    features = drafter_features(config, weights, np.concatenate([h, h]), state)  # (2 * samples, E)
    feature_rms = float(np.sqrt(np.mean(features**2))) or 1.0
    # a full head then has output std logit_std
    head_std = logit_std / (feature_rms * np.sqrt(exit_dim))
    if config.head == "full":
        weights[f"lm_head.{config.num_draft_layers}.weight"] = normal((vocab, exit_dim), head_std)
    else:  # logits = lm_head @ head_proj @ x: divide out the LM head's own gain sqrt(H) * rms
        weights["head_proj.weight"] = normal(
            (hidden, exit_dim), head_std / (lm_head_rms * np.sqrt(hidden))
        )
    if config.shortlist_size is not None:
        weights["vocab_shortlist"] = np.sort(
            rng.choice(vocab, size=config.shortlist_size, replace=False)
        ).astype(np.int64)
    return weights


def _rms(tensors: dict, names: tuple[str, ...]) -> float | None:
    for name in names:
        if name in tensors:
            return float(np.sqrt(np.mean(tensors[name] ** 2)))
    return None


def make_random_redrafter(
    path: str | Path, model_path: str | Path, *, seed: int, **config_overrides
) -> Path:
    """A random (untrained) ReDrafter for the target folder ``model_path``, saved at ``path``.

    Reads ``hidden_size`` and ``vocab_size`` from the target's ``config.json``; the target's
    name is its folder name; the head is tied to the target's LM head unless overridden.
    ``config_overrides`` are further ``RedrafterConfig`` fields. Weights come from
    ``numpy.random.default_rng(seed)``, scaled with the RMS of the target's embedding and LM
    head read from its safetensors files (else its ``initializer_range``, default 0.02).
    """
    target_config, record = read_target_config(model_path, label="ReDrafter")
    fields: dict[str, Any] = dict(
        vocab_size=record["vocab_size"],
        hidden_size=record["hidden_size"],
        head="tied",
        target=record,
    )
    fields.update(config_overrides)
    config = RedrafterConfig(**fields)
    fallback = float(target_config.get("initializer_range", 0.02))
    try:
        tensors = load_tensors(Path(model_path))
    except (OSError, ValueError):
        tensors = {}
    embed_rms = _rms(tensors, ("model.embed_tokens.weight", "embed_tokens.weight")) or fallback
    lm_head_rms = _rms(tensors, ("lm_head.weight",)) or embed_rms
    weights = random_redrafter_weights(
        config, np.random.default_rng(seed), embed_rms=embed_rms, lm_head_rms=lm_head_rms
    )
    return save_redrafter(path, config, weights)
