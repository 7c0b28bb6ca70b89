"""Helpers for plugins that provide one component on several backends.

A plugin names, per backend, the class that implements its component (``"module:Class"``);
``backend_class`` imports it only when asked for, after checking that the backend's framework is
installed, so registering costs no framework import.
"""

from __future__ import annotations

import importlib
import importlib.util
from typing import Callable

import numpy as np

from specdec.models.checkpoints import check_trained_for, require_checkpoint
from specdec.errors import CorruptFileError, install_command, require

# backend -> (framework modules to import first, the specdec extra that installs them)
FRAMEWORKS = {"torch": (("torch", "transformers"), "torch"), "mlx": (("mlx.core", "mlx_lm"), "mlx")}

# The verifiers every backend provides: name -> (class name, lossless). Lossless classes live in
# the backend's ``verify`` module, lossy ones in ``verify_lossy``.
VERIFIERS = {
    "greedy": ("GreedyVerifier", True),
    "exact": ("ExactTreeVerifier", True),
    "rejection": ("RejectionVerifier", True),
    "redrafter_published": ("RedrafterPublishedVerifier", False),
    "typical": ("TypicalVerifier", False),
}


def missing_framework(backend: str | None) -> str | None:
    """The pip command that installs ``backend``'s framework where it is not installed, else None
    (also for backends specdec knows no framework of); found without importing the framework."""
    if backend not in FRAMEWORKS:
        return None
    modules, extra = FRAMEWORKS[backend]
    if all(importlib.util.find_spec(module.partition(".")[0]) is not None for module in modules):
        return None
    return install_command(extra)


def backend_class(backend: str, classes: dict[str, str], *, feature: str):
    """The class implementing ``feature`` on ``backend``; a missing framework names its extra."""
    if backend in FRAMEWORKS:
        modules, extra = FRAMEWORKS[backend]
        where = f"the {backend} backend"
        for module in modules:
            require(
                module,
                extra=extra,
                feature=feature if where in feature else f"{feature} on {where}",
            )
    module, _, name = classes[backend].partition(":")
    return getattr(importlib.import_module(module), name)


def lazy_call(module: str, name: str) -> Callable:
    """A function that imports ``module`` when first called and calls its ``name``: a plugin's
    spec can point at heavy code without importing it at registration."""

    def call(*args, **kwargs):
        return getattr(importlib.import_module(module), name)(*args, **kwargs)

    call.__qualname__ = call.__name__ = name
    return call


def lazy_factory(backend: str, path: str, *, feature: str) -> Callable:
    """A factory that imports ``path`` ("module:Class") when first called and builds it."""

    def factory(**options):
        return backend_class(backend, {backend: path}, feature=feature)(**options)

    return factory


def register_verifiers(register, backend: str, package: str) -> None:
    """Register the five standard verifiers of ``backend`` from ``package.verify(_lossy)``."""
    for name, (class_name, lossless) in VERIFIERS.items():
        module = f"{package}.verify" if lossless else f"{package}.verify_lossy"
        register(
            name,
            backend,
            lazy_factory(backend, f"{module}:{class_name}", feature=f"the {name} verifier"),
            lossless=lossless,
        )


def load_trained(name: str, label: str, package: str, loader: Callable, checkpoint, target):
    """(config, weights) of the checkpoint given, or the one shipped for ``target``, checked
    against the target."""
    checkpoint = require_checkpoint(name, checkpoint, target, package=package)
    config, weights = loader(checkpoint)
    check_finite(weights, checkpoint)
    check_trained_for(config, target, drafter=label)
    return config, weights


def check_finite(weights, checkpoint) -> None:
    """Every float tensor of a drafter checkpoint holds finite values (NaN or infinite weights
    draft garbage that verification would only reject, silently)."""
    for name, array in weights.items():
        array = np.asarray(array)
        if np.issubdtype(array.dtype, np.floating) and not np.isfinite(array).all():
            raise CorruptFileError(
                f"drafter checkpoint {checkpoint}: tensor {name!r} holds NaN or infinite values; "
                "the checkpoint is damaged (restore it, or train it again)"
            )
