"""Errors that tell the user what is wrong and how to fix it."""

from __future__ import annotations


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


def require(module: str, *, extra: str, feature: str):
    """Import ``module`` or raise MissingDependencyError naming the extra to install."""
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise MissingDependencyError(
            f"{feature} needs the '{module}' package, which is not installed: pip install 'specdec[{extra}]'"
        ) from exc
