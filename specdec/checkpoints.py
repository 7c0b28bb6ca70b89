"""Checks shared by every drafter that loads a checkpoint trained for a target."""

from __future__ import annotations

from importlib import resources
from typing import Any

from specdec.errors import IncompatibleDrafterError, InvalidInputError


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
        f"{getattr(target, 'name', None)!r}: pass drafter='path/to/checkpoint' (a folder with config.json and "
        f"model.safetensors), or train one with `specdec train {name}`"
    )


def _describe(name: Any, vocab_size: Any, hidden_size: Any) -> str:
    label = repr(name) if name else "an unnamed model"
    return f"{label} (vocab_size {vocab_size}, hidden_size {hidden_size})"


def check_compatible(config, *, drafter: str, vocab_size: int, hidden_size: int, fingerprint: str | None = None,
                     name: str | None = None) -> None:
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
        fingerprint is not None and trained_fingerprint is not None and fingerprint != trained_fingerprint
    )
    if sizes_differ or fingerprints_differ:
        detail = f" (weights fingerprint {trained_fingerprint!r}, the target's is {fingerprint!r})" if fingerprints_differ else ""
        raise IncompatibleDrafterError(
            f"this {drafter} drafter was trained for another model: "
            f"{_describe(trained_name, config.vocab_size, config.hidden_size)}, but the target is "
            f"{_describe(name, vocab_size, hidden_size)}{detail}; use a drafter trained for this target, "
            "or train one"
        )


def check_target(config, target, *, drafter: str) -> None:
    """``check_compatible`` against a loaded target; its fingerprint (a hash of its weights) is
    computed only when the checkpoint records one."""
    recorded = (getattr(config, "target", None) or {}).get("fingerprint")
    check_compatible(
        config, drafter=drafter, vocab_size=target.vocab_size, hidden_size=target.hidden_size,
        fingerprint=target.fingerprint if recorded else None, name=getattr(target, "name", None),
    )
