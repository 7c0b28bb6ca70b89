"""Registers the Medusa drafter and its static tree builder with specdec (entry point ``specdec: medusa``)."""

from __future__ import annotations

from specdec.checkpoints import check_target, require_checkpoint
from specdec.hookspecs import hookimpl


def _numpy_medusa(target, checkpoint=None, *, top_t=None, choices=None):
    import attrs

    from specdec_medusa.checkpoint import load_medusa_checkpoint
    from specdec_medusa.reference import MedusaDrafter

    checkpoint = require_checkpoint("medusa", checkpoint, target, package="specdec_medusa")
    config, weights = load_medusa_checkpoint(checkpoint)
    check_target(config, target, drafter="Medusa")
    if choices is not None:
        config = attrs.evolve(config, choices=choices)
    return MedusaDrafter(config, weights, lm_head=target.lm_head, top_t=top_t)


def _numpy_static_tree(choices):
    from specdec_medusa.tree import StaticTreeBuilder

    return StaticTreeBuilder(choices)


@hookimpl
def specdec_register_drafters(register):
    register("medusa", "numpy", _numpy_medusa)


@hookimpl
def specdec_register_tree_builders(register):
    register("medusa_tree", "numpy", _numpy_static_tree)
