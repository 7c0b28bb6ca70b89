"""Hostile model and drafter folders, for tests that every command refuses them in one line.

``hostile_models(sound, out)`` and ``hostile_drafters(sound, out)`` copy a sound folder once per
case and damage the copy as the case says: truncated or garbled safetensors, config values of
the wrong type or size, a non-JSON tokenizer, links out of the folder, pickles in place of
safetensors, integer or NaN weights. Each returns {case name: folder}.
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
