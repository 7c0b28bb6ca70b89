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
target record) travel in a ``specdec`` entry of ``config.json``, which the engines ignore.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, Mapping

import numpy as np
from safetensors.numpy import load_file, save_file

from specdec.errors import InvalidInputError
from specdec.models.files import read_json, read_torch_tensors, readable
from specdec_medusa.config import MedusaConfig
from specdec_medusa.reference import check_weights

__all__ = [
    "FD_WEIGHT_FILES",
    "chain_choices",
    "export_fasterdecoding",
    "export_vllm",
    "fasterdecoding_names",
    "medusa_choices_arg",
    "read_fasterdecoding",
    "read_vllm",
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


# ---------------------------------------------------------------- import


def _load_any(path: Path) -> dict[str, np.ndarray]:
    if path.suffix == ".safetensors":
        return dict(load_file(str(path)))
    state = read_torch_tensors(path)  # torch's safe unpickler only
    return {name: tensor.float().numpy() for name, tensor in state.items()}


def _finish(
    folder: Path,
    raw: dict,
    num_heads: int,
    num_layers: int,
    blocks: dict,
    projections: dict,
    *,
    vocab_size: int | None,
    notes: list[str],
) -> tuple[MedusaConfig, dict[str, np.ndarray], list[str]]:
    """Build (config, weights) from blocks {(k, j): (weight, bias)} and projections {k: (V, H)}."""
    extra = dict(raw.get(SPECDEC_KEY) or {})
    hidden = (
        int(next(iter(blocks.values()))[0].shape[0]) if blocks else int(raw.get("hidden_size", 0))
    )
    if projections and len(projections) != num_heads:
        raise InvalidInputError(
            f"{folder}: {len(projections)} head projections for {num_heads} heads"
        )
    head = "full" if projections else "tied"
    if projections:
        vocab_size = int(next(iter(projections.values())).shape[0])
        if extra.get("head") == "tied":
            first = projections[0]
            if not all(np.array_equal(first, p) for p in projections.values()):
                raise InvalidInputError(
                    f"{folder}: the specdec entry says the heads share the target's LM head, "
                    "but the stored projections differ"
                )
            head = "tied"
    if vocab_size is None:
        raise InvalidInputError(
            f"{folder} holds Medusa-2 heads (blocks only: they end with the target's LM head) and "
            "its config.json does not record vocab_size: add \"vocab_size\" (the target's) to "
            "config.json"
        )
    fields: dict[str, Any] = dict(
        vocab_size=vocab_size,
        hidden_size=hidden,
        num_heads=num_heads,
        num_layers=num_layers,
        head=head,
    )
    for key in ("top_t", "choices", "target"):
        if key in extra:
            fields[key] = extra[key]
    if "choices" not in fields and num_heads < 4:
        fields["choices"] = chain_choices(num_heads)  # the default preset needs 4 heads
    config = MedusaConfig(**fields)
    weights: dict[str, np.ndarray] = {}
    for (k, j), (weight, bias) in blocks.items():
        weights[f"medusa_head.{k}.{j}.linear.weight"] = np.asarray(weight, dtype=np.float64)
        weights[f"medusa_head.{k}.{j}.linear.bias"] = (
            np.zeros(hidden) if bias is None else np.asarray(bias, dtype=np.float64)
        )
    if head == "full":
        for k, projection in projections.items():
            weights[f"medusa_head.{k}.{num_layers}.weight"] = np.asarray(
                projection, dtype=np.float64
            )
    check_weights(config, weights)
    return config, weights, notes


def _indices(names, pattern: str) -> dict:
    found = {}
    for name in names:
        match = re.fullmatch(pattern, name)
        if match:
            found[tuple(int(g) for g in match.groups())] = name
    return found


def read_fasterdecoding(folder) -> tuple[MedusaConfig, dict[str, np.ndarray], list[str]]:
    """A FasterDecoding heads folder (``medusa_lm_head.safetensors`` or ``.pt`` + ``config.json``).

    The number of heads and layers comes from the tensors (published configs sometimes say fewer
    heads than the file holds; a note says so). Without per-head projections (Medusa-2) the heads
    end with the target's LM head (``head="tied"``)."""
    folder = Path(folder)
    raw = (
        read_json(folder / "config.json", what="drafter config")
        if (folder / "config.json").is_file()
        else {}
    )
    files = [folder / name for name in FD_WEIGHT_FILES if (folder / name).is_file()]
    if not files:
        raise InvalidInputError(f"{folder} holds no {' or '.join(FD_WEIGHT_FILES)}")
    tensors = _load_any(files[0])
    tensors = {name.removeprefix("medusa_head."): array for name, array in tensors.items()}
    weights_idx = _indices(tensors, r"(\d+)\.(\d+)\.linear\.weight")
    if not weights_idx:
        raise InvalidInputError(f"{files[0]} holds no Medusa blocks ({{k}}.{{j}}.linear.weight)")
    num_heads = max(k for k, _ in weights_idx) + 1
    num_layers = max(j for _, j in weights_idx) + 1
    notes: list[str] = []
    if raw.get("medusa_num_heads") not in (None, num_heads):
        notes.append(
            f"config.json says medusa_num_heads={raw['medusa_num_heads']}, the file holds "
            f"{num_heads} heads: the file was followed"
        )
    blocks = {
        (k, j): (tensors[f"{k}.{j}.linear.weight"], tensors.get(f"{k}.{j}.linear.bias"))
        for k in range(num_heads)
        for j in range(num_layers)
    }
    projections = {
        k: tensors[f"{k}.{num_layers}.weight"]
        for k in range(num_heads)
        if f"{k}.{num_layers}.weight" in tensors
    }
    known = {
        f"{k}.{j}.linear.{p}"
        for k in range(num_heads)
        for j in range(num_layers)
        for p in ("weight", "bias")
    }
    known |= {f"{k}.{num_layers}.weight" for k in range(num_heads)}
    unexpected = sorted(set(tensors) - known)
    if unexpected:
        raise InvalidInputError(
            f"{files[0]} holds tensors a Medusa head does not have: {unexpected[:8]}"
        )
    vocab = raw.get("vocab_size")
    return _finish(
        folder,
        raw,
        num_heads,
        num_layers,
        blocks,
        projections,
        vocab_size=None if vocab is None else int(vocab),
        notes=notes,
    )


def read_vllm(folder) -> tuple[MedusaConfig, dict[str, np.ndarray], list[str]]:
    """A vLLM Medusa folder (``model_type: "medusa"``)."""
    folder = Path(folder)
    raw = read_json(folder / "config.json", what="drafter config")
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise InvalidInputError(f"{folder} has a vLLM Medusa config.json but no .safetensors file")
    tensors: dict[str, np.ndarray] = {}
    for path in files:
        tensors.update(
            {
                name.replace("medusa_heads.", ""): array
                for name, array in load_file(str(path)).items()
            }
        )
    if "token_map" in tensors or int(
        raw.get("truncated_vocab_size") or raw.get("vocab_size", 0)
    ) != int(raw.get("vocab_size", 0)):
        raise InvalidInputError(
            f"{folder} drafts a truncated vocabulary (token_map / truncated_vocab_size), which "
            "specdec's Medusa does not have: expand the heads to the full vocabulary before "
            "importing"
        )
    num_heads = int(raw.get("num_heads", 0))
    num_layers = int(raw.get("num_hidden_layers", 1))
    blocks = {}
    for k in range(num_heads):
        for j in range(num_layers):
            name = f"blocks.{k}.layers.{j}"
            if f"{name}.weight" not in tensors:
                raise InvalidInputError(
                    f"{folder} lacks {name}.weight for num_heads={num_heads}, "
                    f"num_hidden_layers={num_layers}"
                )
            bias = tensors.get(f"{name}.bias") if raw.get("medusa_fc_bias") else None
            blocks[(k, j)] = (tensors[f"{name}.weight"], bias)
    notes: list[str] = []
    if not raw.get("medusa_fc_bias") and any(name.endswith(".bias") for name in tensors):
        notes.append(
            "the file holds block biases but config.json lacks medusa_fc_bias, so vLLM ignores "
            "them; they were ignored here too, as vLLM runs the heads"
        )
    if raw.get("original_lm_head"):
        shared = tensors.get("lm_head.weight", tensors.get("lm_heads.0.weight"))
        if shared is None:
            raise InvalidInputError(
                f"{folder}: original_lm_head is set but lm_head.weight is missing"
            )
        projections = {k: shared for k in range(num_heads)}
    else:
        projections = {
            k: tensors[f"lm_heads.{k}.weight"]
            for k in range(num_heads)
            if f"lm_heads.{k}.weight" in tensors
        }
        if len(projections) != num_heads:
            raise InvalidInputError(
                f"{folder} lacks lm_heads.{{k}}.weight for some of its {num_heads} heads"
            )
    return _finish(
        folder,
        raw,
        num_heads,
        num_layers,
        blocks,
        projections,
        vocab_size=int(raw["vocab_size"]),
        notes=notes,
    )


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


def detect_vllm(folder: Path, config: Mapping[str, Any]) -> bool:
    return config.get("model_type") == "medusa"


def detect_fasterdecoding(folder: Path, config: Mapping[str, Any]) -> bool:
    return not detect_vllm(folder, config) and any(
        (Path(folder) / name).is_file()
        for name in ("medusa_lm_head.safetensors", "medusa_lm_head.pt")
    )
