"""Registers the ``torch`` backend with specdec (entry point ``specdec: torch``).

This module imports neither torch nor transformers: every factory imports them when called, and
a missing torch raises ``MissingDependencyError`` naming ``pip install 'specdec[torch]'``.
"""

from __future__ import annotations

from specdec.errors import require
from specdec.hookspecs import hookimpl


def require_torch() -> None:
    """Import torch or raise MissingDependencyError with the install command."""
    require("torch", extra="torch", feature="the torch backend")


def _backend():
    require_torch()
    from specdec_torch.backend import TorchBackend

    return TorchBackend()


def _prefix_tree():
    require_torch()
    from specdec_torch.tree import TorchPrefixTreeBuilder

    return TorchPrefixTreeBuilder()


def _greedy():
    require_torch()
    from specdec_torch.verify import GreedyVerifier

    return GreedyVerifier()


def _exact():
    require_torch()
    from specdec_torch.verify import ExactTreeVerifier

    return ExactTreeVerifier()


def _rejection():
    require_torch()
    from specdec_torch.verify import RejectionVerifier

    return RejectionVerifier()


def _redrafter_published():
    require_torch()
    from specdec_torch.verify_lossy import RedrafterPublishedVerifier

    return RedrafterPublishedVerifier()


def _typical(epsilon: float = 0.09, delta: float = 0.3):
    require_torch()
    from specdec_torch.verify_lossy import TypicalVerifier

    return TypicalVerifier(epsilon=epsilon, delta=delta)


@hookimpl
def specdec_register_backends(register):
    register("torch", _backend)


@hookimpl
def specdec_register_tree_builders(register):
    register("prefix_tree", "torch", _prefix_tree)


@hookimpl
def specdec_register_verifiers(register):
    register("greedy", "torch", _greedy, lossless=True)
    register("exact", "torch", _exact, lossless=True)
    register("rejection", "torch", _rejection, lossless=True)
    register("redrafter_published", "torch", _redrafter_published, lossless=False)
    register("typical", "torch", _typical, lossless=False)
