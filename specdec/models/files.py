"""Reading the files a model or drafter folder holds, with errors that name the file.

Library errors (``json.JSONDecodeError``, safetensors' "incomplete metadata") do not say which
file is damaged; these helpers do, and they check a safetensors file's structure (its header
parses and its tensors end exactly at the end of the file) without reading the tensors.
"""

from __future__ import annotations

import contextlib
import json
import struct
from pathlib import Path

from specdec.errors import CorruptFileError, InvalidInputError, SpecdecError

MAX_HEADER = 100 * 1024 * 1024  # safetensors' own limit on the JSON header


def read_json(path, *, what: str = "file") -> dict:
    """The JSON object in ``path``; CorruptFileError naming the file if it is not one."""
    path = Path(path)
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CorruptFileError(
            f"{what} {path} is not valid JSON ({exc}); restore or re-create the file"
        ) from None
    if not isinstance(value, dict):
        raise CorruptFileError(
            f"{what} {path} holds a JSON {type(value).__name__}, expected an object"
        )
    return value


def check_safetensors(path) -> None:
    """Raise CorruptFileError unless ``path`` is a structurally complete safetensors file."""
    path = Path(path)
    size = path.stat().st_size
    problem = None
    with open(path, "rb") as handle:
        head = handle.read(8)
        if len(head) < 8:
            problem = f"it has only {size} bytes"
        else:
            (header_size,) = struct.unpack("<Q", head)
            if header_size > min(MAX_HEADER, size - 8):
                problem = f"its header claims {header_size} bytes but the file has {size}"
            else:
                try:
                    header = json.loads(handle.read(header_size))
                    ends = [
                        int(info["data_offsets"][1])
                        for name, info in header.items()
                        if name != "__metadata__"
                    ]
                except (ValueError, KeyError, TypeError, IndexError):
                    problem = "its header is not valid safetensors JSON"
                else:
                    expected = 8 + header_size + max(ends, default=0)
                    if expected != size:
                        problem = (
                            f"it has {size} bytes, its header describes {expected} (truncated or "
                            "damaged)"
                        )
    if problem:
        raise CorruptFileError(
            f"weights file {path} is damaged: {problem}; restore or re-create it"
        )


def check_model_folder(folder) -> None:
    """A local model folder exists, its config.json is a JSON object and its weights are
    complete."""
    folder = Path(folder)
    if not folder.exists():
        raise InvalidInputError(
            f"model folder {folder} does not exist; pass a Hugging Face-format folder "
            "(config.json, model.safetensors), a .gguf file, or a bundled model name"
        )
    if not folder.is_dir():
        raise InvalidInputError(
            f"model {folder} is a file, not a folder: pass the folder with config.json"
        )
    if not (folder / "config.json").is_file():
        raise InvalidInputError(
            f"model folder {folder} has no config.json; a model folder needs its config.json"
        )
    read_json(folder / "config.json", what="model config")
    index = folder / "model.safetensors.index.json"
    if (folder / "model.safetensors").is_file():
        check_safetensors(folder / "model.safetensors")
    elif index.is_file():
        shards = set(read_json(index, what="weights index").get("weight_map", {}).values())
        for shard in sorted(shards):
            if (folder / shard).is_file():
                check_safetensors(folder / shard)


def check_checkpoint_folder(folder) -> dict:
    """A drafter checkpoint folder's config (checked JSON) after checking its weights file."""
    folder = Path(folder)
    config_file = folder / "config.json"
    if not config_file.is_file():
        raise InvalidInputError(f"drafter checkpoint {folder} has no config.json")
    config = read_json(config_file, what="drafter config")
    if (folder / "model.safetensors").is_file():
        check_safetensors(folder / "model.safetensors")
    return config


@contextlib.contextmanager
def damaged_checkpoint(folder):
    """Report what a drafter's own reader raises over a checkpoint folder's contents (a config
    value it refuses, a missing or misshapen tensor, a safetensors file its library cannot read)
    as a CorruptFileError naming the folder, in one line."""
    try:
        yield
    except SpecdecError:
        raise
    except Exception as exc:  # noqa: BLE001
        # ValueError, KeyError, TypeError, safetensors' own errors
        if (
            not isinstance(exc, (ValueError, KeyError, TypeError, OSError))
            and "safetensor" not in type(exc).__name__.lower()
        ):
            raise
        detail = " ".join(str(exc).split()) or type(exc).__name__
        raise CorruptFileError(
            f"drafter checkpoint {folder} could not be read: {detail}; fix its config.json or "
            "restore the checkpoint (specdec train or specdec import writes a sound one)"
        ) from exc
