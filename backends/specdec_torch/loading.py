"""Load a ``TorchTarget`` from a local Hugging Face-format folder or a ``transformers`` model
object.

Folders go through ``AutoModelForCausalLM.from_pretrained``; the architecture (heads, rope
scaling, sliding window, eos ids) is parsed by the reference's ``LlamaConfig`` so both backends
read a config the same way. The fingerprint is the reference's: sha256 over the sorted names
of the stored tensors, their shapes and their float32 bytes, read from the folder's files
(from the module's state dict, tied LM head left out, for a model object).
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Any, Iterable

import torch
from safetensors import safe_open

from specdec.errors import InvalidInputError, require
from specdec.models.files import read_json
from specdec.models.hf_loading import from_pretrained_quietly
from specdec.models.llama import SUPPORTED_MODEL_TYPES, LlamaConfig, load_tokenizer
from specdec_torch.device import check_device, default_device
from specdec.reference.weights import check_weights_header
from specdec_torch.target import TorchTarget

__all__ = ["DTYPES", "default_device", "load_torch_target", "resolve_dtype", "tensor_fingerprint"]

DTYPES = {
    "float32": torch.float32,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
    "float64": torch.float64,
}


def resolve_dtype(dtype: str | torch.dtype | None, device: torch.device) -> torch.dtype:
    """A dtype name (or torch dtype) -> torch dtype; None: float32 on cpu, bfloat16 on cuda, float16
    on mps."""
    if dtype is None:
        return {"cuda": torch.bfloat16, "mps": torch.float16}.get(device.type, torch.float32)
    if isinstance(dtype, torch.dtype):
        if dtype not in DTYPES.values():
            raise InvalidInputError(
                f"dtype {dtype} is not supported by the torch backend; use one of {sorted(DTYPES)}"
            )
        return dtype
    if dtype not in DTYPES:
        raise InvalidInputError(
            f"unknown dtype {dtype!r} for the torch backend; use one of {sorted(DTYPES)}"
        )
    return DTYPES[dtype]


def tensor_fingerprint(named_tensors: Iterable[tuple[str, Any]]) -> str:
    """sha256 over (name, repr(shape), float32 little-endian bytes) in sorted name order."""
    digest = hashlib.sha256()
    for name, tensor in sorted(named_tensors, key=lambda item: item[0]):
        digest.update(name.encode())
        digest.update(repr(tuple(tensor.shape)).encode())
        digest.update(
            tensor.detach()
            .to(device="cpu", dtype=torch.float32)
            .contiguous()
            .numpy()
            .astype("<f4")
            .tobytes()
        )
    return digest.hexdigest()


def _folder_tensors(folder: Path):
    """(name, tensor) of every tensor stored in the folder's safetensors file(s)."""
    files = [folder / "model.safetensors"]
    if not files[0].is_file():
        index = read_json(folder / "model.safetensors.index.json", what="weights index")
        files = [folder / shard for shard in sorted(set(index.get("weight_map", {}).values()))]
    for file in files:
        with safe_open(str(file), framework="pt") as handle:
            for name in handle.keys():
                yield name, handle.get_tensor(name)


def _module_tensors(model: Any, tied: bool):
    """(name, tensor) of the module's state dict as ``save_pretrained`` would store it."""
    for name, tensor in model.state_dict().items():
        if tied and name == "lm_head.weight":
            continue
        yield name, tensor


def _check_family(model: Any) -> None:
    model_type = getattr(getattr(model, "config", None), "model_type", None)
    if (
        model_type not in SUPPORTED_MODEL_TYPES
        or not hasattr(model, "model")
        or not hasattr(model, "lm_head")
    ):
        raise InvalidInputError(
            f"the torch backend runs Llama-family causal LMs ({', '.join(SUPPORTED_MODEL_TYPES)}); "
            f"got {type(model).__name__} with model_type {model_type!r}"
        )


def _eos_ids(model: Any, config: LlamaConfig) -> tuple[int, ...]:
    if config.eos_token_ids:
        return config.eos_token_ids
    generation = getattr(model, "generation_config", None)
    eos = getattr(generation, "eos_token_id", None)
    if eos is None:
        return ()
    return tuple(int(t) for t in (eos if isinstance(eos, (list, tuple)) else [eos]))


def _from_folder(
    path: str | os.PathLike, dtype: torch.dtype, device: torch.device, **slots
) -> TorchTarget:
    transformers = require(
        "transformers", extra="torch", feature="the torch backend's model loading"
    )
    folder = Path(path)
    # clear errors for missing folders and unsupported models
    config = LlamaConfig.from_folder(folder)
    # the weights agree with config.json before a layer is built
    check_weights_header(folder, config)
    model = from_pretrained_quietly(transformers, str(folder), dtype=dtype)
    model = model.to(device).eval()
    return TorchTarget(
        model,
        config=config,
        fingerprint_fn=lambda: tensor_fingerprint(_folder_tensors(folder)),
        tokenizer=load_tokenizer(folder),
        name=folder.resolve().name,
        eos_token_ids=config.eos_token_ids,
        pack=True,
        **slots,
    )


def _from_module(
    model: Any, dtype: torch.dtype | None, device: torch.device | None, **slots
) -> TorchTarget:
    """Wrap a ``transformers`` model object; given a dtype or device it is moved there
    (in place)."""
    _check_family(model)
    generation = getattr(model, "generation_config", None)
    config = LlamaConfig.from_hf_dict(
        model.config.to_dict(), generation.to_dict() if generation is not None else None
    )
    if dtype is not None or device is not None:
        model.to(device=device, dtype=dtype)
    model.eval()
    tied = bool(config.tie_word_embeddings)
    name = Path(str(getattr(model.config, "_name_or_path", "") or type(model).__name__)).name
    return TorchTarget(
        model,
        config=config,
        fingerprint_fn=lambda: tensor_fingerprint(_module_tensors(model, tied)),
        name=name,
        eos_token_ids=_eos_ids(model, config),
        **slots,
    )


def load_torch_target(
    source: Any,
    *,
    dtype: str | torch.dtype | None = None,
    device: str | None = None,
    slots: int = 1,
    capacity: int | None = None,
) -> TorchTarget:
    """A TorchTarget from a model folder, a ``transformers`` model object or a TorchTarget.

    dtype: "float32" | "bfloat16" | "float16" | "float64" (None: float32 on cpu, bfloat16 on cuda,
    float16 on mps; a model object keeps its own). device: "cpu", "cuda", "mps", ... (None: the
    first available of cuda, mps, cpu; a model object stays where it is). slots, capacity: request
    slots and positions per slot of the KV cache (a TorchTarget keeps its own).
    """
    sized = dict(slots=slots, capacity=capacity)
    if isinstance(source, TorchTarget):
        wanted_dtype = None if dtype is None else resolve_dtype(dtype, source.device)
        wanted_device = None if device is None else check_device(device)
        other_device = wanted_device is not None and (
            wanted_device.type != source.device.type
            or wanted_device.index not in (None, source.device.index)
        )
        if wanted_dtype not in (None, source.dtype) or other_device:
            raise InvalidInputError(
                f"this target is loaded as {source.dtype} on {source.device}; load it again for "
                f"dtype={dtype!r}, device={device!r}"
            )
        return source
    if isinstance(source, torch.nn.Module):
        resolved_device = None if device is None else check_device(device)
        return _from_module(
            source,
            None if dtype is None else resolve_dtype(dtype, torch.device("cpu")),
            resolved_device,
            **sized,
        )
    if isinstance(source, (str, os.PathLike)):
        resolved_device = check_device(device) if device is not None else default_device()
        return _from_folder(source, resolve_dtype(dtype, resolved_device), resolved_device, **sized)
    raise InvalidInputError(
        "the torch backend loads a model folder, a transformers model or a TorchTarget; got "
        f"{type(source).__name__}"
    )
