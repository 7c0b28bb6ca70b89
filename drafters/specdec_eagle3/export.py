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
convention (ours + 1), tensors as above with ``midlayer.`` renamed ``layers.0.``;
``speculators_config.verifier.name_or_path`` names the target as vLLM resolves it
(``verifier_name``: a bundled model's hub id, or the ``model`` given).

Both layouts may carry two optional tensors, read and written as the authors' trainers save them
(vLLM speculators' ``Eagle3DraftModel`` saves everything but the verifier's norm and LM head):
``embed_tokens.weight`` (V, H), the head's own token embedding, which it then drafts with instead
of the target's; ``input_norm.weight`` (3H,) with ``norm_before_fc: true``, one RMSNorm over the
fused layers before ``fc``. A mismatch between the tensors and ``config.json`` is named in the
file's own keys.

Both keep a ``specdec`` block (the tree settings and the target record) so an export read back
is our checkpoint exactly. What a layout cannot hold is refused with the fix. This module writes
the two layouts; ``specdec_eagle3.export_read`` recognises and reads them.
"""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path
from typing import Any, Mapping

import numpy as np
from safetensors.numpy import save_file

from specdec.errors import InvalidInputError
from specdec.models.bundled import BUNDLED
from specdec.models.files import read_json, readable
from specdec_eagle3.config import (
    Eagle3Config,
    check_weights,
    default_hidden_layers,
    draft_to_target,
)

__all__ = ["no_options", "verifier_name", "write_specforge", "write_speculators"]

DTYPES = {"float32": np.float32, "float16": np.float16}
SPECFORGE_ARCHITECTURE = "LlamaForCausalLMEagle3"
SPECULATORS_ARCHITECTURE = "Eagle3Speculator"
UNSUPPORTED_FLAGS = ("fc_norm", "norm_output")  # EAGLE-3.1 variants
# saved by some trainers beside the head (the verifier's final norm and LM head), read by no engine
VERIFIER_TENSORS = ("verifier_norm.weight", "verifier_lm_head.weight")


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
    folder.mkdir(parents=True, exist_ok=True)
    save_file(arrays, str(folder / "model.safetensors"), metadata={"format": "pt"})
    readable(folder / "model.safetensors")
    (folder / "config.json").write_text(json.dumps(config_json, indent=2) + "\n")


def no_options(choices, drop_shortlist) -> None:
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
    model=None,
):
    """The EAGLE / SpecForge layout (SGLang, TensorRT-LLM) -> (notes, the ``sglang`` command).
    model: the target as the caller named it (or None), for the command (``verifier_name``)."""
    no_options(choices, drop_shortlist)
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
    if config.norm_before_fc:
        data["norm_before_fc"] = True  # SGLang's EAGLE-3 model reads it (input_norm.weight)
    notes = ["t2d written from d2t (a mask over the target vocabulary)", _embedding_note(config)]
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
    target = _command_target(config, model, notes)
    return notes, (
        f"python -m sglang.launch_server --model-path {target} --speculative-algorithm "
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
    model=None,
):
    """vLLM's speculators layout -> (notes, the ``vllm serve`` command). model: the target as the
    caller named it (or None), for ``verifier.name_or_path`` (``verifier_name``)."""
    no_options(choices, drop_shortlist)
    if config.hidden_layers is None:
        raise InvalidInputError(
            "this EAGLE-3 head names no fused layers (loaded for a target, it fuses that "
            "target's default three), and the speculators layout records them: give them in its "
            "config.json (hidden_layers in a specdec checkpoint, "
            "eagle_config.eagle_aux_hidden_state_layer_ids in the SpecForge layout; 0-based "
            "output-of-layer ids, by default (1, L//2 - 1, L - 4) for L decoder layers) and "
            "export again"
        )
    verifier, verifier_note = verifier_name(config, model)
    data = {
        "architectures": [SPECULATORS_ARCHITECTURE],
        "speculators_model_type": "eagle3",
        "transformer_layer_config": _llama_config(config),
        "draft_vocab_size": config.draft_vocab_size,
        "norm_before_residual": config.norm_before_residual,
        "norm_before_fc": config.norm_before_fc,
        "target_hidden_size": config.hidden_size,
        "eagle_aux_hidden_state_layer_ids": [i + 1 for i in config.hidden_layers],
        "speculators_config": {
            "algorithm": "eagle3",
            "default_proposal_method": "greedy",
            "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": config.depth}],
            "verifier": {
                "name_or_path": verifier,
                "architectures": ["LlamaForCausalLM"],
            },
        },
        "specdec": _specdec_block(config),
    }
    _save(Path(out), _tensors(config, weights, dtype, "layers.0."), data)
    notes = [
        "eagle_aux_hidden_state_layer_ids in vLLM's input-of-layer convention (specdec's ids + 1)",
        "vLLM drafts a chain of num_speculative_tokens, not the dynamic tree",
        _embedding_note(config),
        verifier_note,
    ]
    if config.norm_before_fc:
        notes.append(
            "norm_before_fc with input_norm.weight: a vLLM release that reads neither refuses "
            "the tensor"
        )
    spec = json.dumps(
        {"method": "eagle3", "model": str(out), "num_speculative_tokens": config.depth}
    )
    target = _command_target(config, model, notes)
    return [note for note in notes if note], (f"vllm serve {target} --speculative-config '{spec}'",)


def _command_target(config: Eagle3Config, model, notes: list) -> str:
    """The target as the printed engine command names it: its hub id or folder where known
    (``verifier_name``), else TARGET_HF_FOLDER with a note saying what goes there."""
    if model is not None or config.target.get("name") in BUNDLED:
        return shlex.quote(verifier_name(config, model)[0])
    notes.append(
        "TARGET_HF_FOLDER in the command: the target's Hugging Face folder or hub id (export with "
        "--model to have it written)"
    )
    return "TARGET_HF_FOLDER"


def _embedding_note(config: Eagle3Config) -> str:
    if config.own_embedding:
        return "embed_tokens.weight written: the head drafts with its own token embedding"
    return "no embed_tokens.weight: the head drafts with the target's token embedding"


HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[A-Za-z0-9][\w.-]*")


def _hub_id(text) -> str | None:
    """``text`` when it reads as a Hugging Face hub id ("org/name") and names no local path."""
    if isinstance(text, str) and HUB_ID.fullmatch(text) and not Path(text).exists():
        return text
    return None


def verifier_name(config: Eagle3Config, model=None) -> tuple[str | None, str | None]:
    """(what the speculators config's ``verifier.name_or_path`` says, a note or None): what vLLM
    can resolve to the target. From ``model`` when given: a bundled model's public hub id, a hub
    id as given, or a folder's own ``_name_or_path`` when it reads as a hub id, else the folder's
    absolute path. Without it, from the name recorded at training: a bundled model's hub id, else
    that name with a note saying to pass the target."""
    bundled = {name: spec.hub_id for name, spec in BUNDLED.items() if spec.hub_id}
    if model is not None:
        text = str(model)
        path = Path(text).expanduser()
        if text in bundled or (path.is_dir() and path.resolve().name in bundled):
            return bundled.get(text) or bundled[path.resolve().name], None
        if _hub_id(text):
            return text, None
        if path.is_dir() and (path / "config.json").is_file():
            own = read_json(path / "config.json", what="model config")
            own = own.get("_name_or_path") if isinstance(own, dict) else None
            if _hub_id(own):
                return own, None
        return str(path.resolve()), None
    name = config.target.get("name")
    if name in bundled:
        return bundled[name], None
    return name, (
        f"verifier.name_or_path is {name!r}, the folder name the head was trained on, which vLLM "
        "may not resolve: export with model= (--model: the target's folder, bundled name or hub "
        "id) to write its hub id or path"
    )
