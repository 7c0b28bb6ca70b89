"""Errors that tell the user what is wrong and how to fix it."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path


class SpecdecError(Exception):
    """Base class of every error specdec raises on purpose."""


class InvalidInputError(SpecdecError, ValueError):
    """An argument is out of its domain (empty prompt, token id out of range, ...)."""


class UnknownPluginError(SpecdecError, LookupError):
    """No installed plugin provides the requested backend, drafter, tree builder or verifier."""


class MissingDependencyError(SpecdecError, ImportError):
    """A backend or drafter needs an optional dependency that is not installed."""


class IncompatibleDrafterError(SpecdecError, ValueError):
    """A drafter checkpoint was trained for another target model."""


def install_command(extra: str) -> str:
    """The command that installs ``extra``: the checkout's setup script where specdec runs from
    a source checkout's own ``.venv`` (the script pins torch's version and adds to what
    ``.venv`` holds), else pip."""
    root = Path(__file__).resolve().parents[1]
    if (root / "scripts" / "setup.sh").is_file() and Path(sys.prefix).resolve() == (
        root / ".venv"
    ).resolve():
        return f"bash scripts/setup.sh {extra} (in {root})"
    return f"pip install 'specdec[{extra}]'"


def require(module: str, *, extra: str, feature: str):
    """Import ``module`` or raise MissingDependencyError naming the extra to install."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise MissingDependencyError(
            f"{feature} needs the '{module}' package, which is not installed: "
            f"{install_command(extra)}"
        ) from exc


class TargetBusyError(SpecdecError, RuntimeError):
    """A loaded target is already running a generation (another stream or thread uses it)."""


class CorruptFileError(SpecdecError, ValueError):
    """A file specdec reads (a config, a weights file) is damaged or not in the expected format."""


class ModelLoadError(SpecdecError, RuntimeError):
    """A backend could not load a model (a device that is not available, an unsupported model
    ...)."""


class CacheError(SpecdecError):
    """The specdec cache holds damaged data that could not be repaired."""


class TrainingOutputError(SpecdecError, ValueError):
    """``specdec train --out`` points at a folder training must not write into as asked."""


class TrainingInterrupted(SpecdecError):
    """Training stopped at a signal (Ctrl-C, SIGTERM) after saving its state."""


class PluginError(SpecdecError, TypeError):
    """A plugin is malformed: a hook that is not a specdec hook, a registration with wrong
    arguments."""


class PluginConflictError(SpecdecError, LookupError):
    """Two plugins registered one name; the message names both distributions and how to disable
    one."""


class PluginOutputError(SpecdecError, ValueError):
    """A drafter, tree builder or verifier returned a value that breaks its contract; the message
    names the plugin that produced it."""
