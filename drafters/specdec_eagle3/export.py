"""EAGLE-3 in the layouts engines load (docs/scale-out.md has the tables and their sources).

``specforge`` (aliases ``sglang``, ``tensorrt-llm``, ``trtllm``): the EAGLE / SpecForge layout that
SGLang and TensorRT-LLM read: a Llama ``config.json`` with ``num_hidden_layers: 1`` and
``draft_vocab_size``, tensors ``fc.weight``, ``midlayer.*``, ``norm.weight``, ``lm_head.weight``,
``d2t`` (int64 offsets) and ``t2d`` (bool mask over the target vocabulary). Our own names are
this layout's, so the tensors pass unchanged. Fused layer ids, when not the default three, are
written as ``eagle_config.eagle_aux_hidden_state_layer_ids`` in SGLang's output-of-layer
convention (ours).

``speculators`` (alias ``vllm``): vLLM's speculators format:
``architectures: ["Eagle3Speculator"]``, ``speculators_model_type: "eagle3"``, a nested
``transformer_layer_config``, ``norm_before_residual`` always written
(vLLM's adapter defaults it to true), ``eagle_aux_hidden_state_layer_ids`` in vLLM's input-of-layer
convention (ours + 1), tensors as above with ``midlayer.`` renamed ``layers.0.``.

Both keep a ``specdec`` block (the tree settings and the target record) so an export read back
is our checkpoint exactly. What a layout cannot hold is refused with the fix.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from specdec.errors import InvalidInputError
from specdec_eagle3.config import (
    Eagle3Config,
    check_weights,
    default_hidden_layers,
    draft_to_target,
)

__all__ = [
    "detect_specforge",
    "detect_speculators",
    "read_specforge",
    "read_speculators",
    "write_specforge",
    "write_speculators",
]

DTYPES = {"float32": np.float32, "float16": np.float16}
SPECFORGE_ARCHITECTURE = "LlamaForCausalLMEagle3"
SPECULATORS_ARCHITECTURE = "Eagle3Speculator"
UNSUPPORTED_FLAGS = ("fc_norm", "norm_before_fc", "norm_output")  # EAGLE-3.1 variants


def _llama_config(config: Eagle3Config) -> dict[str, Any]:
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_act": "silu",
        "hidden_size": config.hidden_size,
        "intermediate_size": config.intermediate_size,
        "num_attention_heads": config.num_heads,
        "num_key_value_heads": config.num_kv_heads,
        "head_dim": config.head_dim,
        "num_hidden_layers": 1,
        "rms_norm_eps": config.rms_norm_eps,
        "rope_theta": config.rope_theta,
        "vocab_size": config.vocab_size,
        "tie_word_embeddings": False,
        "max_position_embeddings": int(config.target.get("max_position_embeddings", 8192)),
    }


def _specdec_block(config: Eagle3Config) -> dict[str, Any]:
    return {
        "top_k": config.top_k,
        "depth": config.depth,
        "total_tokens": config.total_tokens,
        "target": config.target,
        "hidden_layers": None if config.hidden_layers is None else list(config.hidden_layers),
    }


def _is_default(config: Eagle3Config) -> bool:
    layers = config.target.get("num_hidden_layers")
    return config.hidden_layers is None or (
        layers is not None and tuple(config.hidden_layers) == default_hidden_layers(int(layers))
    )


def _tensors(
    config: Eagle3Config, weights: Mapping[str, np.ndarray], dtype: str, prefix: str
) -> dict[str, np.ndarray]:
    if dtype not in DTYPES:
        raise InvalidInputError(f"dtype must be one of {sorted(DTYPES)}, got {dtype!r}")
    check_weights(config, weights)
    arrays = {
        name.replace("midlayer.", prefix): np.ascontiguousarray(array, dtype=DTYPES[dtype])
        for name, array in weights.items()
        if name != "d2t"
    }
    arrays["d2t"] = np.asarray(weights["d2t"], dtype=np.int64)
    t2d = np.zeros(config.vocab_size, dtype=bool)
    t2d[draft_to_target(weights["d2t"])] = True
    arrays["t2d"] = t2d
    return arrays


def _save(folder: Path, arrays: dict, config_json: dict) -> None:
    from safetensors.numpy import save_file

    folder.mkdir(parents=True, exist_ok=True)
    save_file(arrays, str(folder / "model.safetensors"), metadata={"format": "pt"})
    (folder / "config.json").write_text(json.dumps(config_json, indent=2) + "\n")


def _no_options(choices, drop_shortlist) -> None:
    if choices is not None or drop_shortlist:
        raise InvalidInputError(
            "choices and drop_shortlist apply to Medusa and ReDrafter; an EAGLE-3 head has neither"
        )


def write_specforge(
    config: Eagle3Config,
    weights: Mapping[str, np.ndarray],
    out,
    *,
    lm_head=None,
    dtype: str = "float32",
    choices=None,
    drop_shortlist: bool = False,
):
    """The EAGLE / SpecForge layout (SGLang, TensorRT-LLM) -> (notes, the ``sglang`` command)."""
    _no_options(choices, drop_shortlist)
    if config.norm_before_residual:
        raise InvalidInputError(
            "this EAGLE-3 head adds the normed feature as the residual (norm_before_residual), "
            "which the EAGLE/SpecForge layout cannot say; export --format speculators (vLLM) "
            "instead"
        )
    data = {
        **_llama_config(config),
        "architectures": [SPECFORGE_ARCHITECTURE],
        "draft_vocab_size": config.draft_vocab_size,
        "specdec": _specdec_block(config),
    }
    notes = [
        (
            "t2d written from d2t (a mask over the target vocabulary); the token embedding is "
            "the target's"
        )
    ]
    if not _is_default(config):
        data["eagle_config"] = {
            "use_aux_hidden_state": True,
            "eagle_aux_hidden_state_layer_ids": list(config.hidden_layers),
        }
        notes.append(
            "eagle_aux_hidden_state_layer_ids in SGLang's output-of-layer convention (specdec's); "
            "vLLM reads the key as input-of-layer ids, so for vLLM export --format speculators"
        )
    _save(Path(out), _tensors(config, weights, dtype, "midlayer."), data)
    steps, topk = config.depth, config.top_k
    return notes, (
        "python -m sglang.launch_server --model-path TARGET_HF_FOLDER --speculative-algorithm "
        f"EAGLE3 --speculative-draft-model-path {out} --speculative-num-steps {steps} "
        f"--speculative-eagle-topk {topk} --speculative-num-draft-tokens {config.total_tokens + 1}",
    )


def write_speculators(
    config: Eagle3Config,
    weights: Mapping[str, np.ndarray],
    out,
    *,
    lm_head=None,
    dtype: str = "float32",
    choices=None,
    drop_shortlist: bool = False,
):
    """vLLM's speculators layout -> (notes, the ``vllm serve`` command)."""
    _no_options(choices, drop_shortlist)
    if config.hidden_layers is None:
        raise InvalidInputError(
            "this EAGLE-3 head names no fused layers (loaded for a target, it fuses that "
            "target's default three), and the speculators layout records them: give them in its "
            "config.json (hidden_layers in a specdec checkpoint, "
            "eagle_config.eagle_aux_hidden_state_layer_ids in the SpecForge layout; 0-based "
            "output-of-layer ids, by default (1, L//2 - 1, L - 4) for L decoder layers) and "
            "export again"
        )
    data = {
        "architectures": [SPECULATORS_ARCHITECTURE],
        "speculators_model_type": "eagle3",
        "transformer_layer_config": _llama_config(config),
        "draft_vocab_size": config.draft_vocab_size,
        "norm_before_residual": config.norm_before_residual,
        "target_hidden_size": config.hidden_size,
        "eagle_aux_hidden_state_layer_ids": [i + 1 for i in config.hidden_layers],
        "speculators_config": {
            "algorithm": "eagle3",
            "default_proposal_method": "greedy",
            "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": config.depth}],
            "verifier": {
                "name_or_path": config.target.get("name"),
                "architectures": ["LlamaForCausalLM"],
            },
        },
        "specdec": _specdec_block(config),
    }
    _save(Path(out), _tensors(config, weights, dtype, "layers.0."), data)
    notes = [
        "eagle_aux_hidden_state_layer_ids in vLLM's input-of-layer convention (specdec's ids + 1)",
        "vLLM drafts a chain of num_speculative_tokens, not the dynamic tree",
    ]
    spec = json.dumps(
        {"method": "eagle3", "model": str(out), "num_speculative_tokens": config.depth}
    )
    return notes, (f"vllm serve TARGET_HF_FOLDER --speculative-config '{spec}'",)


def _load_tensors(folder: Path) -> dict[str, np.ndarray]:
    from safetensors.numpy import load_file

    if (folder / "model.safetensors").is_file():
        return load_file(str(folder / "model.safetensors"))
    if (folder / "pytorch_model.bin").is_file():
        try:
            import torch
        except ImportError as exc:
            raise InvalidInputError(
                f"{folder}/pytorch_model.bin needs torch to read; install specdec[torch]"
            ) from exc
        state = torch.load(folder / "pytorch_model.bin", map_location="cpu", weights_only=True)
        return {
            name: tensor.float().numpy() if tensor.is_floating_point() else tensor.numpy()
            for name, tensor in state.items()
        }
    raise InvalidInputError(f"{folder} holds no model.safetensors or pytorch_model.bin")


def _read(
    folder, layer: dict, top: dict, prefix: str, layers_from
) -> tuple[Eagle3Config, dict, list[str]]:
    folder = Path(folder)
    for flag in UNSUPPORTED_FLAGS:
        if top.get(flag) or layer.get(flag):
            raise InvalidInputError(
                f"{folder} is an EAGLE-3.1 head ({flag}=true), which specdec's EAGLE-3 does not "
                "run; retrain or convert it without that flag"
            )
    if int(layer.get("num_hidden_layers", 1)) != 1:
        raise InvalidInputError(
            f"{folder} has {layer.get('num_hidden_layers')} draft layers; EAGLE-3 has one"
        )
    hidden = int(layer["hidden_size"])
    if int(top.get("target_hidden_size") or layer.get("target_hidden_size") or hidden) != hidden:
        raise InvalidInputError(
            f"{folder} drafts at hidden size {hidden} from a target of another width "
            "(target_hidden_size); specdec's EAGLE-3 needs them equal"
        )
    raw = _load_tensors(folder)
    if any("embed_tokens" in name for name in raw):
        raise InvalidInputError(
            f"{folder} carries its own token embedding; specdec's EAGLE-3 uses the target's"
        )
    vocab = int(layer["vocab_size"])
    draft_vocab = top.get("draft_vocab_size") or layer.get("draft_vocab_size") or vocab
    weights = {
        name.replace(prefix, "midlayer."): np.asarray(array, dtype=np.float64)
        for name, array in raw.items()
        if name not in ("d2t", "t2d")
    }
    notes = []
    if "d2t" in raw:
        weights["d2t"] = np.asarray(raw["d2t"], dtype=np.int64)
    else:
        weights["d2t"] = np.zeros(int(draft_vocab), dtype=np.int64)
        notes.append("no d2t: the draft vocabulary is the target's")
    if "lm_head.weight" not in weights:
        raise InvalidInputError(
            f"{folder} has no lm_head.weight; heads that share the target's LM head are not "
            "supported"
        )
    block = top.get("specdec") or {}
    fields = dict(
        vocab_size=vocab,
        hidden_size=hidden,
        draft_vocab_size=int(draft_vocab),
        hidden_layers=layers_from(block),
        num_heads=int(layer["num_attention_heads"]),
        num_kv_heads=int(layer.get("num_key_value_heads", layer["num_attention_heads"])),
        head_dim=int(layer.get("head_dim") or hidden // int(layer["num_attention_heads"])),
        intermediate_size=int(layer["intermediate_size"]),
        rope_theta=float(layer.get("rope_theta", 10000.0)),
        rms_norm_eps=float(layer.get("rms_norm_eps", 1e-6)),
        norm_before_residual=bool(
            top.get("norm_before_residual", layer.get("norm_before_residual", False))
        ),
        target=block.get("target", {}),
    )
    fields.update({k: block[k] for k in ("top_k", "depth", "total_tokens") if k in block})
    if layer.get("rope_scaling"):
        raise InvalidInputError(
            f"{folder} uses rope_scaling {layer['rope_scaling']}; specdec's EAGLE-3 layer has "
            "plain rotary positions"
        )
    config = Eagle3Config(**fields)
    check_weights(config, weights)
    return config, weights, notes


def read_specforge(folder) -> tuple[Eagle3Config, dict[str, np.ndarray], list[str]]:
    top = json.loads((Path(folder) / "config.json").read_text())

    def layers(block):
        if "hidden_layers" in block:
            return block["hidden_layers"]
        return (top.get("eagle_config") or {}).get(
            "eagle_aux_hidden_state_layer_ids"
        )  # SGLang: output-of-layer

    return _read(folder, top, top, "midlayer.", layers)


def read_speculators(folder) -> tuple[Eagle3Config, dict[str, np.ndarray], list[str]]:
    top = json.loads((Path(folder) / "config.json").read_text())

    def layers(block):
        if "hidden_layers" in block:
            return block["hidden_layers"]
        ids = top.get("eagle_aux_hidden_state_layer_ids")  # vLLM: input-of-layer
        return None if ids is None else [int(i) - 1 for i in ids]

    return _read(folder, top["transformer_layer_config"], top, "layers.0.", layers)


def detect_specforge(folder: Path, config: Mapping[str, Any]) -> bool:
    return (
        "draft_vocab_size" in config
        and int(config.get("num_hidden_layers", 0)) == 1
        and (config.get("architectures") in ([SPECFORGE_ARCHITECTURE], ["LlamaForCausalLM"]))
    )


def detect_speculators(folder: Path, config: Mapping[str, Any]) -> bool:
    return config.get("speculators_model_type") == "eagle3"
