"""The target's vocabulary and sizes for an EAGLE-3 GGUF (``specdec_eagle3.llamacpp``): llama.cpp
sizes the draft's scattered logits by the target's vocabulary, as its converter takes it from
``--target-model-dir``. From the target's own GGUF its ``tokenizer.*`` keys are copied as they are;
from a Hugging Face folder its tokenizer is written as llama.cpp's BPE vocabulary."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from specdec.errors import InvalidInputError, require
from specdec.models.bundled import resolve_model
from specdec.models.files import read_json
from specdec.models.gguf_header import check_gguf
from specdec_eagle3.llamacpp import gguf_module

__all__ = ["target_vocabulary"]


def _copy_tokenizer(reader, writer) -> None:
    """Every ``tokenizer.*`` key of a target GGUF, as it is there."""
    gguf = gguf_module()
    for name, field in reader.fields.items():
        if not name.startswith("tokenizer."):
            continue
        kind = field.types[0]
        if kind == gguf.GGUFValueType.ARRAY:
            writer.add_key_value(name, field.contents(), kind, sub_type=field.types[-1])
        else:
            writer.add_key_value(name, field.contents(), kind)


def _target_from_gguf(path: Path) -> dict[str, Any]:
    gguf = gguf_module()
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
    gguf = gguf_module()
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


def target_vocabulary(model) -> dict[str, Any]:
    """{"name", "num_layers", "hidden_size", "vocab_size", "write_vocab" (writer -> None),
    "vocab_note"} of the target ``model`` (its GGUF file, folder or bundled name)."""
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
