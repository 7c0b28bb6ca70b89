"""Loading mlx-lm targets: from a local Hugging Face-format folder (mlx-lm's own loader for the
model, ``tokenizers`` for tokenizer.json) or from an mlx-lm model object, and the weights
fingerprint computed exactly as ``specdec.reference.model.ReferenceTarget.fingerprint``.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Any


from specdec.errors import InvalidInputError
from specdec.models.llama import LlamaConfig, load_tokenizer
from specdec.reference.weights import check_weights_header
from specdec_mlx.target import MlxTarget

# (fingerprint_of: where it was)
from specdec_mlx.weights import fingerprint_of, weight_files  # noqa: F401


def load_target(source: Any, *, dtype, requested_dtype: str | None = None, **slots) -> MlxTarget:
    """An ``MlxTarget`` computing in ``dtype`` (an MLX dtype) from a folder path, an mlx-lm
    ``Model``, a ``(model, tokenizer)`` pair or an ``MlxTarget`` (returned unchanged; asking it
    for another dtype is an error). ``slots``: the ``slots`` / ``capacity`` of its KV cache."""
    if isinstance(source, MlxTarget):
        if requested_dtype is not None and source.dtype != dtype:
            raise InvalidInputError(
                f"this target was loaded in {source.dtype}; load it again with "
                f"dtype={requested_dtype!r}"
            )
        return source
    if isinstance(source, (str, os.PathLike)):
        return load_folder(source, dtype=dtype, **slots)
    model, tokenizer = source if isinstance(source, tuple) and len(source) == 2 else (source, None)
    return wrap_model(model, tokenizer, dtype=dtype, **slots)


def load_folder(path: str | os.PathLike, *, dtype, **slots) -> MlxTarget:
    """Load a local folder (config.json, model.safetensors or shards, optional tokenizer.json)."""
    from mlx_lm.utils import load_model  # optional: mlx_lm (mlx extra)

    folder = Path(path)
    config = LlamaConfig.from_folder(folder)  # checks the folder and the architecture
    # the weights agree with config.json before a layer is built
    check_weights_header(folder, config)
    model, _ = load_model(folder)
    model.set_dtype(dtype)
    return MlxTarget(
        model,
        config=config,
        dtype=dtype,
        tokenizer=load_tokenizer(folder),
        name=folder.resolve().name,
        fingerprint_source=folder,
        **slots,
    )


def wrap_model(model, tokenizer: Any = None, *, dtype, **slots) -> MlxTarget:
    """An mlx-lm llama / qwen2 / mistral ``Model`` object (its ``args`` give the config)."""
    args = getattr(model, "args", None)
    if args is None or not hasattr(model, "model") or not hasattr(model.model, "layers"):
        raise InvalidInputError(
            "the mlx backend loads a model folder path, an mlx-lm Model object or a (model, "
            f"tokenizer) pair; got {type(model).__name__}"
        )
    fields = dataclasses.asdict(args) if dataclasses.is_dataclass(args) else dict(vars(args))
    if fields.get("rope_traditional"):
        raise InvalidInputError(
            "models with rope_traditional=True are not supported (Llama-family models use "
            "rotate_half)"
        )
    eos = list(getattr(tokenizer, "eos_token_ids", None) or [])
    config = LlamaConfig.from_hf_dict(fields, {"eos_token_id": eos} if eos else None)
    model.set_dtype(dtype)
    return MlxTarget(
        model,
        config=config,
        dtype=dtype,
        tokenizer=as_tokenizers_tokenizer(tokenizer),
        name=str(fields.get("model_type", "mlx-model")),
        **slots,
    )


def as_tokenizers_tokenizer(tokenizer: Any):
    """A ``tokenizers.Tokenizer`` for this tokenizer (itself, or the backend of a fast Hugging
    Face tokenizer / mlx-lm ``TokenizerWrapper``), else None."""
    if tokenizer is None:
        return None
    if hasattr(tokenizer, "encode") and hasattr(tokenizer, "token_to_id"):
        return tokenizer
    return getattr(tokenizer, "backend_tokenizer", None)
