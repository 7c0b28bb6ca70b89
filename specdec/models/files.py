"""Reading the files a model or drafter folder holds, with errors that name the file.

Library errors (``json.JSONDecodeError``, safetensors' "incomplete metadata", a GGUF reader's
``IndexError``, torch's unpickler refusal) do not say which file is damaged; these helpers do.
``parse_json`` / ``read_json`` are the one way specdec reads JSON a user gave it (a file, or an
argument), so that JSON nested deeper than Python's parser goes is refused like any other that is
not JSON. ``check_safetensors`` (and ``check_gguf``) check a weights file's structure (its header
parses, its tensors lie inside the file and do not overlap) without reading the tensors, before a
library that trusts the header's counts and sizes loops or allocates by them.
``load_torch_pickle`` reads a torch pickle with torch's safe unpickler only. (``check_gguf``
lives in ``specdec.models.gguf_header``.)
"""

from __future__ import annotations

import os

import contextlib
import json
import math
import re
import struct
from pathlib import Path
from typing import Any, Mapping

from specdec.errors import CorruptFileError, InvalidInputError, SpecdecError, require

MAX_HEADER = 100 * 1024 * 1024  # safetensors' own limit on the JSON header

# bytes per element of the safetensors dtypes of whole bytes (sub-byte ones are not sized here)
SAFETENSORS_DTYPES = {
    "BOOL": 1,
    "U8": 1,
    "I8": 1,
    "F8_E5M2": 1,
    "F8_E4M3": 1,
    "F8_E8M0": 1,
    "I16": 2,
    "U16": 2,
    "F16": 2,
    "BF16": 2,
    "I32": 4,
    "U32": 4,
    "F32": 4,
    "I64": 8,
    "U64": 8,
    "F64": 8,
    "C64": 8,
}


def parse_json(text, *, what: str, fix: str, error: type[SpecdecError] = CorruptFileError):
    """The JSON value in ``text`` (str or bytes); ``error`` naming ``what`` and giving ``fix``
    when it is not JSON, not UTF-8, or nests deeper than Python's JSON parser goes."""
    try:
        return json.loads(text)
    except RecursionError:
        raise error(
            f"{what} is not valid JSON a reader can take (it nests arrays or objects too deeply); "
            f"{fix}"
        ) from None
    except (UnicodeDecodeError, ValueError) as exc:
        detail = " ".join(str(exc).split())
        raise error(f"{what} is not valid JSON ({detail}); {fix}") from None


def jsonl_lines(path, *, what: str, fix: str = "write it in UTF-8"):
    """(line number from 1, text) of every non-blank line of the UTF-8 file at ``path`` (a JSON
    Lines file); InvalidInputError naming ``what`` when it is not UTF-8."""
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except UnicodeDecodeError as exc:
        raise InvalidInputError(f"{what} is not UTF-8 text (byte {exc.start}): {fix}") from None
    return [(number, line) for number, line in enumerate(lines, 1) if line.strip()]


def read_json(path, *, what: str = "file", kind: type | None = dict):
    """The JSON value in file ``path``, by default an object; CorruptFileError naming the file if
    it is not one (``kind=None``: any JSON value)."""
    path = Path(path)
    value = parse_json(
        path.read_bytes(), what=f"{what} {path}", fix="restore or re-create the file"
    )
    if kind is not None and not isinstance(value, kind):
        expected = {dict: "an object", list: "an array"}.get(kind, kind.__name__)
        raise CorruptFileError(
            f"{what} {path} holds a JSON {type(value).__name__}, expected {expected}"
        )
    return value


def safetensors_problem(header, size: int, header_size: int) -> str | None:
    """What is wrong with a safetensors file of ``size`` bytes whose JSON header (``header_size``
    bytes) parsed as ``header``, or None: every tensor has a dtype, a shape and a data range
    (of as many bytes as its shape needs, for the dtypes of whole bytes), and the ranges tile the
    data exactly, as safetensors requires (no overlap, no gap, no byte past the end of the
    file)."""
    if not isinstance(header, dict):
        return "its header is not a JSON object"
    spans = []
    for name, info in header.items():
        if name == "__metadata__":
            continue
        try:
            dtype, shape, (start, end) = info["dtype"], info["shape"], info["data_offsets"]
        except (TypeError, KeyError, ValueError):
            return f"the header entry of tensor {name!r} is not dtype, shape and data_offsets"
        numbers = [*shape, start, end] if isinstance(shape, list) else None
        if (
            not isinstance(dtype, str)
            or numbers is None
            or not all(isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in numbers)
            or end < start
        ):
            return (
                f"tensor {name!r} has dtype {dtype!r}, shape {shape!r} and data_offsets "
                f"{[start, end]!r}"
            )
        itemsize = SAFETENSORS_DTYPES.get(dtype)
        if itemsize is not None and end - start != math.prod(shape) * itemsize:
            return (
                f"tensor {name!r} ({dtype} {shape}) has data_offsets {[start, end]} of "
                f"{end - start} bytes"
            )
        spans.append((start, end, name))
    spans.sort()
    edge, previous = 0, None
    for start, end, name in spans:
        if start < edge:
            return f"tensors {previous!r} and {name!r} overlap (data_offsets)"
        if start > edge:
            return f"the data has a gap of {start - edge} bytes before tensor {name!r}"
        edge, previous = end, name
    expected = 8 + header_size + edge
    if expected != size:
        return f"it has {size} bytes, its header describes {expected} (truncated or damaged)"
    return None


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
                except (ValueError, RecursionError):
                    problem = "its header is not valid safetensors JSON"
                else:
                    problem = safetensors_problem(header, size, header_size)
    if problem:
        raise CorruptFileError(
            f"weights file {path} is damaged: {problem}; restore or re-create it"
        )


def torch_refusal(exc: BaseException) -> str:
    """What torch's safe unpickler (``torch.load(weights_only=True)``) refused, in a few words:
    the global or operand it does not allow, else the first line of its message, never torch's
    advice to load the file unsafely."""
    text = str(exc)
    found = re.search(r"Unsupported (global|operand)[^\n.]*", text)
    if found:
        return found.group(0).strip()
    first = text.strip().split("\n")[0].strip()
    if not first or "weights_only" in first.lower() or "weights only" in first.lower():
        return "the file ends early" if isinstance(exc, EOFError) else type(exc).__name__
    return first


def load_torch_pickle(path, *, what: str, fix: str, error: type[SpecdecError] = CorruptFileError):
    """The object a torch pickle holds, read by torch's safe unpickler (tensors and plain values,
    never code); ``error`` naming ``what`` and the file, with ``fix``, when it does not load."""
    torch = require("torch", extra="torch", feature=f"reading the torch file {path}")
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # noqa: BLE001
        # any refusal of the safe unpickler, or a damaged file, is reported the same way
        raise error(
            f"{what} {path} was not loaded: it holds more than tensors and plain values, or is "
            f"damaged ({torch_refusal(exc)}); a pickle of arbitrary objects can run code; {fix}"
        ) from None


def read_torch_tensors(path, *, what: str = "weights file") -> dict[str, Any]:
    """{name: torch tensor} of a torch weights file (``.pt``, ``.bin``), read with
    ``load_torch_pickle``; CorruptFileError naming the file when it holds anything else."""
    fix = "convert it to safetensors where it came from, or restore it"
    state = load_torch_pickle(path, what=what, fix=fix)
    torch = require("torch", extra="torch", feature=f"reading the torch file {path}")
    if not isinstance(state, Mapping):
        raise CorruptFileError(
            f"{what} {path} holds a {type(state).__name__}, not tensors by name; {fix}"
        )
    bad = [
        key for key, value in state.items() if not (isinstance(key, str) and torch.is_tensor(value))
    ]
    if bad:
        raise CorruptFileError(
            f"{what} {path} holds entries that are not named tensors ({bad[:4]!r}); {fix}"
        )
    return dict(state)


# ---------------------------------------------------------------------------- folders

# config.json keys with one meaning in every Hugging Face model: their types are checked before a
# backend reads them (a library that validates them itself would raise its own error)
_SIZE_KEYS = (
    "vocab_size",
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "max_position_embeddings",
    "sliding_window",
)
_TOKEN_KEYS = ("bos_token_id", "eos_token_id")
_FLAG_KEYS = ("tie_word_embeddings", "attention_bias", "mlp_bias", "use_sliding_window")
_NUMBER_KEYS = ("rms_norm_eps", "rope_theta")


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def check_config_values(config: Mapping[str, Any], where) -> None:
    """Refuse a model config.json whose standard keys have the wrong type: sizes that are not
    positive integers (64.0 included), token ids that are not integers >= 0 (or lists of them for
    eos_token_id), flags that are not booleans, rms_norm_eps or rope_theta that are not numbers.
    Absent and null keys are left to the loader."""
    for key in _SIZE_KEYS:
        value = config.get(key)
        if value is None:
            continue
        if not _is_int(value):
            raise InvalidInputError(
                f"{where}: {key} must be an integer, got {value!r}; fix config.json"
            )
        if value < 1:
            raise InvalidInputError(
                f"{where}: {key} must be a positive integer, got {value!r}; fix config.json"
            )
    for key in _TOKEN_KEYS:
        value = config.get(key)
        ids = value if isinstance(value, list) and key == "eos_token_id" else [value]
        if value is not None and not all(_is_int(i) and i >= 0 for i in ids):
            kind = "an integer >= 0" + (" or a list of them" if key == "eos_token_id" else "")
            raise InvalidInputError(
                f"{where}: {key} must be {kind}, got {value!r}; fix config.json"
            )
    for key in _FLAG_KEYS:
        value = config.get(key)
        if value is not None and not isinstance(value, bool):
            raise InvalidInputError(
                f"{where}: {key} must be true or false, got {value!r}; fix config.json"
            )
    for key in _NUMBER_KEYS:
        value = config.get(key)
        if value is not None and (
            isinstance(value, bool)
            or not isinstance(value, (int, float))
            or not math.isfinite(value)
            or value <= 0
        ):
            raise InvalidInputError(
                f"{where}: {key} must be a positive number, got {value!r}; fix config.json"
            )


def check_model_folder(folder) -> dict:
    """A local model folder exists, its JSON files parse (config.json an object whose standard
    keys have their types, ``check_config_values``) and its weights are complete; returns its
    config."""
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
    config = read_json(folder / "config.json", what="model config")
    check_config_values(config, folder / "config.json")
    for name, what in (
        ("generation_config.json", "generation config"),
        ("tokenizer_config.json", "tokenizer config"),
    ):
        if (folder / name).is_file():
            read_json(folder / name, what=what)
    index = folder / "model.safetensors.index.json"
    if (folder / "model.safetensors").is_file():
        check_safetensors(folder / "model.safetensors")
    elif index.is_file():
        weight_map = read_json(index, what="weights index").get("weight_map", {})
        if not isinstance(weight_map, dict) or not all(
            isinstance(shard, str) for shard in weight_map.values()
        ):
            raise CorruptFileError(
                f"weights index {index} has a weight_map that is not tensor names to file names; "
                "restore or re-create the file"
            )
        for shard in sorted(set(weight_map.values())):
            if (folder / shard).is_file():
                check_safetensors(folder / shard)
    return config


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


# what a drafter's reader raises over a damaged checkpoint (beside safetensors' own errors)
_READER_ERRORS = (ValueError, LookupError, TypeError, OSError, EOFError, RecursionError)


@contextlib.contextmanager
def damaged_checkpoint(folder):
    """Report what a drafter's own reader raises over a checkpoint folder's contents (a config
    value it refuses, a missing or misshapen tensor, a file its library cannot read) as a
    CorruptFileError naming the folder, in one line."""
    try:
        yield
    except SpecdecError:
        raise
    except Exception as exc:  # noqa: BLE001
        # ValueError, KeyError, IndexError, TypeError, safetensors' own errors
        if not isinstance(exc, _READER_ERRORS) and "safetensor" not in type(exc).__name__.lower():
            raise
        detail = " ".join(str(exc).split()) or type(exc).__name__
        raise CorruptFileError(
            f"drafter checkpoint {folder} could not be read: {detail}; fix its config.json or "
            "restore the checkpoint (specdec train or specdec import writes a sound one)"
        ) from exc


def readable(path) -> None:
    """Give a written file the mode a plain ``open`` would (0666 less the umask): safetensors'
    writer makes its files 0600, which a server running as another user cannot read."""
    mask = os.umask(0)
    os.umask(mask)
    os.chmod(path, 0o666 & ~mask)
