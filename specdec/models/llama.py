"""Read a local Hugging Face-format Llama-family folder: its config, weights and tokenizer.

A folder holds ``config.json``, ``model.safetensors`` (or shards listed in
``model.safetensors.index.json``), and optionally ``generation_config.json`` and
``tokenizer.json``. Weights of any stored float dtype (F64, F32, F16, BF16) become float64.
"""

from __future__ import annotations

import json
import math
import os
import struct
from pathlib import Path
from typing import Any, Mapping

import attrs
import numpy as np
from tokenizers import Tokenizer

from specdec.errors import CorruptFileError, InvalidInputError
from specdec.models.files import check_safetensors, read_json

SUPPORTED_MODEL_TYPES = ("llama", "qwen2", "mistral")

# Little-endian NumPy dtypes of the safetensors float types; BF16 is decoded by hand.
_STORED_DTYPES = {
    "F64": np.dtype("<f8"),
    "F32": np.dtype("<f4"),
    "F16": np.dtype("<f2"),
    "BF16": np.dtype("<u2"),
}


def _positive(instance, attribute, value):
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InvalidInputError(
            f"LlamaConfig.{attribute.name} must be a positive integer, got {value!r}"
        )


@attrs.frozen(kw_only=True)
class Llama3RopeScaling:
    """Llama 3.1 "llama3" rotary scaling: long wavelengths divided by ``factor``, a smooth blend
    between ``low_freq_factor`` and ``high_freq_factor``."""

    factor: float = attrs.field(converter=float)
    low_freq_factor: float = attrs.field(converter=float)
    high_freq_factor: float = attrs.field(converter=float)
    original_max_position_embeddings: int = attrs.field(converter=int)

    def __attrs_post_init__(self):
        if self.high_freq_factor <= self.low_freq_factor:
            raise InvalidInputError(
                f"llama3 rope_scaling needs high_freq_factor > low_freq_factor, got "
                f"{self.high_freq_factor} <= {self.low_freq_factor}"
            )


@attrs.frozen(kw_only=True)
class LlamaConfig:
    """The architecture of a Llama-family decoder (llama, qwen2, mistral).

    ``attention_bias``: q, k and v projections carry a bias (qwen2 always; llama when its
    ``attention_bias`` flag is set). ``attention_out_bias``: the o projection carries one too
    (llama's flag covers all four projections, qwen2 has none on o). ``sliding_window``: each
    query sees only keys at positions ``> position - sliding_window`` (mistral), None = no limit.
    ``eos_token_ids``: every id that ends a generation (generation_config.json wins over
    config.json).
    """

    model_type: str
    vocab_size: int = attrs.field(validator=_positive)
    hidden_size: int = attrs.field(validator=_positive)
    intermediate_size: int = attrs.field(validator=_positive)
    num_hidden_layers: int = attrs.field(validator=_positive)
    num_attention_heads: int = attrs.field(validator=_positive)
    num_key_value_heads: int = attrs.field(validator=_positive)
    head_dim: int = attrs.field(validator=_positive)
    rms_norm_eps: float = attrs.field(default=1e-6, converter=float)
    rope_theta: float = attrs.field(default=10000.0, converter=float)
    rope_scaling: Llama3RopeScaling | None = None
    tie_word_embeddings: bool = False
    attention_bias: bool = False
    attention_out_bias: bool = False
    mlp_bias: bool = False
    sliding_window: int | None = None
    max_position_embeddings: int = 4096
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = attrs.field(default=(), converter=tuple)

    def __attrs_post_init__(self):
        if self.model_type not in SUPPORTED_MODEL_TYPES:
            raise InvalidInputError(
                f"unsupported model_type {self.model_type!r}; the reference target supports "
                f"{', '.join(SUPPORTED_MODEL_TYPES)}"
            )
        if self.num_attention_heads % self.num_key_value_heads:
            raise InvalidInputError(
                f"num_attention_heads ({self.num_attention_heads}) must be a multiple of "
                f"num_key_value_heads ({self.num_key_value_heads})"
            )
        if self.head_dim % 2:
            raise InvalidInputError(
                f"head_dim must be even for rotary embeddings, got {self.head_dim}"
            )
        if self.sliding_window is not None and self.sliding_window < 1:
            raise InvalidInputError(
                f"sliding_window must be a positive integer or None, got {self.sliding_window}"
            )

    @classmethod
    def from_hf_dict(
        cls, config: Mapping[str, Any], generation_config: Mapping[str, Any] | None = None
    ) -> LlamaConfig:
        """Parse the contents of a Hugging Face ``config.json`` (and ``generation_config.json``)."""
        model_type = config.get("model_type")
        if model_type not in SUPPORTED_MODEL_TYPES:
            raise InvalidInputError(
                f"unsupported model_type {model_type!r} in config.json; the reference target "
                f"supports {', '.join(SUPPORTED_MODEL_TYPES)}"
            )
        missing = [
            key
            for key in (
                "vocab_size",
                "hidden_size",
                "intermediate_size",
                "num_hidden_layers",
                "num_attention_heads",
            )
            if key not in config
        ]
        if missing:
            raise InvalidInputError(
                f"config.json of a {model_type} model lacks {', '.join(missing)}"
            )
        hidden_act = config.get("hidden_act", "silu")
        if hidden_act != "silu":
            raise InvalidInputError(
                f"hidden_act {hidden_act!r} is not supported; Llama-family models use 'silu'"
            )
        if float(config.get("partial_rotary_factor", 1.0)) != 1.0:
            raise InvalidInputError(
                "partial_rotary_factor != 1 is not supported by the reference target"
            )
        heads = _integer(config, "num_attention_heads")
        head_dim = _integer(config, "head_dim", _integer(config, "hidden_size") // max(heads, 1))
        rope_theta, rope_scaling = _parse_rope(config)

        if model_type == "qwen2":
            attention_bias, attention_out_bias = True, False
            if config.get("use_sliding_window", False):
                raise InvalidInputError(
                    "qwen2 with use_sliding_window=true is not supported by the reference target; "
                    "set use_sliding_window to false (as released Qwen2/Qwen2.5 checkpoints do)"
                )
            sliding_window = None
        else:
            attention_bias = attention_out_bias = bool(config.get("attention_bias", False))
            sliding_window = config.get("sliding_window") if model_type == "mistral" else None

        generation_config = generation_config or {}
        eos = generation_config.get("eos_token_id")
        if eos is None:
            eos = config.get("eos_token_id")
        bos = generation_config.get("bos_token_id")
        if bos is None:
            bos = config.get("bos_token_id")
        return cls(
            model_type=model_type,
            vocab_size=_integer(config, "vocab_size"),
            hidden_size=_integer(config, "hidden_size"),
            intermediate_size=_integer(config, "intermediate_size"),
            num_hidden_layers=_integer(config, "num_hidden_layers"),
            num_attention_heads=heads,
            num_key_value_heads=_integer(config, "num_key_value_heads", heads),
            head_dim=int(head_dim),
            rms_norm_eps=config.get("rms_norm_eps", 1e-6),
            rope_theta=rope_theta,
            rope_scaling=rope_scaling,
            tie_word_embeddings=bool(config.get("tie_word_embeddings", False)),
            attention_bias=attention_bias,
            attention_out_bias=attention_out_bias,
            mlp_bias=bool(config.get("mlp_bias", False)),
            sliding_window=None if sliding_window is None else _integer(config, "sliding_window"),
            max_position_embeddings=_integer(config, "max_position_embeddings", 4096),
            bos_token_id=None if bos is None else _integer({"bos_token_id": bos}, "bos_token_id"),
            eos_token_ids=_token_ids(eos),
        )

    @classmethod
    def from_folder(cls, path: str | os.PathLike) -> LlamaConfig:
        """Read ``config.json`` and, when present, ``generation_config.json`` of a model folder."""
        folder = check_folder(path)
        config = read_json(folder / "config.json", what="model config")
        generation_path = folder / "generation_config.json"
        generation = (
            read_json(generation_path, what="generation config")
            if generation_path.is_file()
            else None
        )
        return cls.from_hf_dict(config, generation)


def _integer(config: Mapping[str, Any], key: str, default: int | None = None) -> int:
    """config[key] (or ``default`` when it is absent or null) as an int; an error naming the key
    when it is not an integer (a float such as 64.0 included: JSON writes integers without a
    point)."""
    value = config.get(key)
    if value is None and default is not None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise InvalidInputError(
            f"config.json: {key} must be an integer, got {value!r}; fix config.json"
        )
    return int(value)


def _token_ids(value) -> tuple[int, ...]:
    """An eos entry of a config (None, an int or a list of ints) as a tuple of ints; an error
    naming eos_token_id for anything else."""
    if value is None:
        return ()
    ids = list(value) if isinstance(value, (list, tuple)) else [value]
    if not all(
        isinstance(v, (int, np.integer)) and not isinstance(v, bool) and v >= 0 for v in ids
    ):
        raise InvalidInputError(
            f"config.json: eos_token_id must be a token id >= 0 or a list of them, got {value!r}; "
            "fix config.json"
        )
    return tuple(int(v) for v in ids)


def _parse_rope(config: Mapping[str, Any]) -> tuple[float, Llama3RopeScaling | None]:
    """rope_theta and the scaling, from the classic keys (``rope_theta``, ``rope_scaling``) or
    the newer ``rope_parameters`` dictionary."""
    parameters = config.get("rope_scaling") or config.get("rope_parameters") or {}
    theta = config.get("rope_theta", parameters.get("rope_theta", 10000.0))
    rope_type = parameters.get("rope_type", parameters.get("type", "default"))
    if rope_type == "default":
        return float(theta), None
    if rope_type != "llama3":
        raise InvalidInputError(
            f"rope scaling type {rope_type!r} is not supported by the reference target; supported: "
            "no scaling (null or 'default') and 'llama3'"
        )
    original = parameters.get(
        "original_max_position_embeddings", config.get("max_position_embeddings")
    )
    scaling = Llama3RopeScaling(
        factor=parameters["factor"],
        low_freq_factor=parameters["low_freq_factor"],
        high_freq_factor=parameters["high_freq_factor"],
        original_max_position_embeddings=original,
    )
    return float(theta), scaling


def check_folder(path: str | os.PathLike) -> Path:
    folder = Path(path)
    if not folder.is_dir():
        raise FileNotFoundError(
            f"model folder {str(folder)!r} does not exist; expected a Hugging Face-format folder "
            "with config.json and model.safetensors"
        )
    if not (folder / "config.json").is_file():
        raise FileNotFoundError(
            f"{str(folder / 'config.json')!r} not found; a model folder needs its config.json"
        )
    return folder


def read_safetensors(path: str | os.PathLike) -> dict[str, np.ndarray]:
    """Every tensor of one ``.safetensors`` file as a float64 array.

    The format is an 8-byte little-endian header length, a JSON header mapping each name to its
    dtype, shape and byte range, then the raw data. BF16 is the upper half of a float32, so its
    bits shifted left by 16 are the float32 with the same value.
    """
    path = Path(path)
    check_safetensors(path)
    with open(path, "rb") as f:
        (header_size,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(header_size))
    data = np.memmap(path, dtype=np.uint8, mode="r")
    data_start = 8 + header_size
    tensors = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        stored = info["dtype"]
        if stored not in _STORED_DTYPES:
            raise InvalidInputError(
                f"tensor {name!r} in {str(path)!r} is stored as {stored}; the reference loads only "
                f"float tensors ({', '.join(_STORED_DTYPES)})"
            )
        dtype, shape = _STORED_DTYPES[stored], tuple(info["shape"])
        start, end = info["data_offsets"]
        count = math.prod(shape)
        if end - start != count * dtype.itemsize:
            raise InvalidInputError(
                f"tensor {name!r} in {str(path)!r}: byte range does not match shape {shape} "
                f"{stored}"
            )
        values = np.frombuffer(data, dtype=dtype, count=count, offset=data_start + start)
        if stored == "BF16":
            values = (values.astype(np.uint32) << 16).view(np.float32)
        tensors[name] = values.astype(np.float64).reshape(shape)
    del data
    return tensors


def load_tensors(path: str | os.PathLike) -> dict[str, np.ndarray]:
    """All weights of a model folder as float64 arrays keyed by their Hugging Face names.

    Reads ``model.safetensors``, or the shards that ``model.safetensors.index.json`` lists.
    """
    folder = Path(path)
    single = folder / "model.safetensors"
    if single.is_file():
        return read_safetensors(single)
    index_path = folder / "model.safetensors.index.json"
    if index_path.is_file():
        weight_map = read_json(index_path, what="weights index").get("weight_map", {})
        tensors = {}
        for shard in sorted(set(weight_map.values())):
            shard_path = folder / shard
            if not shard_path.is_file():
                raise FileNotFoundError(
                    f"shard {str(shard_path)!r} listed in {str(index_path)!r} is missing"
                )
            tensors.update(read_safetensors(shard_path))
        return tensors
    raise FileNotFoundError(
        f"no weights in {str(folder)!r}: expected model.safetensors, or sharded "
        "model-0000x-of-0000y.safetensors files with model.safetensors.index.json"
    )


def load_tokenizer(path: str | os.PathLike):
    """The folder's ``tokenizer.json`` as a ``tokenizers.Tokenizer``, or None when there is none."""
    tokenizer_path = Path(path) / "tokenizer.json"
    if not tokenizer_path.is_file():
        return None
    try:
        return Tokenizer.from_file(str(tokenizer_path))
    except Exception as exc:  # noqa: BLE001
        # tokenizers raises a bare Exception for a file it cannot parse
        raise CorruptFileError(
            f"tokenizer {tokenizer_path} could not be read ({' '.join(str(exc).split())}); "
            "restore or re-create it, or remove it and pass token ids"
        ) from None
