"""EAGLE checkpoints: a folder with ``config.json`` (``EagleConfig.to_dict``) and
``model.safetensors`` (float32 weights, names as in ``specdec_eagle.config``).

Also random (untrained) drafters for a target folder, scaled so that their logits are decisive
(standard deviation ~3), which makes tests see real accept/reject patterns.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

import numpy as np

from specdec.models.checkpoints import read_checkpoint, read_target_config, save_checkpoint
from specdec.models.llama import LlamaConfig, load_tensors

from specdec_eagle.config import EagleConfig, check_weights
from specdec_eagle.reference import SlotCache, run_entries

__all__ = [
    "config_for_target",
    "load_eagle_checkpoint",
    "make_random_eagle",
    "random_eagle_weights",
    "save_eagle",
]


def save_eagle(
    path: str | Path, config: EagleConfig, weights: Mapping[str, np.ndarray], *, dtype=np.float32
) -> Path:
    """Write ``config.json`` and ``model.safetensors`` (float32, or float16 to ship) into ``path``;
    return it."""
    check_weights(config, weights)
    return save_checkpoint(path, config.to_dict(), weights, dtype=dtype)


def load_eagle_checkpoint(path: str | Path) -> tuple[EagleConfig, dict[str, np.ndarray]]:
    """Read a folder written by ``save_eagle`` -> (config, weights as float64 arrays, the shortlist
    int64)."""
    config, weights = read_checkpoint(path, label="EAGLE")
    config = EagleConfig.from_dict(config)
    check_weights(config, weights)
    return config, weights


def config_for_target(target: LlamaConfig, record: dict, **overrides) -> EagleConfig:
    """An EagleConfig whose draft layer has the target's head layout, MLP width, rotary base and
    norm epsilon; ``overrides`` are further fields."""
    fields: dict[str, Any] = dict(
        vocab_size=target.vocab_size,
        hidden_size=target.hidden_size,
        num_heads=target.num_attention_heads,
        num_kv_heads=target.num_key_value_heads,
        head_dim=target.head_dim,
        intermediate_size=target.intermediate_size,
        rope_theta=target.rope_theta,
        rms_norm_eps=target.rms_norm_eps,
        target=record,
    )
    fields.update(overrides)
    return EagleConfig(**fields)


def random_eagle_weights(
    config: EagleConfig,
    rng: np.random.Generator,
    *,
    embed_tokens: np.ndarray,
    lm_head: np.ndarray,
    logit_std: float = 3.0,
    feature_rms: float = 1.0,
) -> dict[str, np.ndarray]:
    """Random float64 weights for ``config`` whose draft logits have std ~``logit_std`` on inputs
    like the target's (features of RMS ``feature_rms``, tokens of ``embed_tokens``).

    Linear layers are scaled 1/sqrt(fan_in); then the fc and the output projections are scaled
    together until the layer's output has the RMS that gives the LM head (V, H) that spread.
    """
    hidden, inner = config.hidden_size, config.intermediate_size
    q_out, kv_out = config.num_heads * config.head_dim, config.num_kv_heads * config.head_dim

    def normal(shape: tuple[int, ...], fan_in: int) -> np.ndarray:
        return rng.normal(0.0, 1.0 / np.sqrt(fan_in), size=shape)

    attn, mlp = "layers.0.self_attn.", "layers.0.mlp."
    embed_rms = float(np.sqrt(np.mean(embed_tokens**2))) or 1.0
    fc = normal((hidden, 2 * hidden), 2 * hidden)
    fc[:, :hidden] /= embed_rms  # both halves of [embedding ; feature] count alike
    fc[:, hidden:] /= feature_rms
    weights = {
        "fc.weight": fc,
        attn + "q_proj.weight": normal((q_out, hidden), hidden),
        attn + "k_proj.weight": normal((kv_out, hidden), hidden),
        attn + "v_proj.weight": normal((kv_out, hidden), hidden),
        attn + "o_proj.weight": normal((hidden, q_out), q_out),
        "layers.0.post_attention_layernorm.weight": 1.0 + 0.1 * rng.normal(size=hidden),
        mlp + "gate_proj.weight": normal((inner, hidden), hidden),
        mlp + "up_proj.weight": normal((inner, hidden), hidden),
        mlp + "down_proj.weight": normal((hidden, inner), inner),
    }
    if config.fc_bias:
        weights["fc.bias"] = 0.1 * rng.normal(size=hidden)
    if config.shortlist_size is not None:
        ids = rng.choice(config.vocab_size, size=config.shortlist_size, replace=False)
        weights["vocab_shortlist"] = np.sort(ids).astype(np.int64)

    # Calibrate on a random context of 8 entries: out RMS * lm_head gain ~ logit_std.
    tokens = rng.integers(0, config.vocab_size, size=8)
    features = rng.normal(0.0, feature_rms, size=(8, hidden))
    lm_gain = float(np.sqrt(np.mean(lm_head**2)) * np.sqrt(hidden)) or 1.0
    for _ in range(4):
        empty = np.zeros((config.num_kv_heads, 0, config.head_dim))
        out, _ = run_entries(
            config,
            weights,
            embed_tokens,
            SlotCache(keys=empty, values=empty, pending=features[0]),
            tokens,
            features,
        )
        scale = logit_std / (lm_gain * float(np.sqrt(np.mean(out**2))))
        for name in ("fc.weight", "fc.bias", mlp + "down_proj.weight"):
            if name in weights:
                weights[name] = weights[name] * scale
    return weights


def _tensor(tensors: dict, names: tuple[str, ...]) -> np.ndarray | None:
    for name in names:
        if name in tensors:
            return np.asarray(tensors[name], dtype=np.float64)
    return None


def make_random_eagle(
    path: str | Path, model_path: str | Path, *, seed: int, **config_overrides
) -> Path:
    """A random (untrained) EAGLE drafter for the target folder ``model_path``, saved at ``path``.

    The draft layer copies the target's head layout, MLP width, rotary base and norm epsilon
    (``config_overrides`` change them or any other ``EagleConfig`` field). Weights come from
    ``numpy.random.default_rng(seed)``, calibrated on the target's embedding and LM head.
    """
    target_config, record = read_target_config(model_path, label="EAGLE")
    llama = LlamaConfig.from_hf_dict(target_config)
    config = config_for_target(llama, record, **config_overrides)
    rng = np.random.default_rng(seed)
    try:
        tensors = load_tensors(Path(model_path))
    except (OSError, ValueError):
        tensors = {}
    embed = _tensor(tensors, ("model.embed_tokens.weight", "embed_tokens.weight"))
    if embed is None:
        embed = rng.normal(
            0.0,
            float(target_config.get("initializer_range", 0.02)),
            size=(llama.vocab_size, llama.hidden_size),
        )
    lm_head = _tensor(tensors, ("lm_head.weight",))
    weights = random_eagle_weights(
        config, rng, embed_tokens=embed, lm_head=embed if lm_head is None else lm_head
    )
    return save_eagle(path, config, weights)
