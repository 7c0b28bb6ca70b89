"""Helpers for plugins that provide one component on several backends.

A plugin names, per backend, the class that implements its component (``"module:Class"``);
``backend_class`` imports it only when asked for, after checking that the backend's framework is
installed, so registering costs no framework import.
"""

from __future__ import annotations

import importlib
from typing import Callable

from specdec.checkpoints import check_target, require_checkpoint
from specdec.errors import require

# backend -> (framework module to import first, the specdec extra that installs it)
FRAMEWORKS = {"torch": ("torch", "torch"), "mlx": ("mlx.core", "mlx")}


def backend_class(backend: str, classes: dict[str, str], *, feature: str):
    """The class implementing ``feature`` on ``backend``; a missing framework names its extra."""
    if backend in FRAMEWORKS:
        module, extra = FRAMEWORKS[backend]
        require(module, extra=extra, feature=f"{feature} on the {backend} backend")
    module, _, name = classes[backend].partition(":")
    return getattr(importlib.import_module(module), name)


def load_trained(name: str, label: str, package: str, loader: Callable, checkpoint, target):
    """(config, weights) of the checkpoint given, or the one shipped for ``target``, checked
    against the target."""
    checkpoint = require_checkpoint(name, checkpoint, target, package=package)
    config, weights = loader(checkpoint)
    check_target(config, target, drafter=label)
    return config, weights
