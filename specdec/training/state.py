"""The trainer's resumable state in a format that cannot run code: safetensors plus JSON.

A state is a nest of dicts, lists, tuples, strings, numbers, booleans, None and torch tensors
(a module's and an optimiser's ``state_dict``, the sampler's bit-generator state, the history).
``save_state`` stores every tensor in a safetensors file and the rest of the nest, with each
tensor replaced by its key, as JSON in that file's header metadata; ``load_state`` rebuilds it.
Nothing is unpickled, so a crafted state file can at worst fail to load.

Run folders written before this format hold ``trainer_state.pt``; ``load_state`` reads such a
file only with ``torch.load(weights_only=True)`` (tensors and plain values, no code), and
refuses one that needs more.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import load_file, save_file

from specdec.errors import TrainingOutputError
from specdec.models.files import load_torch_pickle
from specdec.training.outdir import LEGACY_STATE_FILE

__all__ = ["LEGACY_STATE_FILE", "load_state", "save_state"]

_FORMAT = "specdec-trainer-state/1"


def _encode(value, tensors: dict, path: str):
    """The JSON form of ``value``; tensors go into ``tensors`` under a key made from ``path``."""
    if isinstance(value, torch.Tensor):
        key = path or "tensor"
        tensors[key] = value.detach().to("cpu").clone().contiguous()  # no shared storage
        return {"$tensor": key}
    if isinstance(value, dict):
        items = [
            [_encode(k, tensors, f"{path}/{k}#key"), _encode(v, tensors, f"{path}/{k}")]
            for k, v in value.items()
        ]
        return {"$dict": items}
    if isinstance(value, tuple):
        return {"$tuple": [_encode(v, tensors, f"{path}/{i}") for i, v in enumerate(value)]}
    if isinstance(value, list):
        return [_encode(v, tensors, f"{path}/{i}") for i, v in enumerate(value)]
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return value if value == value and abs(value) != float("inf") else {"$float": repr(value)}
    raise TypeError(
        f"trainer state at {path or '/'} holds a {type(value).__name__}, which the "
        f"state format cannot store (tensors, dicts, lists, tuples and plain values only)"
    )


def _decode(value, tensors: dict):
    """The value ``_encode`` made ``value`` from; ValueError naming what is not such a value (a
    crafted file's tags of the wrong shape, keys that cannot be keys, a missing tensor)."""
    if isinstance(value, list):
        return [_decode(v, tensors) for v in value]
    if isinstance(value, dict):
        if len(value) != 1:
            raise ValueError(f"an object with keys {sorted(value)[:4]} where one tag belongs")
        ((tag, inner),) = value.items()
        if tag == "$tensor" and isinstance(inner, str) and inner in tensors:
            return tensors[inner]
        if (
            tag == "$dict"
            and isinstance(inner, list)
            and all(isinstance(item, list) and len(item) == 2 for item in inner)
        ):
            items = [(_decode(k, tensors), _decode(v, tensors)) for k, v in inner]
            try:
                return dict(items)
            except TypeError:  # a list or a dict where a key belongs
                raise ValueError("a dictionary key that cannot be a key") from None
        if tag == "$tuple" and isinstance(inner, list):
            return tuple(_decode(v, tensors) for v in inner)
        if tag == "$float" and inner in ("nan", "inf", "-inf"):
            return float(inner)
        raise ValueError(f"tag {tag!r} with {type(inner).__name__} {str(inner)[:40]!r}")
    return value


def save_state(path: Path, state: dict) -> None:
    """Write ``state`` to ``path`` (safetensors), atomically: a partial file, then a rename."""
    path = Path(path)
    tensors: dict[str, torch.Tensor] = {}
    nest = _encode(state, tensors, "")
    partial = path.with_name(f".{path.name}.{os.getpid()}.partial")
    save_file(tensors, str(partial), metadata={"format": _FORMAT, "state": json.dumps(nest)})
    partial.replace(path)
    (path.parent / LEGACY_STATE_FILE).unlink(missing_ok=True)  # superseded


def load_state(path: Path) -> dict:
    """The state ``save_state`` wrote to ``path``; a legacy ``trainer_state.pt`` beside it is read
    without unpickling code. Raises TrainingOutputError, naming the file, when it does not load."""
    path = Path(path)
    if not path.is_file() and (path.parent / LEGACY_STATE_FILE).is_file():
        return _load_legacy(path.parent / LEGACY_STATE_FILE)
    try:
        with safe_open(str(path), framework="pt") as handle:
            metadata = handle.metadata() or {}
        if metadata.get("format") != _FORMAT or "state" not in metadata:
            raise ValueError(f"its header does not say {_FORMAT!r}")
        state = _decode(json.loads(metadata["state"]), load_file(str(path)))
        if not isinstance(state, dict):
            raise ValueError(f"it holds a {type(state).__name__}, not a state")
        return state
    except RecursionError:
        problem = "its state nests too deeply"
    except (OSError, ValueError, KeyError, TypeError, SafetensorError) as exc:
        problem = " ".join(str(exc).split()) or type(exc).__name__
    raise TrainingOutputError(
        f"{path} is not a trainer state this version can read ({problem}); start the run again "
        f"with --overwrite instead of --resume"
    )


def _load_legacy(path: Path) -> dict:
    state = load_torch_pickle(
        path,
        what="the trainer state",
        fix="start the run again with --overwrite instead of --resume",
        error=TrainingOutputError,
    )
    if not isinstance(state, dict):
        raise TrainingOutputError(
            f"{path} holds a {type(state).__name__}, not a trainer state; start the run again "
            "with --overwrite instead of --resume"
        )
    return state
