"""The tensors a Llama-family config implies, checked against the weights' safetensors headers
before any backend builds a layer: a config.json whose layer count, sizes or flags disagree
with the weights (10^7 layers over a 2-layer file), or weights of a dtype no backend computes
with, are refused in the time it takes to read the headers, with the file and the fix named.

A folder whose config.json declares a quantization (``quantization`` for mlx-lm,
``quantization_config`` for transformers) stores packed weights and extra tensors: only its
layer count is checked.
"""

from __future__ import annotations

import json
import re
import struct
from pathlib import Path

from specdec.errors import InvalidInputError
from specdec.models.files import MAX_HEADER, read_json

# safetensors dtypes of weights that specdec computes with
FLOAT_DTYPES = (
    "F64",
    "F32",
    "F16",
    "BF16",
)
_LAYER = re.compile(r"model\.layers\.(\d+)\.")


def weight_files(folder: Path) -> list[Path]:
    """``model.safetensors``, or the shards its index lists; an error naming what is missing
    (pickled weights, such as ``pytorch_model.bin``, are never read)."""
    if (folder / "model.safetensors").is_file():
        return [folder / "model.safetensors"]
    index = folder / "model.safetensors.index.json"
    if not index.is_file():
        pickles = sorted(
            p.name for pattern in ("*.bin", "*.pt", "*.pth", "*.pkl") for p in folder.glob(pattern)
        )
        raise FileNotFoundError(
            f"no weights in {folder}: expected model.safetensors, or shards listed in "
            "model.safetensors.index.json"
            + (
                f" ({', '.join(pickles)} is pickled, which specdec never loads: save the weights "
                "as safetensors)"
                if pickles
                else ""
            )
        )
    weight_map = read_json(index, what="weights index").get("weight_map", {})
    if not isinstance(weight_map, dict):
        raise InvalidInputError(
            f"weights index {index} has a weight_map that is not an object; re-create the index"
        )
    names = sorted({str(s) for s in weight_map.values()})
    outside = [name for name in names if Path(name).name != name or name in ("", ".", "..")]
    if outside:
        raise InvalidInputError(
            f"weights index {index} names {outside[0]!r}, which is not a file of its folder: "
            "a shard must sit beside the index"
        )
    shards = [folder / shard for shard in names]
    missing = [shard for shard in shards if not shard.is_file()]
    if missing:
        raise InvalidInputError(
            f"shard {missing[0]} listed in {index} is missing; restore it or re-create the folder"
        )
    return shards


def read_headers(files: list[Path]) -> dict[str, tuple[str, tuple[int, ...], Path]]:
    """name -> (safetensors dtype, shape, file) of every tensor in ``files``, from their headers
    alone."""
    tensors = {}
    for path in files:
        try:
            with open(path, "rb") as handle:
                (size,) = struct.unpack("<Q", handle.read(8))
                if size > MAX_HEADER:
                    raise ValueError(f"a header of {size} bytes")
                header = json.loads(handle.read(size))
            for name, info in header.items():
                if name != "__metadata__":
                    tensors[name] = (str(info["dtype"]), tuple(int(n) for n in info["shape"]), path)
        except (OSError, ValueError, KeyError, TypeError, struct.error, RecursionError) as exc:
            raise InvalidInputError(
                f"weights file {path} has no readable safetensors header ({exc}); restore or "
                "re-create it"
            ) from None
    return tensors


def layer_shapes(config) -> dict[str, tuple[int, ...]]:
    """Suffix after ``model.layers.{i}.`` -> shape, for one decoder layer of ``config``."""
    hidden, inner = config.hidden_size, config.intermediate_size
    q_out = config.num_attention_heads * config.head_dim
    kv_out = config.num_key_value_heads * config.head_dim
    shapes = {
        "input_layernorm.weight": (hidden,),
        "post_attention_layernorm.weight": (hidden,),
        "self_attn.q_proj.weight": (q_out, hidden),
        "self_attn.k_proj.weight": (kv_out, hidden),
        "self_attn.v_proj.weight": (kv_out, hidden),
        "self_attn.o_proj.weight": (hidden, q_out),
        "mlp.gate_proj.weight": (inner, hidden),
        "mlp.up_proj.weight": (inner, hidden),
        "mlp.down_proj.weight": (hidden, inner),
    }
    if config.attention_bias:
        shapes.update(
            {
                "self_attn.q_proj.bias": (q_out,),
                "self_attn.k_proj.bias": (kv_out,),
                "self_attn.v_proj.bias": (kv_out,),
            }
        )
    if config.attention_out_bias:
        shapes["self_attn.o_proj.bias"] = (hidden,)
    if config.mlp_bias:
        shapes.update(
            {
                "mlp.gate_proj.bias": (inner,),
                "mlp.up_proj.bias": (inner,),
                "mlp.down_proj.bias": (hidden,),
            }
        )
    return shapes


def outer_shapes(config) -> dict[str, tuple[int, ...]]:
    """Name -> shape of the tensors outside the decoder layers."""
    shapes = {
        "model.embed_tokens.weight": (config.vocab_size, config.hidden_size),
        "model.norm.weight": (config.hidden_size,),
    }
    if not config.tie_word_embeddings:
        shapes["lm_head.weight"] = (config.vocab_size, config.hidden_size)
    return shapes


def check_weights_header(folder, config) -> None:
    """Refuse a model folder whose weights' headers disagree with ``config`` (a ``LlamaConfig``
    read from its config.json): the layer count, a missing tensor, a shape, or a dtype that is not
    a float one. Reads the headers only."""
    folder = Path(folder)
    tensors = read_headers(weight_files(folder))
    where = folder / "config.json"
    layers = sorted({int(m.group(1)) for name in tensors if (m := _LAYER.match(name))})
    if layers != list(range(config.num_hidden_layers)):
        held = (
            f"{len(layers)} (model.layers.0 to {len(layers) - 1})"
            if layers == list(range(len(layers)))
            else f"layers {_ranges(layers)}"
        )
        raise InvalidInputError(
            f"{where} says num_hidden_layers={config.num_hidden_layers}, but the weights hold "
            f"{held}: fix config.json to match the weights (or use the weights it was written for)"
        )
    settings = read_json(where, what="model config")
    if "quantization" in settings or "quantization_config" in settings:
        return  # packed weights: their shapes and dtypes are the quantizer's
    expected = dict(outer_shapes(config))
    per_layer = layer_shapes(config)
    for i in layers:
        expected.update(
            {f"model.layers.{i}.{suffix}": shape for suffix, shape in per_layer.items()}
        )
    for name, shape in expected.items():
        if name not in tensors:
            hint = " (or set tie_word_embeddings: true)" if name == "lm_head.weight" else ""
            raise InvalidInputError(
                f"the weights in {folder} lack tensor {name!r} of shape {shape}, which {where} "
                f"implies{hint}: fix config.json to match the weights (or use the weights it was "
                "written for)"
            )
        dtype, stored, path = tensors[name]
        if stored != shape:
            raise InvalidInputError(
                f"tensor {name!r} in {path} has shape {stored}, but {where} implies {shape} "
                f"(hidden_size={config.hidden_size}, intermediate_size={config.intermediate_size}, "
                f"heads {config.num_attention_heads}/{config.num_key_value_heads} of "
                f"{config.head_dim}, vocab_size={config.vocab_size}): fix config.json to match the "
                "weights"
            )
        if dtype not in FLOAT_DTYPES:
            raise InvalidInputError(
                f"tensor {name!r} in {path} is stored as {dtype}; specdec loads float weights "
                f"({', '.join(FLOAT_DTYPES)}): convert the checkpoint to float16 or bfloat16 first"
            )


def _ranges(values: list[int]) -> str:
    """[0, 1, 2, 5] -> '0-2, 5'."""
    parts, start = [], None
    for i, value in enumerate(values):
        if start is None:
            start = value
        if i + 1 == len(values) or values[i + 1] != value + 1:
            parts.append(str(start) if start == value else f"{start}-{value}")
            start = None
    return ", ".join(parts[:8]) + (", ..." if len(parts) > 8 else "")
