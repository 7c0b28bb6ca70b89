"""Reading Medusa heads in the FasterDecoding and vLLM layouts (``specdec_medusa.export``
describes both): ``detect_*`` recognises a folder's layout, ``read_*`` turns it into specdec's
checkpoint (config, float64 weights, notes)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Mapping

import numpy as np
from safetensors.numpy import load_file

from specdec.errors import InvalidInputError
from specdec.models.files import read_json, read_torch_tensors
from specdec_medusa.config import MedusaConfig
from specdec_medusa.reference import check_weights
from specdec_medusa.export import (
    FD_WEIGHT_FILES,
    SPECDEC_KEY,
    chain_choices,
)

__all__ = ["detect_fasterdecoding", "detect_vllm", "read_fasterdecoding", "read_vllm"]


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


def detect_vllm(folder: Path, config: Mapping[str, Any]) -> bool:
    return config.get("model_type") == "medusa"


def detect_fasterdecoding(folder: Path, config: Mapping[str, Any]) -> bool:
    return not detect_vllm(folder, config) and any(
        (Path(folder) / name).is_file()
        for name in ("medusa_lm_head.safetensors", "medusa_lm_head.pt")
    )
