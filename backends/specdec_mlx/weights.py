"""The weight files of a model folder, and the fingerprint of a model's tensors."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Any

import mlx.core as mx
import numpy as np
from mlx.utils import tree_flatten

from specdec.models.files import read_json

__all__ = ["fingerprint_of", "weight_files"]


def weight_files(folder: Path) -> list[Path]:
    """``model.safetensors``, or the shards that ``model.safetensors.index.json`` lists."""
    single = folder / "model.safetensors"
    if single.is_file():
        return [single]
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        return [
            folder / shard
            for shard in sorted(
                set(read_json(index, what="weights index").get("weight_map", {}).values())
            )
        ]
    raise FileNotFoundError(
        f"no weights in {str(folder)!r}: expected model.safetensors or an index of shards"
    )


def fingerprint_of(source: Any) -> str:
    """Hex sha256 over the sorted tensor names, their shapes and their float32 little-endian bytes.

    source: a model folder (its stored tensors, as the reference reads them) or an mlx module
    (its parameters under their mlx names, which are the Hugging Face names for llama/qwen2).
    """
    if isinstance(source, (str, os.PathLike)):
        tensors: dict[str, mx.array] = {}
        for file in weight_files(Path(source)):
            tensors.update(mx.load(str(file)))
    else:
        tensors = dict(tree_flatten(source.parameters()))
    digest = hashlib.sha256()
    for key in sorted(tensors):
        value = tensors[key]
        digest.update(key.encode())
        digest.update(repr(tuple(value.shape)).encode())
        digest.update(
            np.ascontiguousarray(np.array(value.astype(mx.float32)), dtype="<f4").tobytes()
        )
    return digest.hexdigest()
