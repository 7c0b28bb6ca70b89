"""Checks shared by every drafter that loads a checkpoint trained for a target."""

from __future__ import annotations

import json
import os
from importlib import resources
from pathlib import Path
from typing import Any, Mapping

import attrs
import numpy as np
from safetensors.numpy import load_file, save_file

from specdec.errors import IncompatibleDrafterError, InvalidInputError
from specdec.models.files import read_json, readable


CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"


def save_checkpoint(
    path, config: dict, weights: Mapping[str, np.ndarray], *, dtype=np.float32
) -> Path:
    """Write ``config.json`` and ``model.safetensors`` (``dtype``: float32, or float16 to ship
    small; integer arrays, such as a vocabulary shortlist, are stored as int64 whatever ``dtype``).
    Each file is written to a temporary name and renamed, so an interrupted save (a training
    checkpoint) never leaves a half-written file behind."""
    folder = Path(path)
    folder.mkdir(parents=True, exist_ok=True)
    arrays = {
        name: np.ascontiguousarray(
            array, dtype=np.int64 if np.issubdtype(np.asarray(array).dtype, np.integer) else dtype
        )
        for name, array in weights.items()
    }
    partial = folder / f".{WEIGHTS_FILE}.{os.getpid()}.partial"
    save_file(
        arrays, str(partial), metadata={"format": "np", "model_type": str(config.get("model_type"))}
    )
    readable(partial)
    partial.replace(folder / WEIGHTS_FILE)
    write_json_atomic(folder / CONFIG_FILE, config)
    return folder


def config_from_dict(cls, data: Mapping[str, Any], *, label: str, model_type: str | None = None):
    """An attrs config class ``cls`` from the dict of its ``config.json``: ``model_type`` filled in
    when absent, and unknown keys an error naming them and the known ones (a typo, or another
    format, must not pass silently). ``label`` names the drafter in the message."""
    data = dict(data)
    if model_type is not None:
        data.setdefault("model_type", model_type)
    known = {field.name for field in attrs.fields(cls)}
    unknown = sorted(set(data) - known)
    if unknown:
        raise ValueError(f"unknown {label} config keys {unknown}; known keys are {sorted(known)}")
    return cls(**data)


def write_json_atomic(path: Path, value) -> None:
    """Write ``value`` as indented JSON to ``path`` through a temporary file and a rename, so a
    reader never sees a half-written file."""
    partial = path.with_name(f".{path.name}.{os.getpid()}.partial")
    partial.write_text(json.dumps(value, indent=2) + "\n")
    partial.replace(path)


def read_checkpoint(path, *, label: str) -> tuple[dict, dict[str, np.ndarray]]:
    """The config dict and weights of a checkpoint folder (floating arrays as float64, integer
    arrays as int64); a clear error if files are missing."""
    folder = Path(path)
    for name in (CONFIG_FILE, WEIGHTS_FILE):
        if not (folder / name).is_file():
            raise InvalidInputError(
                f"{folder} is not a {label} checkpoint: {name} is missing (expected {CONFIG_FILE} "
                f"and {WEIGHTS_FILE})"
            )
    config = read_json(folder / CONFIG_FILE, what=f"{label} config")
    weights = {
        name: array.astype(np.int64 if np.issubdtype(array.dtype, np.integer) else np.float64)
        for name, array in load_file(str(folder / WEIGHTS_FILE)).items()
    }
    return config, weights


def check_weight_shapes(
    expected: Mapping[str, tuple[int, ...]],
    weights: Mapping[str, Any],
    *,
    label: str,
    settings: str,
) -> None:
    """Raise ValueError unless ``weights`` holds exactly the arrays ``expected`` names, each of
    its shape (name -> shape, from the drafter's config). The message names every tensor missing,
    unexpected or of another shape, the config's ``settings`` that set them and the fix; a
    drafter checkpoint's reader raises it inside ``specdec.models.files.damaged_checkpoint``,
    which names the folder. ``label``: the drafter, as "ReDrafter"."""
    missing = sorted(set(expected) - set(weights))
    unexpected = sorted(set(weights) - set(expected))
    wrong = sorted(
        f"{name}: {tuple(np.shape(weights[name]))} != {tuple(shape)}"
        for name, shape in expected.items()
        if name in weights and tuple(np.shape(weights[name])) != tuple(shape)
    )
    found = []
    if missing:
        found.append(f"the weights lack {len(missing)} arrays it needs, missing {missing}")
    if unexpected:
        found.append(
            f"they hold {len(unexpected)} arrays it does not describe, unexpected {unexpected}"
        )
    if wrong:
        found.append(f"{len(wrong)} arrays have another shape, wrong shapes {wrong}")
    if found:
        raise ValueError(
            f"{label} weights do not match the config ({settings}): {'; '.join(found)}; check "
            "that config.json belongs to these weights"
        )


def read_target_config(model_path, *, label: str) -> tuple[dict, dict]:
    """The ``config.json`` of a target folder and the ``target`` record a drafter trained for it
    stores (name, vocab_size, hidden_size)."""
    folder = Path(model_path)
    config_file = folder / CONFIG_FILE
    if not config_file.is_file():
        raise InvalidInputError(
            f"{folder} has no {CONFIG_FILE}; pass the folder of a Hugging Face-format target model"
        )
    config = read_json(config_file, what="model config")
    missing = [key for key in ("hidden_size", "vocab_size") if key not in config]
    if missing:
        raise InvalidInputError(
            f"{config_file} lacks {missing}; a {label} drafter needs the target's hidden and "
            "vocabulary sizes"
        )
    record = {
        "name": folder.resolve().name,
        "vocab_size": int(config["vocab_size"]),
        "hidden_size": int(config["hidden_size"]),
    }
    return config, record


def require_checkpoint(name: str, checkpoint, target, *, package: str):
    """The checkpoint to load: the one given, else the one shipped in ``package`` for this
    target (``<package>/weights/<target.name>/``), else a clear error."""
    if checkpoint is not None:
        return checkpoint
    shipped = resources.files(package) / "weights" / str(getattr(target, "name", ""))
    if getattr(target, "name", None) and shipped.joinpath("config.json").is_file():
        return shipped
    raise InvalidInputError(
        f"drafter {name!r} needs a checkpoint trained for this model, and none ships for "
        f"{getattr(target, 'name', None)!r}: give a checkpoint folder (config.json and "
        f"model.safetensors) as the drafter (drafter='runs/{name}'; on the command line --drafter "
        f"runs/{name} or {name}:drafter=runs/{name}), train one with `specdec train {name}`, "
        "or use a drafter that needs no training: drafter='lookup' (prompt lookup; --drafter "
        "lookup), or drafter='draft_model' with draft_model= a smaller model sharing the "
        "tokenizer (--drafter draft_model:draft=MODEL)"
    )


def _describe(name: Any, vocab_size: Any, hidden_size: Any) -> str:
    label = repr(name) if name else "an unnamed model"
    return f"{label} (vocab_size {vocab_size}, hidden_size {hidden_size})"


def check_compatible(
    config,
    *,
    drafter: str,
    vocab_size: int,
    hidden_size: int,
    fingerprint: str | None = None,
    name: str | None = None,
) -> None:
    """Raise IncompatibleDrafterError unless the drafter ``config`` was trained for this target.

    ``config`` has ``vocab_size``, ``hidden_size`` and ``target`` (a dict that may record the
    target's ``name`` and ``fingerprint``). The sizes must match, and so must the fingerprints
    (hashes of the target's weights) when both are known. Names only label the two models in the
    message: a renamed folder holds the same model.
    """
    trained = config.target or {}
    trained_fingerprint, trained_name = trained.get("fingerprint"), trained.get("name")
    sizes_differ = vocab_size != config.vocab_size or hidden_size != config.hidden_size
    fingerprints_differ = (
        fingerprint is not None
        and trained_fingerprint is not None
        and fingerprint != trained_fingerprint
    )
    if sizes_differ or fingerprints_differ:
        detail = (
            f" (weights fingerprint {trained_fingerprint!r}, the target's is {fingerprint!r})"
            if fingerprints_differ
            else ""
        )
        raise IncompatibleDrafterError(
            f"this {drafter} drafter was trained for another model: "
            f"{_describe(trained_name, config.vocab_size, config.hidden_size)}, but the target is "
            f"{_describe(name, vocab_size, hidden_size)}{detail}; use a drafter trained for this "
            "target, or train one"
        )


def check_trained_for(config, target, *, drafter: str) -> None:
    """``check_compatible`` against a loaded target; its fingerprint (a hash of its weights) is
    computed only when the checkpoint records one and the target offers one (an optional
    attribute of the target protocol)."""
    recorded = (getattr(config, "target", None) or {}).get("fingerprint")
    check_compatible(
        config,
        drafter=drafter,
        vocab_size=target.vocab_size,
        hidden_size=target.hidden_size,
        fingerprint=getattr(target, "fingerprint", None) if recorded else None,
        name=getattr(target, "name", None),
    )
