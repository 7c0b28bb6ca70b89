"""Registers the ``mlx`` backend with specdec (entry point ``specdec: mlx``).

Importing this module does not import mlx: every factory checks for it first and raises
``MissingDependencyError`` naming ``pip install 'specdec[mlx]'``.
"""

from __future__ import annotations

from specdec.plugins.hookspecs import hookimpl
from specdec.plugins.support import lazy_factory, register_verifiers
from specdec_mlx.blas import prefer_system_blas


def _backend():
    """The mlx backend; on Linux an OpenBLAS is loaded for MLX first (``specdec_mlx.blas``, torch's
    native library before it so that torch keeps its own BLAS): only in processes that ask for
    this backend, since native libraries loaded later that call BLAS by name then get it."""
    prefer_system_blas()
    return lazy_factory("mlx", "specdec_mlx.backend:MlxBackend", feature="the mlx backend")()


@hookimpl
def specdec_register_backends(register):
    register("mlx", _backend)


@hookimpl
def specdec_register_tree_builders(register):
    register(
        "prefix_tree",
        "mlx",
        lazy_factory(
            "mlx", "specdec_mlx.tree:PrefixTreeBuilder", feature="the prefix tree builder"
        ),
    )


@hookimpl
def specdec_register_verifiers(register):
    register_verifiers(register, "mlx", "specdec_mlx")
