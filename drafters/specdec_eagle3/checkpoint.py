"""EAGLE-3 checkpoints: a folder with ``config.json`` (``Eagle3Config.to_dict``) and
``model.safetensors`` (float weights and the int64 ``d2t``, names as in ``specdec_eagle3.config``).

Also random (untrained) drafters for a target folder whose draft logits are decisive (standard
deviation ~3), so tests see real accept/reject patterns.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

import numpy as np

from specdec.models.checkpoints import read_checkpoint, read_target_config, save_checkpoint
from specdec.models.llama import LlamaConfig
from specdec.plugins.export import detect_layout

from specdec_eagle3.config import Eagle3Config, check_weights, default_hidden_layers
from specdec_eagle3.export_read import read_specforge, read_speculators
from specdec_eagle3.llamacpp_read import read_gguf

__all__ = [
    "config_for_target",
    "d2t_from_ids",
    "load_eagle3_checkpoint",
    "make_random_eagle3",
    "random_eagle3_weights",
    "save_eagle3",
]


def save_eagle3(
    path: str | Path, config: Eagle3Config, weights: Mapping[str, np.ndarray], *, dtype=np.float32
) -> Path:
    """Write ``config.json`` and ``model.safetensors`` (float32, or float16 to ship; ``d2t`` int64)
    into ``path``."""
    check_weights(config, weights)
    weights = {**weights, "d2t": np.asarray(weights["d2t"], dtype=np.int64)}
    return save_checkpoint(path, config.to_dict(), weights, dtype=dtype)


def load_eagle3_checkpoint(path: str | Path) -> tuple[Eagle3Config, dict[str, np.ndarray]]:
    """Read a folder written by ``save_eagle3``, or one in the SpecForge or speculators layout
    (``specdec_eagle3.export``), or llama.cpp's GGUF (the file, or a folder holding it:
    ``specdec_eagle3.llamacpp``) -> (config, float64 weights, ``d2t`` int64)."""
    layout = detect_layout(path)
    if layout == ("eagle3", "gguf"):
        config, weights, _ = read_gguf(path)
        return config, weights
    if layout in (("eagle3", "specforge"), ("eagle3", "speculators")):
        config, weights, _ = (read_specforge if layout[1] == "specforge" else read_speculators)(
            path
        )
        return config, weights
    config, weights = read_checkpoint(path, label="EAGLE-3")
    config = Eagle3Config.from_dict(config)
    check_weights(config, weights)
    return config, weights


def d2t_from_ids(ids) -> np.ndarray:
    """EAGLE-3's offsets d2t[i] = ids[i] - i of an ascending list of target ids."""
    ids = np.asarray(ids, dtype=np.int64)
    return ids - np.arange(len(ids), dtype=np.int64)


def config_for_target(target: LlamaConfig, record: dict, **overrides) -> Eagle3Config:
    """An Eagle3Config with the target's head layout, MLP width, rotary base and norm epsilon, the
    default three layers and the full vocabulary as draft vocabulary; ``overrides`` are further
    fields."""
    fields: dict[str, Any] = dict(
        vocab_size=target.vocab_size,
        hidden_size=target.hidden_size,
        draft_vocab_size=target.vocab_size,
        hidden_layers=default_hidden_layers(target.num_hidden_layers),
        num_heads=target.num_attention_heads,
        num_kv_heads=target.num_key_value_heads,
        head_dim=target.head_dim,
        intermediate_size=target.intermediate_size,
        rope_theta=target.rope_theta,
        rms_norm_eps=target.rms_norm_eps,
        target={**record, "num_hidden_layers": target.num_hidden_layers},
    )
    fields.update(overrides)
    return Eagle3Config(**fields)


def random_eagle3_weights(
    config: Eagle3Config, rng: np.random.Generator, *, logit_std: float = 3.0, ids=None
) -> dict[str, np.ndarray]:
    """Random float64 weights for ``config`` (Linear layers scaled 1/sqrt(fan_in), norms near 1;
    the LM head reads a normed state, so rows of std logit_std / sqrt(H) give logits of std
    ~``logit_std``). ids: the draft vocabulary's target ids (ascending); by default a random
    sorted draw of ``draft_vocab_size`` of them. ``embed_tokens.weight`` and ``input_norm.weight``
    where the config has them (``own_embedding``, ``norm_before_fc``)."""
    hidden, inner = config.hidden_size, config.intermediate_size
    q_out, kv_out = config.num_heads * config.head_dim, config.num_kv_heads * config.head_dim

    def normal(shape: tuple[int, ...], fan_in: int) -> np.ndarray:
        return rng.normal(0.0, 1.0 / np.sqrt(fan_in), size=shape)

    def norm() -> np.ndarray:
        return 1.0 + 0.1 * rng.normal(size=hidden)

    if ids is None:
        ids = np.sort(rng.choice(config.vocab_size, size=config.draft_vocab_size, replace=False))
    attn, mlp = "midlayer.self_attn.", "midlayer.mlp."
    weights = {
        "fc.weight": normal((hidden, 3 * hidden), 3 * hidden),
        "midlayer.input_layernorm.weight": norm(),
        "midlayer.hidden_norm.weight": norm(),
        attn + "q_proj.weight": normal((q_out, 2 * hidden), 2 * hidden),
        attn + "k_proj.weight": normal((kv_out, 2 * hidden), 2 * hidden),
        attn + "v_proj.weight": normal((kv_out, 2 * hidden), 2 * hidden),
        attn + "o_proj.weight": normal((hidden, q_out), q_out),
        "midlayer.post_attention_layernorm.weight": norm(),
        mlp + "gate_proj.weight": normal((inner, hidden), hidden),
        mlp + "up_proj.weight": normal((inner, hidden), hidden),
        mlp + "down_proj.weight": normal((hidden, inner), inner),
        "norm.weight": norm(),
        "lm_head.weight": rng.normal(
            0.0, logit_std / np.sqrt(hidden), size=(config.draft_vocab_size, hidden)
        ),
        "d2t": d2t_from_ids(ids),
    }
    # drawn last, so that a head without them is the same as before they existed
    if config.own_embedding:  # rows of unit scale, as a target's embedding feeds a normed layer
        weights["embed_tokens.weight"] = rng.normal(size=(config.vocab_size, hidden))
    if config.norm_before_fc:
        weights["input_norm.weight"] = 1.0 + 0.1 * rng.normal(size=3 * hidden)
    return weights


def make_random_eagle3(
    path: str | Path, model_path: str | Path, *, seed: int, **config_overrides
) -> Path:
    """A random (untrained) EAGLE-3 drafter for the target folder ``model_path``, saved at ``path``.

    The draft layer copies the target's head layout, MLP width, rotary base and norm epsilon and
    fuses the default three layers (``config_overrides`` change them or any other ``Eagle3Config``
    field, e.g. ``draft_vocab_size``). Weights come from ``numpy.random.default_rng(seed)``; the
    draft vocabulary is a random sorted subset of the target's (all of it by default).
    """
    target_config, record = read_target_config(model_path, label="EAGLE-3")
    llama = LlamaConfig.from_hf_dict(target_config)
    config = config_for_target(llama, record, **config_overrides)
    return save_eagle3(path, config, random_eagle3_weights(config, np.random.default_rng(seed)))
