"""Checks shared by every drafter that loads a checkpoint trained for a target."""

from __future__ import annotations

from typing import Callable

from specdec.errors import IncompatibleDrafterError, InvalidInputError


def require_checkpoint(name: str, checkpoint) -> None:
    """Raise a clear error when a trained drafter is asked for without its checkpoint."""
    if checkpoint is None:
        raise InvalidInputError(
            f"drafter {name!r} needs a checkpoint trained for this model: pass drafter='path/to/checkpoint' "
            f"(a folder with config.json and model.safetensors), or train one with `specdec train {name}`"
        )


def check_target(config, target, check_compatible: Callable[..., None]) -> None:
    """Run a drafter's ``check_compatible`` against ``target``; raise IncompatibleDrafterError.

    The target's fingerprint (a hash of its weights) is computed only when the checkpoint records one.
    """
    recorded = (getattr(config, "target", None) or {}).get("fingerprint")
    try:
        check_compatible(
            config, vocab_size=target.vocab_size, hidden_size=target.hidden_size,
            fingerprint=target.fingerprint if recorded else None, name=getattr(target, "name", None),
        )
    except ValueError as exc:
        raise IncompatibleDrafterError(str(exc)) from None
