"""EAGLE-3 as the GGUF file llama.cpp loads (``specdec export --format gguf``, docs/scale-out.md).

Pinned to ggml-org/llama.cpp @ 0274f0fc7d7fbab69c33ccf757cf7f3d036c17aa: ``conversion/llama.py``
(``LlamaModel``'s EAGLE-3 branch: what its converter writes), ``src/models/eagle3.cpp`` (what the
loader requires and how the graph reads it), ``src/llama-arch.cpp`` and
``gguf-py/gguf/constants.py`` (the names). The ``gguf`` package on PyPI predates the ``eagle3``
architecture, so its names are written here as strings; ``gguf.GGUFWriter`` / ``GGUFReader``
handle the container.

One file, ``general.architecture = "eagle3"``:

- tensors ``fc.weight``, ``blk.0.{attn_norm, attn_norm_2, attn_q, attn_k, attn_v, attn_output,
  ffn_norm, ffn_gate, ffn_up, ffn_down}.weight``, ``output_norm.weight``, ``output.weight`` and
  ``d2t``; ``hidden_norm`` is ``attn_norm_2``; q and k rows are permuted for ggml's rotary
  layout (``LlamaModel.permute``: the architecture's rope type is NORM); ``d2t`` holds int64
  *absolute* target ids (``d2t + arange``; the graph scatters the draft logits to them), and
  ``t2d`` is not stored. Norms stay float32 whatever ``dtype``, as the converter keeps them.
- keys: the draft layer's shapes under ``eagle3.*`` (``block_count`` 1, ``embedding_length``,
  ``feed_forward_length``, ``attention.head_count``/``head_count_kv``/``key_length``/
  ``value_length``/``layer_norm_rms_epsilon``, ``rope.freq_base``, ``rope.dimension_count``,
  ``context_length``, ``vocab_size``), ``eagle3.extract_layers`` (llama.cpp's input-of-layer ids,
  specdec's output-of-layer ids + 1), ``eagle3.target_hidden_size``,
  ``eagle3.norm_before_residual``, and the target's vocabulary (``tokenizer.*``), which the
  converter takes from ``--target-model-dir``: llama.cpp sizes the scattered logits by it.
- ``specdec.eagle3``: a JSON string (tree settings, target record, layers as given, and the
  exact ``rope_theta`` and ``rms_norm_eps``, which the keys hold as float32) that llama.cpp
  ignores and that makes an export read back as the same checkpoint.

The draft takes the target's token embedding, as specdec's EAGLE-3 does: no ``token_embd``.
"""

from __future__ import annotations

import json
import shlex
import struct
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from specdec.errors import CorruptFileError, InvalidInputError, require
from specdec.models.bundled import resolve_model
from specdec.models.checkpoints import check_compatible
from specdec.models.files import parse_json, read_json
from specdec.models.gguf_header import check_gguf, gguf_architecture
from specdec_eagle3.config import (
    Eagle3Config,
    check_weights,
    default_hidden_layers,
    draft_to_target,
    resolve_layers,
)
from specdec_eagle3.export import _no_options

__all__ = [
    "ARCH",
    "TENSOR_NAMES",
    "default_extract_layers",
    "detect_gguf",
    "gguf_file",
    "permute",
    "read_gguf",
    "unpermute",
    "write_gguf",
]

ARCH = "eagle3"  # LLM_ARCH_EAGLE3
SPECDEC_KEY = "specdec.eagle3"
TENSOR_NAMES = {  # specdec name -> llama.cpp name (conversion/llama.py, src/llama-arch.cpp)
    "fc.weight": "fc.weight",
    "midlayer.input_layernorm.weight": "blk.0.attn_norm.weight",
    "midlayer.hidden_norm.weight": "blk.0.attn_norm_2.weight",
    "midlayer.self_attn.q_proj.weight": "blk.0.attn_q.weight",
    "midlayer.self_attn.k_proj.weight": "blk.0.attn_k.weight",
    "midlayer.self_attn.v_proj.weight": "blk.0.attn_v.weight",
    "midlayer.self_attn.o_proj.weight": "blk.0.attn_output.weight",
    "midlayer.post_attention_layernorm.weight": "blk.0.ffn_norm.weight",
    "midlayer.mlp.gate_proj.weight": "blk.0.ffn_gate.weight",
    "midlayer.mlp.up_proj.weight": "blk.0.ffn_up.weight",
    "midlayer.mlp.down_proj.weight": "blk.0.ffn_down.weight",
    "norm.weight": "output_norm.weight",
    "lm_head.weight": "output.weight",
    "d2t": "d2t",
}
FILE_NAMES = {
    "float32": "eagle3-f32.gguf",
    "float16": "eagle3-f16.gguf",
    "bfloat16": "eagle3-bf16.gguf",
}
FILE_TYPES = {"float32": "ALL_F32", "float16": "MOSTLY_F16", "bfloat16": "MOSTLY_BF16"}


def _gguf():
    return require("gguf", extra="hf", feature="reading or writing llama.cpp's GGUF")


def permute(weights: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp's row order of a q (heads = query heads) or k (heads = key/value heads)
    projection: each head's two rotary halves interleaved (``LlamaModel.permute``)."""
    rows = weights.shape[0]
    return (
        weights.reshape(heads, 2, rows // heads // 2, *weights.shape[1:])
        .swapaxes(1, 2)
        .reshape(weights.shape)
    )


def unpermute(weights: np.ndarray, heads: int) -> np.ndarray:
    """The inverse of ``permute``: back to the Hugging Face row order."""
    rows = weights.shape[0]
    return (
        weights.reshape(heads, rows // heads // 2, 2, *weights.shape[1:])
        .swapaxes(1, 2)
        .reshape(weights.shape)
    )


def _heads(config: Eagle3Config) -> dict[str, int]:
    return {
        "midlayer.self_attn.q_proj.weight": config.num_heads,
        "midlayer.self_attn.k_proj.weight": config.num_kv_heads,
    }


# ---------------------------------------------------------------------------- the target


def _copy_tokenizer(reader, writer) -> None:
    """Every ``tokenizer.*`` key of a target GGUF, as it is there."""
    gguf = _gguf()
    for name, field in reader.fields.items():
        if not name.startswith("tokenizer."):
            continue
        kind = field.types[0]
        if kind == gguf.GGUFValueType.ARRAY:
            writer.add_key_value(name, field.contents(), kind, sub_type=field.types[-1])
        else:
            writer.add_key_value(name, field.contents(), kind)


def _target_from_gguf(path: Path) -> dict[str, Any]:
    gguf = _gguf()
    check_gguf(path)
    reader = gguf.GGUFReader(str(path))

    def value(key):
        field = reader.get_field(key)
        return None if field is None else field.contents()

    arch = value("general.architecture")
    tokens = value("tokenizer.ggml.tokens")
    layers, hidden = value(f"{arch}.block_count"), value(f"{arch}.embedding_length")
    if tokens is None or layers is None or hidden is None:
        raise InvalidInputError(
            f"{path} lacks the target's vocabulary or sizes (tokenizer.ggml.tokens, "
            f"{arch}.block_count, {arch}.embedding_length): pass the target model's GGUF file "
            "or its Hugging Face folder"
        )
    return {
        "name": path.stem,
        "num_layers": int(layers),
        "hidden_size": int(hidden),
        "vocab_size": len(tokens),
        "write_vocab": lambda writer: _copy_tokenizer(reader, writer),
        "vocab_note": f"the vocabulary is {path.name}'s tokenizer.* keys, copied as they are",
    }


def _hf_vocab(folder: Path, vocab_size: int, writer) -> None:
    """The target's tokenizer as llama.cpp's BPE vocabulary: its tokens by id, padded to the
    config's vocab_size with ``[PAD{i}]`` (unused), added tokens as control (special) or user
    defined, merges, special ids and the chat template from ``gguf.SpecialVocab`` (the
    converter's ``get_vocab_base`` and ``_set_vocab_gpt2``)."""
    gguf = _gguf()
    feature = "writing the target's vocabulary from its folder (or pass the target's GGUF file)"
    transformers = require("transformers", extra="hf", feature=feature)
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(folder))
    by_id = {index: token for token, index in tokenizer.get_vocab().items()}
    if by_id and max(by_id) >= vocab_size:
        raise InvalidInputError(
            f"{folder}'s tokenizer has token id {max(by_id)}, past its config's vocab_size "
            f"{vocab_size}: the folder's tokenizer and model do not match"
        )
    added = tokenizer.get_added_vocab()
    decoder = tokenizer.added_tokens_decoder
    tokens, types = [], []
    for index in range(vocab_size):
        token = by_id.get(index)
        if token is None:
            tokens.append(f"[PAD{index}]")
            types.append(gguf.TokenType.UNUSED)
        elif token in added:
            tokens.append(token)
            special = index in decoder and decoder[index].special
            types.append(gguf.TokenType.CONTROL if special else gguf.TokenType.USER_DEFINED)
        else:
            tokens.append(token)
            types.append(gguf.TokenType.NORMAL)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    gguf.SpecialVocab(folder, load_merges=_is_bpe(folder), n_vocab=vocab_size).add_to_gguf(writer)


def _is_bpe(folder: Path) -> bool:
    try:
        data = read_json(folder / "tokenizer.json", what="tokenizer", kind=None)
    except (OSError, ValueError):  # CorruptFileError included
        return False
    return isinstance(data, dict) and (data.get("model") or {}).get("type") == "BPE"


def _target_from_folder(model) -> dict[str, Any]:
    folder = Path(resolve_model(model))
    config_file = folder / "config.json"
    if not config_file.is_file():
        raise InvalidInputError(
            f"{folder} has no config.json: pass the target model's Hugging Face folder, bundled "
            "name or GGUF file"
        )
    config = read_json(config_file, what="model config")
    config = {**config, **config.get("text_config", {})}  # as the converter reads a target
    missing = [k for k in ("num_hidden_layers", "hidden_size", "vocab_size") if k not in config]
    if missing:
        raise InvalidInputError(f"{config_file} lacks {missing}")
    tokenizer_files = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model")
    if not any((folder / name).is_file() for name in tokenizer_files):
        raise InvalidInputError(
            f"{folder} holds no tokenizer ({', '.join(tokenizer_files)}); the GGUF layout "
            "carries the target's vocabulary (llama.cpp sizes the draft's logits by it): pass "
            "the target folder with its tokenizer, or the target's GGUF file"
        )
    vocab_size = int(config["vocab_size"])
    return {
        "name": folder.resolve().name,
        "num_layers": int(config["num_hidden_layers"]),
        "hidden_size": int(config["hidden_size"]),
        "vocab_size": vocab_size,
        "write_vocab": lambda writer: _hf_vocab(folder, vocab_size, writer),
        "vocab_note": (
            f"the vocabulary is {folder.name}'s tokenizer written as llama.cpp's BPE vocabulary "
            "(tokenizer.ggml.pre 'default': the draft never tokenizes text, llama.cpp hands it "
            "the target's ids; give the target's GGUF file as the model to copy its tokenizer "
            "keys exactly)"
        ),
    }


def _target(model) -> dict[str, Any]:
    if model is None:
        raise InvalidInputError(
            "the GGUF layout carries the target's vocabulary (llama.cpp sizes the draft's logits "
            "by it, as its converter's --target-model-dir supplies): pass model= (`--model`: the "
            "target's folder, bundled name or GGUF file)"
        )
    path = Path(str(model)).expanduser()
    if path.suffix == ".gguf" and path.is_file():
        return _target_from_gguf(path)
    return _target_from_folder(model)


# ---------------------------------------------------------------------------- writing


def _specdec_block(config: Eagle3Config) -> dict[str, Any]:
    return {
        "top_k": config.top_k,
        "depth": config.depth,
        "total_tokens": config.total_tokens,
        "target": config.target,
        "hidden_layers": None if config.hidden_layers is None else list(config.hidden_layers),
        "rope_theta": config.rope_theta,  # the keys hold float32; these are exact
        "rms_norm_eps": config.rms_norm_eps,
    }


def write_gguf(
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
    """llama.cpp's GGUF (one file in ``out``) -> (notes, the ``llama-server`` command)."""
    _no_options(choices, drop_shortlist)
    if dtype not in FILE_NAMES:
        raise InvalidInputError(f"dtype must be one of {sorted(FILE_NAMES)}, got {dtype!r}")
    gguf = _gguf()
    check_weights(config, weights)
    carried = [
        name
        for name, flag in (
            ("embed_tokens.weight (its own token embedding)", config.own_embedding),
            ("input_norm.weight (norm_before_fc)", config.norm_before_fc),
        )
        if flag
    ]
    if carried:
        raise InvalidInputError(
            f"this EAGLE-3 head carries {' and '.join(carried)}, which llama.cpp's EAGLE-3 GGUF "
            "cannot hold; export --format speculators (vLLM) or specforge (SGLang) instead"
        )
    target = _target(model)
    check_compatible(
        config,
        drafter="EAGLE-3",
        vocab_size=target["vocab_size"],
        hidden_size=target["hidden_size"],
        name=target["name"],
    )
    layers = resolve_layers(config, target["num_layers"]).hidden_layers
    notes = [
        target["vocab_note"],
        "q and k rows permuted for llama.cpp's rotary layout, as its converter does",
        "d2t written as absolute target ids (llama.cpp's meaning); t2d not written",
        (
            f"eagle3.extract_layers {[i + 1 for i in layers]}: llama.cpp's input-of-layer ids "
            "(specdec's output-of-layer hidden_layers + 1)"
        ),
        "llama.cpp drafts a chain of --spec-draft-n-max tokens, not the dynamic tree",
    ]
    if config.hidden_layers is None:
        notes.append(
            f"this head names no fused layers: written are the default three of the target's "
            f"{target['num_layers']} layers"
        )
    folder = Path(out)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / FILE_NAMES[dtype]
    writer = gguf.GGUFWriter(str(path), ARCH)
    if target["name"]:
        writer.add_name(f"EAGLE-3 draft for {target['name']}")
    writer.add_block_count(1)
    writer.add_context_length(int(config.target.get("max_position_embeddings", 8192)))
    writer.add_embedding_length(config.hidden_size)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_head_count(config.num_heads)
    writer.add_head_count_kv(config.num_kv_heads)
    writer.add_key_length(config.head_dim)
    writer.add_value_length(config.head_dim)
    writer.add_rope_freq_base(config.rope_theta)
    writer.add_layer_norm_rms_eps(config.rms_norm_eps)
    writer.add_file_type(getattr(gguf.LlamaFileType, FILE_TYPES[dtype]))
    writer.add_vocab_size(config.vocab_size)
    writer.add_rope_dimension_count(config.head_dim)
    writer.add_array(f"{ARCH}.extract_layers", [int(i) + 1 for i in layers])
    writer.add_uint32(f"{ARCH}.target_hidden_size", config.hidden_size)
    writer.add_bool(f"{ARCH}.norm_before_residual", config.norm_before_residual)
    writer.add_string(SPECDEC_KEY, json.dumps(_specdec_block(config), sort_keys=True))
    target["write_vocab"](writer)
    writer.add_quantization_version(gguf.GGML_QUANT_VERSION)
    heads = _heads(config)
    for name, gguf_name in TENSOR_NAMES.items():
        if name == "d2t":
            ids = draft_to_target(weights["d2t"])
            writer.add_tensor(gguf_name, ids, raw_dtype=gguf.GGMLQuantizationType.I64)
            continue
        array = np.asarray(weights[name])
        if name in heads:
            array = permute(array, heads[name])
        if array.ndim == 1 or dtype == "float32":  # norms stay float32, as upstream's converter
            writer.add_tensor(gguf_name, np.ascontiguousarray(array, dtype=np.float32))
        elif dtype == "float16":
            writer.add_tensor(gguf_name, np.ascontiguousarray(array, dtype=np.float16))
        else:  # bfloat16: rounded to nearest even by the gguf package, as upstream's converter
            bf16 = gguf.GGMLQuantizationType.BF16
            packed = gguf.quants.quantize(np.ascontiguousarray(array, dtype=np.float32), bf16)
            writer.add_tensor(gguf_name, packed, raw_dtype=bf16)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    given = Path(str(model)).expanduser()
    if given.suffix == ".gguf" and given.is_file():
        target_gguf = shlex.quote(str(given.resolve()))
    else:
        target_gguf = "TARGET.gguf"
        notes.append(
            "TARGET.gguf in the command: the target's own GGUF (llama.cpp's convert_hf_to_gguf.py "
            "makes it from the Hugging Face folder; export with that file as --model to have it "
            "written)"
        )
    command = (
        f"llama-server -m {target_gguf} -md {path} --spec-type draft-eagle3 "
        f"--spec-draft-n-max {config.depth}"
    )
    return notes, (command,)


# ---------------------------------------------------------------------------- reading


def gguf_file(path) -> Path | None:
    """The GGUF file ``path`` is, or the one GGUF file a folder without config.json holds."""
    path = Path(path)
    if path.is_file():
        file = path
    elif path.is_dir() and not (path / "config.json").exists():
        found = sorted(path.glob("*.gguf"))
        if len(found) != 1:
            return None
        file = found[0]
    else:
        return None
    try:
        with open(file, "rb") as handle:
            magic = handle.read(4)
    except OSError:
        return None
    if magic != b"GGUF" and file.suffix.lower() != ".gguf":
        return None
    check_gguf(file)  # a damaged one is refused, naming it, before a reader trusts its header
    return file


def _architecture(file: Path) -> str | None:
    try:
        return gguf_architecture(file)  # the header alone: no second parse of the vocabulary
    except (ValueError, OSError, struct.error):
        return None


def detect_gguf(folder: Path, config: Mapping[str, Any]) -> bool:
    """A GGUF file (or a folder holding just one) of architecture ``eagle3``."""
    file = gguf_file(folder)
    return file is not None and _architecture(file) == ARCH


def _tensor(gguf, tensor) -> tuple[np.ndarray, str | None]:
    """A tensor's values as numpy (float or int, in numpy's axis order) and a note when they were
    dequantized."""
    kind = tensor.tensor_type
    plain = (gguf.GGMLQuantizationType.F32, gguf.GGMLQuantizationType.F16)
    ints = (
        gguf.GGMLQuantizationType.I8,
        gguf.GGMLQuantizationType.I16,
        gguf.GGMLQuantizationType.I32,
        gguf.GGMLQuantizationType.I64,
    )
    if kind in plain or kind in ints or kind == gguf.GGMLQuantizationType.F64:
        return np.asarray(tensor.data), None
    try:
        values = gguf.quants.dequantize(tensor.data, kind)
    except NotImplementedError as exc:
        raise InvalidInputError(
            f"tensor {tensor.name} is stored as {kind.name}, which the gguf package cannot "
            "dequantize: convert the head again as f32, f16 or bf16"
        ) from exc
    shape = tuple(int(n) for n in reversed(tensor.shape))
    note = (
        None
        if kind == gguf.GGMLQuantizationType.BF16
        else f"{tensor.name} dequantized from {kind.name}"
    )
    return np.asarray(values, dtype=np.float32).reshape(shape), note


def _check_absolute(file: Path, ids: np.ndarray) -> None:
    """``d2t`` must hold distinct ascending target ids; repeated values that are ascending as
    offsets are a converter that stored SpecForge's offsets (``target = i + d2t[i]``)."""
    steps = np.diff(ids)
    if steps.size and np.all(steps >= 0) and np.any(steps == 0) and ids.min() >= 0:
        raise InvalidInputError(
            f"{file} stores d2t as offsets (target id = i + d2t[i]), while llama.cpp's EAGLE-3 "
            "graph reads absolute target ids: convert the head again with a current "
            "convert_hf_to_gguf.py (it writes d2t + arange)"
        )


def _exact(block: Mapping[str, Any], name: str, stored) -> float:
    """A float key (stored as float32), or the exact value the specdec entry records for it when
    that rounds to the stored one (the key was not changed since)."""
    exact = block.get(name)
    if exact is not None and np.float32(exact) == np.float32(stored):
        return float(exact)
    return float(stored)


def read_gguf(path) -> tuple[Eagle3Config, dict[str, np.ndarray], list[str]]:
    """An EAGLE-3 head in llama.cpp's GGUF -> (config, float64 weights with int64 ``d2t``, notes).
    Refused with the fix: another architecture, a draft with its own token embedding or without
    its own LM head, llama3 rope scaling, partial rotary, layer ids specdec cannot fuse."""
    gguf = _gguf()
    file = gguf_file(path)
    if file is None:
        raise InvalidInputError(
            f"{path} is not a GGUF file, nor a folder holding exactly one: pass the head's .gguf"
        )
    reader = gguf.GGUFReader(str(file))

    def value(key, default=None):
        field = reader.get_field(key)
        return default if field is None else field.contents()

    arch = value("general.architecture")
    if arch != ARCH:
        raise InvalidInputError(
            f"{file} is a GGUF of architecture {arch!r}, not an EAGLE-3 head (general.architecture "
            f"'{ARCH}'): pass the draft head's GGUF (the target model goes in model=)"
        )

    def key(name, default=None):
        return value(f"{ARCH}.{name}", default)

    required = ("embedding_length", "feed_forward_length", "attention.head_count")
    missing = [f"{ARCH}.{name}" for name in required if key(name) is None]
    if missing:
        raise InvalidInputError(
            f"{file} lacks {missing}, which llama.cpp's loader reads: convert the head again"
        )

    if int(key("block_count", 1)) != 1:
        raise InvalidInputError(
            f"{file} has {key('block_count')} draft layers (eagle3.block_count); EAGLE-3 has one"
        )
    hidden = int(key("embedding_length"))
    if int(key("target_hidden_size", hidden)) != hidden:
        raise InvalidInputError(
            f"{file} drafts at hidden size {hidden} from a target of width "
            f"{key('target_hidden_size')} (eagle3.target_hidden_size); specdec's EAGLE-3 needs "
            "them equal"
        )
    heads = int(key("attention.head_count"))
    kv_heads = int(key("attention.head_count_kv", heads))
    head_dim = int(key("attention.key_length", hidden // heads))
    if int(key("attention.value_length", head_dim)) != head_dim:
        raise InvalidInputError(
            f"{file} has keys of {head_dim} and values of {key('attention.value_length')} "
            "(eagle3.attention.key_length / value_length); specdec's EAGLE-3 needs them equal"
        )
    if int(key("rope.dimension_count", head_dim)) != head_dim:
        raise InvalidInputError(
            f"{file} rotates {key('rope.dimension_count')} of its {head_dim} head dimensions "
            "(eagle3.rope.dimension_count); specdec's EAGLE-3 rotates them all"
        )
    scaling = key("rope.scaling.type")
    if scaling not in (None, "none"):
        raise InvalidInputError(
            f"{file} uses rope scaling {scaling!r}; specdec's EAGLE-3 layer has plain rotary "
            "positions"
        )
    extract = key("extract_layers")
    if extract is None or len(extract) != 3:
        raise InvalidInputError(
            f"{file} fuses target layers {extract} (eagle3.extract_layers); EAGLE-3 fuses three"
        )
    if min(extract) < 1 or list(extract) != sorted(set(extract)):
        raise InvalidInputError(
            f"{file} fuses target layer inputs {list(extract)} (eagle3.extract_layers, llama.cpp's "
            "input-of-layer ids); specdec fuses the outputs of three distinct ascending layers, "
            "ids 1 and up (id 0 would be the token embedding)"
        )
    tokens = value("tokenizer.ggml.tokens")
    vocab = len(tokens) if tokens is not None else key("vocab_size")
    if vocab is None:
        raise InvalidInputError(
            f"{file} holds no vocabulary (tokenizer.ggml.tokens, eagle3.vocab_size): convert it "
            "again with the target given (--target-model-dir)"
        )
    tensors = {t.name: t for t in reader.tensors}
    by_gguf = {gguf_name: name for name, gguf_name in TENSOR_NAMES.items()}
    if "token_embd.weight" in tensors:
        raise InvalidInputError(
            f"{file} carries its own token embedding (token_embd.weight), which specdec reads "
            "from the SpecForge and speculators layouts but not from GGUF; convert the head to "
            "one of those"
        )
    if "output.weight" not in tensors:
        raise InvalidInputError(
            f"{file} has no output.weight; heads that share the target's LM head are not supported"
        )
    if "rope_freqs.weight" in tensors or "blk.0.rope_freqs.weight" in tensors:
        raise InvalidInputError(
            f"{file} scales its rotary frequencies (rope_freqs, llama3 rope scaling); specdec's "
            "EAGLE-3 layer has plain rotary positions"
        )
    unexpected = sorted(set(tensors) - set(by_gguf))
    if unexpected:
        raise InvalidInputError(
            f"{file} has tensors specdec's EAGLE-3 does not run: {unexpected} (e.g. fc_norm: an "
            "EAGLE-3.1 head); convert it without them"
        )
    notes, weights = [], {}
    for gguf_name, tensor in tensors.items():
        array, note = _tensor(gguf, tensor)
        if note:
            notes.append(note)
        name = by_gguf[gguf_name]
        if name == "d2t":
            ids = np.asarray(array, dtype=np.int64).reshape(-1)
            _check_absolute(file, ids)
            weights["d2t"] = ids - np.arange(len(ids), dtype=np.int64)  # absolute -> offsets
        else:
            weights[name] = np.asarray(array, dtype=np.float64)
    draft_vocab = int(weights["lm_head.weight"].shape[0])
    if "d2t" not in weights:
        weights["d2t"] = np.zeros(draft_vocab, dtype=np.int64)
        notes.append("no d2t: the draft vocabulary is the target's")
    for name, count in {
        "midlayer.self_attn.q_proj.weight": heads,
        "midlayer.self_attn.k_proj.weight": kv_heads,
    }.items():
        if name in weights:
            weights[name] = unpermute(weights[name], count)
    block = parse_json(
        value(SPECDEC_KEY) or "{}",
        what=f"{file}'s {SPECDEC_KEY} key",
        fix="convert or export the head again",
    )
    if not isinstance(block, dict):
        raise CorruptFileError(f"{file}'s {SPECDEC_KEY} key is not a JSON object: export it again")
    layers = block["hidden_layers"] if "hidden_layers" in block else [i - 1 for i in extract]
    fields = dict(
        vocab_size=int(vocab),
        hidden_size=hidden,
        draft_vocab_size=draft_vocab,
        hidden_layers=layers,
        num_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=head_dim,
        intermediate_size=int(key("feed_forward_length")),
        rope_theta=_exact(block, "rope_theta", key("rope.freq_base", 10000.0)),
        rms_norm_eps=_exact(block, "rms_norm_eps", key("attention.layer_norm_rms_epsilon", 1e-6)),
        norm_before_residual=bool(key("norm_before_residual", False)),
        target=block.get("target", {}),
    )
    fields.update({k: block[k] for k in ("top_k", "depth", "total_tokens") if k in block})
    config = Eagle3Config(**fields)
    check_weights(config, weights)
    return config, weights, notes


def default_extract_layers(num_layers: int) -> list[int]:
    """llama.cpp's default ``extract_layers`` for a target of ``num_layers`` layers: specdec's
    default three as input-of-layer ids (the converter's ``[2, L//2, L-3]`` from 8 layers up)."""
    return [i + 1 for i in default_hidden_layers(num_layers)]
