"""Registers the ``torch`` backend with specdec (entry point ``specdec: torch``).

This module imports neither torch nor transformers: every factory imports them when called, and
a missing torch raises ``MissingDependencyError`` naming ``pip install 'specdec[torch]'``.
"""

from __future__ import annotations

from specdec.plugins.hookspecs import hookimpl
from specdec.plugins.support import lazy_factory, register_verifiers


@hookimpl
def specdec_register_backends(register):
    register(
        "torch",
        lazy_factory("torch", "specdec_torch.backend:TorchBackend", feature="the torch backend"),
    )


@hookimpl
def specdec_register_tree_builders(register):
    register(
        "prefix_tree",
        "torch",
        lazy_factory(
            "torch", "specdec_torch.tree:TorchPrefixTreeBuilder", feature="the prefix tree builder"
        ),
    )


@hookimpl
def specdec_register_verifiers(register):
    register_verifiers(register, "torch", "specdec_torch")
