"""Medusa heads in the layouts serving engines load.

``fasterdecoding``: FasterDecoding/Medusa's heads file, read by TensorRT-LLM's
``examples/medusa/convert_checkpoint.py`` (``tensorrt_llm/models/medusa/weight.py``,
``load_medusa_hf``: ``medusa_lm_head.pt``, else ``medusa_lm_head.safetensors``). Each head is
``nn.Sequential(ResBlock x num_layers, Linear(H, V, bias=False))`` saved without a prefix:

| name | shape |
|---|---|
| ``{k}.{j}.linear.weight``, ``{k}.{j}.linear.bias`` | (H, H), (H,) |
| ``{k}.{num_layers}.weight`` | (V, H) |

and ``config.json`` holds ``medusa_num_heads``, ``medusa_num_layers``, ``base_model_name_or_path``.

``vllm``: vLLM's Medusa model (``vllm/model_executor/models/medusa.py`` with the config class
``vllm/transformers_utils/configs/medusa.py``): ``config.json`` with ``model_type = "medusa"``,
``architectures = ["MedusaModel"]``, ``hidden_size``, ``vocab_size``, ``num_heads``,
``num_hidden_layers``, ``medusa_fc_bias`` (without it vLLM builds bias-free blocks and skips the
biases without a word), ``truncated_vocab_size``; ``model.safetensors`` with

| name | shape | present when |
|---|---|---|
| ``blocks.{k}.layers.{j}.weight``, ``.bias`` | (H, H), (H,) | bias with ``medusa_fc_bias`` |
| ``lm_heads.{k}.weight`` | (V, H) | each head its own projection |
| ``lm_head.weight`` | (V, H) | ``original_lm_head: true``: one projection shared by all heads |

A tied head (``head="tied"``) is exported exactly: its projection *is* the target's LM head, so
the export copies that matrix (per head for FasterDecoding/TensorRT-LLM, once with
``original_lm_head`` for vLLM). The fields the layouts lack (``head``, ``top_t``, ``choices``, the
target record) travel in a ``specdec`` entry of ``config.json``, which the engines ignore. This
module writes both layouts; ``specdec_medusa.export_read`` recognises and reads them.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Mapping

import numpy as np
from safetensors.numpy import save_file

from specdec.errors import InvalidInputError
from specdec.models.files import readable
from specdec_medusa.config import MedusaConfig
from specdec_medusa.reference import check_weights

__all__ = [
    "FD_WEIGHT_FILES",
    "chain_choices",
    "export_fasterdecoding",
    "export_vllm",
    "fasterdecoding_names",
    "medusa_choices_arg",
    "write_fasterdecoding",
    "write_vllm",
    "vllm_names",
]

SPECDEC_KEY = "specdec"
FD_WEIGHT_FILES = ("medusa_lm_head.safetensors", "medusa_lm_head.pt")
VLLM_MODEL_TYPE = "medusa"
FASTERDECODING_TOPK = 10  # medusa/model/utils.py: TOPK, the ranks its sparse tree can use
DTYPES = {"float32": np.float32, "float16": np.float16}


def chain_choices(num_heads: int) -> tuple[tuple[int, ...], ...]:
    """The tree vLLM drafts: each head's argmax, one chain as deep as there are heads."""
    return tuple((0,) * depth for depth in range(1, num_heads + 1))


def medusa_choices_arg(config: MedusaConfig) -> str:
    """``config``'s tree as TensorRT-LLM's ``--medusa_choices`` (a list of lists of ranks)."""
    return json.dumps([list(path) for path in config.resolved_choices])


def fasterdecoding_names(
    num_heads: int, num_layers: int, vocab_size: int, hidden_size: int
) -> dict[str, tuple]:
    shapes: dict[str, tuple] = {}
    for k in range(num_heads):
        for j in range(num_layers):
            shapes[f"{k}.{j}.linear.weight"] = (hidden_size, hidden_size)
            shapes[f"{k}.{j}.linear.bias"] = (hidden_size,)
        shapes[f"{k}.{num_layers}.weight"] = (vocab_size, hidden_size)
    return shapes


def vllm_names(
    num_heads: int, num_layers: int, vocab_size: int, hidden_size: int, *, shared: bool
) -> dict[str, tuple]:
    shapes: dict[str, tuple] = {}
    for k in range(num_heads):
        for j in range(num_layers):
            shapes[f"blocks.{k}.layers.{j}.weight"] = (hidden_size, hidden_size)
            shapes[f"blocks.{k}.layers.{j}.bias"] = (hidden_size,)
        if not shared:
            shapes[f"lm_heads.{k}.weight"] = (vocab_size, hidden_size)
    if shared:
        shapes["lm_head.weight"] = (vocab_size, hidden_size)
    return shapes


def _projection(config: MedusaConfig, weights, k: int, lm_head) -> np.ndarray:
    if config.head == "full":
        return np.asarray(weights[f"medusa_head.{k}.{config.num_layers}.weight"])
    if lm_head is None:
        raise InvalidInputError(
            "these Medusa heads end with the target's LM head (head='tied'); the exported layouts "
            "store that projection, so the export needs the target: pass model= (`--model`, the "
            "target folder or bundled name)"
        )
    lm_head = np.asarray(lm_head)
    if lm_head.shape != (config.vocab_size, config.hidden_size):
        raise InvalidInputError(
            f"the target's LM head has shape {lm_head.shape}, expected "
            f"(vocab_size, hidden_size) = {(config.vocab_size, config.hidden_size)}"
        )
    return lm_head


def _specdec_entry(config: MedusaConfig, choices) -> dict[str, Any]:
    data = config.to_dict()
    entry = {key: data[key] for key in ("head", "top_t", "choices", "target")}
    if choices is not None:
        entry["choices"] = [list(path) for path in choices]
    return entry


def _resolve_choices(config: MedusaConfig, choices) -> MedusaConfig:
    if choices is None:
        return config
    data = config.to_dict()
    data["choices"] = chain_choices(config.num_heads) if choices == "chain" else choices
    return MedusaConfig.from_dict(data)


def _save(folder: Path, arrays: dict, config_json: dict, filename: str, dtype: str) -> Path:
    if dtype not in DTYPES:
        raise InvalidInputError(f"dtype must be one of {sorted(DTYPES)}, got {dtype!r}")
    folder.mkdir(parents=True, exist_ok=True)
    arrays = {
        name: np.ascontiguousarray(array, dtype=DTYPES[dtype]) for name, array in arrays.items()
    }
    save_file(arrays, str(folder / filename), metadata={"format": "pt"})
    readable(folder / filename)
    (folder / "config.json").write_text(json.dumps(config_json, indent=2) + "\n")
    return folder


def export_fasterdecoding(
    config: MedusaConfig,
    weights: Mapping[str, np.ndarray],
    out,
    *,
    lm_head=None,
    choices=None,
    dtype: str = "float32",
) -> tuple[Path, list[str]]:
    """FasterDecoding's ``medusa_lm_head.safetensors`` + ``config.json`` (TensorRT-LLM reads it).

    choices: None (keep the drafter's tree), "chain" or an explicit list, recorded for import and
    in the TensorRT-LLM command. -> (folder, notes)."""
    check_weights(config, weights)
    config = _resolve_choices(config, choices)
    notes: list[str] = []
    max_rank = max(max(path) for path in config.resolved_choices)
    if max_rank >= FASTERDECODING_TOPK:
        notes.append(
            f"the tree uses rank {max_rank}; FasterDecoding's own generate() builds trees from the "
            f"top {FASTERDECODING_TOPK} tokens of each head only (TensorRT-LLM has no such limit)"
        )
    if config.num_layers > 1:
        notes.append(
            "FasterDecoding's own MedusaModel builds a head's blocks as [ResBlock] * num_layers, "
            "one module repeated, so it loads the last block into all of them; TensorRT-LLM and "
            "vLLM keep them apart"
        )
    arrays: dict[str, np.ndarray] = {}
    for k in range(config.num_heads):
        for j in range(config.num_layers):
            for part in ("weight", "bias"):
                arrays[f"{k}.{j}.linear.{part}"] = weights[f"medusa_head.{k}.{j}.linear.{part}"]
        arrays[f"{k}.{config.num_layers}.weight"] = _projection(config, weights, k, lm_head)
    if config.head == "tied":
        notes.append(
            "the tied head was exported as a copy of the target's LM head in every head "
            "(TensorRT-LLM reads one projection per head)"
        )
    target_name = config.target.get("name") or ""
    config_json = {
        "medusa_num_heads": config.num_heads,
        "medusa_num_layers": config.num_layers,
        "base_model_name_or_path": target_name,
        "hidden_size": config.hidden_size,
        "vocab_size": config.vocab_size,
        SPECDEC_KEY: _specdec_entry(config, None),
    }
    folder = _save(Path(out), arrays, config_json, FD_WEIGHT_FILES[0], dtype)
    return folder, notes


def export_vllm(
    config: MedusaConfig,
    weights: Mapping[str, np.ndarray],
    out,
    *,
    lm_head=None,
    choices=None,
    dtype: str = "float32",
) -> tuple[Path, list[str]]:
    """vLLM's Medusa layout. vLLM drafts each head's argmax as one chain (``chain_choices``), so a
    drafter whose tree is anything else is refused unless ``choices="chain"`` (which records the
    chain for import). -> (folder, notes)."""
    check_weights(config, weights)
    config = _resolve_choices(config, choices)
    chain = chain_choices(config.num_heads)
    if tuple(config.resolved_choices) != chain:
        raise InvalidInputError(
            f"vLLM drafts one chain with the argmax of each of the {config.num_heads} heads, not "
            f"this drafter's tree of {len(config.resolved_choices)} nodes ({config.choices!r}): "
            "pass choices='chain' (`--medusa-choices chain`) to export it for the chain vLLM runs "
            "(specdec then drafts that chain too), or use the 'fasterdecoding' format for "
            "TensorRT-LLM, which takes a tree (--medusa_choices)"
        )
    shared = config.head == "tied"
    arrays: dict[str, np.ndarray] = {}
    for k in range(config.num_heads):
        for j in range(config.num_layers):
            arrays[f"blocks.{k}.layers.{j}.weight"] = weights[f"medusa_head.{k}.{j}.linear.weight"]
            arrays[f"blocks.{k}.layers.{j}.bias"] = weights[f"medusa_head.{k}.{j}.linear.bias"]
        if not shared:
            arrays[f"lm_heads.{k}.weight"] = _projection(config, weights, k, lm_head)
    notes: list[str] = []
    if shared:
        arrays["lm_head.weight"] = _projection(config, weights, 0, lm_head)
        notes.append(
            "the tied head was exported as one copy of the target's LM head (original_lm_head: "
            "true)"
        )
    config_json = {
        "architectures": ["MedusaModel"],
        "model_type": VLLM_MODEL_TYPE,
        "hidden_size": config.hidden_size,
        "vocab_size": config.vocab_size,
        "num_heads": config.num_heads,
        "num_hidden_layers": config.num_layers,
        "medusa_fc_bias": True,
        "original_lm_head": shared,
        "truncated_vocab_size": config.vocab_size,
        SPECDEC_KEY: _specdec_entry(config, None),
    }
    folder = _save(Path(out), arrays, config_json, "model.safetensors", dtype)
    return folder, notes


def _no_shortlist(drop_shortlist: bool) -> None:
    if drop_shortlist:
        raise InvalidInputError(
            "drop_shortlist applies to ReDrafter; Medusa heads have no shortlist"
        )


def write_fasterdecoding(
    config: MedusaConfig,
    weights: Mapping[str, np.ndarray],
    out,
    *,
    lm_head=None,
    dtype: str = "float32",
    choices=None,
    drop_shortlist: bool = False,
):
    """``export_fasterdecoding`` as the spec's layout writer: (notes, the TensorRT-LLM commands)."""
    _no_shortlist(drop_shortlist)
    _, notes = export_fasterdecoding(
        config, weights, out, lm_head=lm_head, choices=choices, dtype=dtype
    )
    exported = _resolve_choices(config, choices)
    nodes = len(exported.resolved_choices)
    return notes, (
        "python examples/medusa/convert_checkpoint.py --model_dir TARGET_HF_FOLDER "
        f"--medusa_model_dir {out} --output_dir tllm_medusa --dtype float16 "
        f"--num_medusa_heads {exported.num_heads} --num_medusa_layers {exported.num_layers} "
        f"--max_medusa_token_len {max(nodes, 1)}",
        "trtllm-build --checkpoint_dir tllm_medusa --output_dir engine_medusa --gemm_plugin "
        "float16 --speculative_decoding_mode medusa --max_batch_size 4",
        f"python examples/run.py --engine_dir engine_medusa --tokenizer_dir TARGET_HF_FOLDER "
        f"--medusa_choices='{medusa_choices_arg(exported)}' --temperature 0.0 --input_text 'Once "
        "upon'",
    )


def write_vllm(
    config: MedusaConfig,
    weights: Mapping[str, np.ndarray],
    out,
    *,
    lm_head=None,
    dtype: str = "float32",
    choices=None,
    drop_shortlist: bool = False,
):
    """``export_vllm`` as the spec's layout writer: (notes, the ``vllm serve`` command)."""
    _no_shortlist(drop_shortlist)
    _, notes = export_vllm(config, weights, out, lm_head=lm_head, choices=choices, dtype=dtype)
    spec = json.dumps(
        {"method": "medusa", "model": str(out), "num_speculative_tokens": config.num_heads}
    )
    return notes, (f"vllm serve TARGET_HF_FOLDER --speculative-config '{spec}'",)
