"""Hostile model and drafter folders, for tests that every command refuses them in one line.

``hostile_models(sound, out)`` and ``hostile_drafters(sound, out)`` copy a sound folder once per
case and damage the copy as the case says: truncated or garbled safetensors, config values of
the wrong type or size, a non-JSON tokenizer, links out of the folder, pickles in place of
safetensors, integer or NaN weights. Each returns {case name: folder}. ``hostile_ggufs(sound,
out)`` writes damaged copies of a sound GGUF file (``GGUF_CASES``: truncated, bad magic, counts
and sizes past the file) and returns {case name: file}.
"""

from __future__ import annotations

import json
import pickle
import shutil
import struct
from pathlib import Path
from typing import Callable

import numpy as np
from safetensors.numpy import load_file, save_file


def _config(**fields) -> Callable[[Path], None]:
    def edit(folder: Path) -> None:
        config = json.loads((folder / "config.json").read_text())
        config.update(fields)
        (folder / "config.json").write_text(json.dumps(config))

    return edit


def _write(name: str, data: bytes) -> Callable[[Path], None]:
    def edit(folder: Path) -> None:
        (folder / name).write_bytes(data)

    return edit


def _truncate(folder: Path) -> None:
    weights = folder / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])


def _huge_header(folder: Path) -> None:
    weights = folder / "model.safetensors"
    weights.write_bytes(struct.pack("<Q", 2**60) + weights.read_bytes()[8:])


def _link_out(folder: Path) -> None:
    """model.safetensors a link to a file outside the folder that is no safetensors file."""
    outside = folder.parent / f"{folder.name}-outside.txt"
    outside.write_text("not weights\n")
    (folder / "model.safetensors").unlink()
    (folder / "model.safetensors").symlink_to(outside)


def _pickle_only(folder: Path) -> None:
    """The weights as a pickle (pytorch_model.bin) and no safetensors file."""
    (folder / "model.safetensors").unlink()
    (folder / "pytorch_model.bin").write_bytes(pickle.dumps({"weights": [1.0, 2.0]}))


def _tensors(change: Callable[[dict], None]) -> Callable[[Path], None]:
    def edit(folder: Path) -> None:
        weights = load_file(str(folder / "model.safetensors"))
        change(weights)
        save_file(weights, str(folder / "model.safetensors"))

    return edit


def _first(weights: dict, suffix: str = "") -> str:
    return sorted(name for name in weights if name.endswith(suffix) and weights[name].ndim == 2)[0]


def _int8(weights: dict) -> None:
    name = _first(weights, "up_proj.weight")
    weights[name] = weights[name].astype(np.int8)


def _nan(weights: dict) -> None:
    name = _first(weights)
    weights[name] = np.full_like(weights[name], np.nan)


def _drop(weights: dict) -> None:
    del weights[_first(weights)]


def _reshape(weights: dict) -> None:
    name = _first(weights)
    weights[name] = np.zeros((3, 5), dtype=weights[name].dtype)


MODEL_CASES: dict[str, Callable[[Path], None]] = {
    "truncated weights": _truncate,
    "a weights header of 2**60 bytes": _huge_header,
    "config.json not JSON": _write("config.json", b"{not json"),
    "config.json a list": _write("config.json", b"[1, 2]"),
    "ten million layers": _config(num_hidden_layers=10**7),
    "hidden_size as text": _config(hidden_size="big"),
    "zero attention heads": _config(num_attention_heads=0),
    "a negative vocabulary": _config(vocab_size=-5),
    "an unknown rope type": _config(rope_scaling={"rope_type": "warp-drive", "factor": 2.0}),
    "tokenizer.json not JSON": _write("tokenizer.json", b"\x00\x01 not a tokenizer"),
    "weights linked out of the folder": _link_out,
    "a pickle instead of safetensors": _pickle_only,
    "int8 weights": _tensors(_int8),
    "a missing tensor": _tensors(_drop),
}

DRAFTER_CASES: dict[str, Callable[[Path], None]] = {
    "truncated weights": _truncate,
    "a weights header of 2**60 bytes": _huge_header,
    "config.json not JSON": _write("config.json", b"{not json"),
    "an unknown model_type": _config(model_type="warp_drive"),
    "beams of 100,000": _config(beam_width=100_000, beam_length=100_000),
    "beam_width as text": _config(beam_width="four"),
    "weights linked out of the folder": _link_out,
    "a pickle instead of safetensors": _pickle_only,
    "NaN weights": _tensors(_nan),
    "a missing tensor": _tensors(_drop),
    "a tensor of the wrong shape": _tensors(_reshape),
}


def _build(sound: Path, out: Path, cases: dict[str, Callable[[Path], None]]) -> dict[str, Path]:
    folders = {}
    for number, (name, damage) in enumerate(cases.items()):
        folder = Path(out) / f"case-{number:02d}"
        shutil.copytree(sound, folder, symlinks=True)
        damage(folder)
        folders[name] = folder
    return folders


def hostile_models(sound, out) -> dict[str, Path]:
    """{case: a damaged copy of the model folder ``sound``} under ``out`` (``MODEL_CASES``)."""
    return _build(Path(sound), Path(out), MODEL_CASES)


def hostile_drafters(sound, out) -> dict[str, Path]:
    """{case: a damaged copy of the drafter folder ``sound``} under ``out`` (``DRAFTER_CASES``)."""
    return _build(Path(sound), Path(out), DRAFTER_CASES)


# ---------------------------------------------------------------------------- GGUF files

_SCALAR_SIZES = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}


def _skip_value(data: bytes, kind: int, at: int) -> int:
    """The offset just past a GGUF metadata value of type ``kind`` starting at ``at``."""
    if kind in _SCALAR_SIZES:
        return at + _SCALAR_SIZES[kind]
    if kind == 8:  # a string: its length, then its bytes
        return at + 8 + struct.unpack_from("<Q", data, at)[0]
    item, count = struct.unpack_from("<IQ", data, at)  # an array
    at += 12
    for _ in range(count):
        at = _skip_value(data, item, at)
    return at


def _gguf_offsets(data: bytes) -> dict[str, int]:
    """Where the fields a damage changes lie in a sound little-endian GGUF file: the first
    metadata key, the first array value (its item type), the first tensor's dimension count."""
    _, tensors, keys = struct.unpack_from("<IQQ", data, 4)
    at, array = 24, None
    for _ in range(keys):
        at += 8 + struct.unpack_from("<Q", data, at)[0]  # the key
        (kind,) = struct.unpack_from("<I", data, at)
        at += 4
        if kind == 9 and array is None:
            array = at
        at = _skip_value(data, kind, at)
    if array is None or not tensors:
        raise ValueError("the sound GGUF file needs an array value and a tensor")
    dims = at + 8 + struct.unpack_from("<Q", data, at)[0]
    return {"array": array, "dims": dims}


def _put(data: bytes, at: int, code: str, value: int) -> bytes:
    size = struct.calcsize(code)
    return data[:at] + struct.pack("<" + code, value) + data[at + size :]


def _gguf_damages() -> dict[str, Callable[[bytes], bytes]]:
    def tensor_field(field: str, code: str, value: int) -> Callable[[bytes], bytes]:
        """Set ``field`` of the first tensor's info: its dimension count, first dimension, type
        or data offset."""

        def damage(data: bytes) -> bytes:
            at = _gguf_offsets(data)["dims"]
            dims = struct.unpack_from("<I", data, at)[0]
            where = {"count": 0, "dimension": 4, "type": 4 + 8 * dims, "offset": 8 + 8 * dims}
            return _put(data, at + where[field], code, value)

        return damage

    return {
        "an empty file": lambda data: b"",
        "the header cut short": lambda data: data[:20],
        "truncated in half": lambda data: data[: len(data) // 2],
        # tensors end within the alignment (32 bytes) of the end: the last one loses a byte
        "the last 32 bytes missing": lambda data: data[:-32],
        "bad magic": lambda data: b"GGUX" + data[4:],
        "version 99": lambda data: _put(data, 4, "I", 99),
        "2**60 tensors": lambda data: _put(data, 8, "Q", 2**60),
        "2**60 metadata keys": lambda data: _put(data, 16, "Q", 2**60),
        "one tensor more than it holds": lambda data: _put(
            data, 8, "Q", struct.unpack_from("<Q", data, 8)[0] + 1
        ),
        "a key of 2**60 bytes": lambda data: _put(data, 24, "Q", 2**60),
        "an array of 2**60 items": lambda data: _put(
            data, _gguf_offsets(data)["array"] + 4, "Q", 2**60
        ),
        "a tensor of 2**31 dimensions": tensor_field("count", "I", 2**31),
        "a dimension of 2**40": tensor_field("dimension", "Q", 2**40),
        "an unknown tensor type": tensor_field("type", "I", 999),
        "a tensor offset of 2**50": tensor_field("offset", "Q", 2**50),
    }


GGUF_CASES: dict[str, Callable[[bytes], bytes]] = _gguf_damages()


def hostile_ggufs(sound, out) -> dict[str, Path]:
    """{case: a damaged copy of the GGUF file ``sound``} under ``out`` (``GGUF_CASES``); the sound
    file needs a metadata array and a tensor (any file llama.cpp's converter writes has both)."""
    data = Path(sound).read_bytes()
    Path(out).mkdir(parents=True, exist_ok=True)
    files = {}
    for number, (name, damage) in enumerate(GGUF_CASES.items()):
        file = Path(out) / f"case-{number:02d}.gguf"
        file.write_bytes(damage(data))
        files[name] = file
    return files
