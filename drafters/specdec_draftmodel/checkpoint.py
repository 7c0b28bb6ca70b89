"""Loading the draft model beside a target, checking that the two share a tokenizer, and the
drafter's folder form (a config.json naming the draft model, usable as ``drafter=FOLDER``)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from specdec.models.bundled import resolve_model
from specdec.errors import InvalidInputError, ModelLoadError, SpecdecError
from specdec.models.files import check_model_folder, read_json
from specdec.models.llama import load_tokenizer
from specdec.testing import make_random_model

MODEL_TYPE = "specdec_draft_model"
DEFAULT_DRAFT_LENGTH = 4
HOW_TO_PASS = (
    "pass draft_model=FOLDER (a Hugging Face-format folder of a smaller model with the target's "
    "tokenizer) or a bundled name, e.g. specdec.generate(target, prompt, drafter='draft_model', "
    "draft_model='path/to/small-model'), `specdec bench --methods draft_model:draft=PATH,k=4`, or "
    "drafter=FOLDER where FOLDER/config.json holds "
    f'{{"model_type": "{MODEL_TYPE}", "draft_model": PATH}}'
)


def read_drafter_folder(folder: Path) -> dict:
    """{"draft_model": path or bundled name, "draft_length": int or absent} of a drafter folder;
    a relative path is relative to the folder."""
    config = read_json(Path(folder) / "config.json", what="drafter config")
    if config.get("model_type") != MODEL_TYPE:
        raise InvalidInputError(
            f"drafter folder {folder} has model_type {config.get('model_type')!r}, "
            f"not {MODEL_TYPE!r}"
        )
    model = config.get("draft_model")
    if not isinstance(model, str) or not model:
        raise InvalidInputError(
            f"drafter folder {folder}: config.json names no draft model; {HOW_TO_PASS}"
        )
    if (Path(folder) / model).exists():
        model = str((Path(folder) / model).resolve())
    out = {"draft_model": model}
    if "draft_length" in config:
        out["draft_length"] = config["draft_length"]
    return out


def _target_label(target: Any) -> str:
    return f"the target {getattr(target, 'name', None) or type(target).__name__!s}"


def _vocab(tokenizer) -> dict:
    return tokenizer.get_vocab(with_added_tokens=True)


def check_same_tokenizer(target: Any, folder: Path) -> None:
    """Refuse a draft model folder whose vocabulary size or tokenizer differs from the target's
    (checked from its files, before anything is loaded)."""
    config = read_json(folder / "config.json", what="model config")
    label = _target_label(target)
    size = config.get("vocab_size")
    if size is not None and int(size) != int(target.vocab_size):
        raise InvalidInputError(
            f"drafter 'draft_model': the draft model {folder} has a vocabulary of {size} tokens "
            f"and {label} of {target.vocab_size}; the tokenizers must match: a draft model must "
            "use the target's tokenizer"
        )
    mine, theirs = load_tokenizer(folder), getattr(target, "tokenizer", None)
    if mine is None or theirs is None or not hasattr(theirs, "get_vocab"):
        return  # nothing to compare beyond the vocabulary size
    ours, other = _vocab(mine), _vocab(theirs)
    if ours != other:
        differ = sorted(set(ours.items()) ^ set(other.items()), key=lambda item: (item[1], item[0]))
        example = ", ".join(f"{token!r}: {index}" for token, index in differ[:3])
        raise InvalidInputError(
            f"drafter 'draft_model': the tokenizer of the draft model {folder} differs from that "
            f"of {label} ({len(ours)} and {len(other)} tokens; {len(differ)} token-id pairs are in "
            f"one only, e.g. {example}); the tokenizers must match: a draft model must use the "
            "target's tokenizer"
        )


def _dtype(target: Any) -> str | None:
    dtype = getattr(target, "dtype", None)
    return None if dtype is None else str(dtype).rpartition(".")[2]


def _device(target: Any) -> str | None:
    device = getattr(target, "device", None)
    return None if device is None else str(device)


def load_draft_model(backend: Any, target: Any, source: Any):
    """(draft TargetModel, its folder): ``source`` (a folder or a bundled name) loaded on
    ``backend`` in the target's dtype and device, with the target's slots and capacity, after the
    tokenizer check."""
    folder = Path(resolve_model(source)).expanduser()
    check_model_folder(folder)
    check_same_tokenizer(target, folder)
    dtype, device = _dtype(target), _device(target)
    try:
        draft = backend.load_target(
            folder,
            dtype=dtype,
            device=device,
            slots=int(target.num_slots),
            capacity=int(target.capacity),
        )
    except SpecdecError:
        raise
    except (OSError, ValueError, RuntimeError, AssertionError, KeyError, TypeError) as exc:
        asked = "".join(
            f", {k}={v!r}" for k, v in (("dtype", dtype), ("device", device)) if v is not None
        )
        raise ModelLoadError(
            f"drafter 'draft_model': the {backend.name} backend could not load the draft model "
            f"{folder}{asked}: {' '.join(str(exc).split()) or type(exc).__name__}"
        ) from exc
    return draft, folder


def _first(value):
    return (
        value[0]
        if isinstance(value, list) and value
        else (value if isinstance(value, int) else None)
    )


def make_random_draft_model(
    path,
    model_path,
    *,
    seed: int,
    draft_length: int = DEFAULT_DRAFT_LENGTH,
    hidden_size: int | None = None,
    num_layers: int = 1,
    num_heads: int = 2,
    num_kv_heads: int = 1,
) -> Path:
    """A drafter folder for the model at ``model_path``: ``path/model`` is a random model of the
    same architecture and vocabulary (its tokenizer files copied), ``path/config.json`` names it."""
    source = Path(model_path)
    config = read_json(source / "config.json", what="model config")
    folder = Path(path)
    hidden = hidden_size or max(
        8 * num_heads, (int(config["hidden_size"]) // 2) // (2 * num_heads) * 2 * num_heads
    )
    make_random_model(
        folder / "model",
        vocab_size=int(config["vocab_size"]),
        hidden_size=hidden,
        num_layers=num_layers,
        num_heads=num_heads,
        num_kv_heads=num_kv_heads,
        seed=seed,
        architecture=config.get("model_type", "llama"),
        tie_word_embeddings=bool(config.get("tie_word_embeddings", True)),
        eos_token_id=_first(config.get("eos_token_id")),
        max_position_embeddings=int(config.get("max_position_embeddings", 4096)),
    )
    for name in (
        "tokenizer.json",
        "tokenizer_config.json",
        "special_tokens_map.json",
        "chat_template.jinja",
    ):
        if (source / name).is_file():
            shutil.copyfile(source / name, folder / "model" / name)
    (folder / "config.json").write_text(
        json.dumps(
            {"model_type": MODEL_TYPE, "draft_model": "model", "draft_length": int(draft_length)},
            indent=2,
        )
        + "\n"
    )
    return folder
