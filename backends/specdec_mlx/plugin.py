"""Registers the ``mlx`` backend with specdec (entry point ``specdec: mlx``).

Importing this module does not import mlx: every factory checks for it first and raises
``MissingDependencyError`` (``pip install 'specdec[mlx]'``) when it is absent.
"""

from __future__ import annotations

from specdec.errors import require
from specdec.hookspecs import hookimpl


def require_mlx(feature: str = "the mlx backend") -> None:
    """Raise MissingDependencyError unless mlx and mlx-lm are importable."""
    require("mlx.core", extra="mlx", feature=feature)
    require("mlx_lm", extra="mlx", feature=feature)


def _backend():
    require_mlx()
    from specdec_mlx.backend import MlxBackend

    return MlxBackend()


def _prefix_tree(static_size: bool = False):
    require_mlx()
    from specdec_mlx.tree import PrefixTreeBuilder

    return PrefixTreeBuilder(static_size=static_size)


def _verifier(class_name: str):
    def factory():
        require_mlx()
        from specdec_mlx import verify

        return getattr(verify, class_name)()

    return factory


def _typical(epsilon: float = 0.09, delta: float = 0.3):
    require_mlx()
    from specdec_mlx.verify_lossy import TypicalVerifier

    return TypicalVerifier(epsilon=epsilon, delta=delta)


@hookimpl
def specdec_register_backends(register):
    register("mlx", _backend)


@hookimpl
def specdec_register_tree_builders(register):
    register("prefix_tree", "mlx", _prefix_tree)


@hookimpl
def specdec_register_verifiers(register):
    register("greedy", "mlx", _verifier("GreedyVerifier"), lossless=True)
    register("exact", "mlx", _verifier("ExactTreeVerifier"), lossless=True)
    register("rejection", "mlx", _verifier("RejectionVerifier"), lossless=True)
    register("redrafter_published", "mlx", _verifier("RedrafterPublishedVerifier"), lossless=False)
    register("typical", "mlx", _typical, lossless=False)
