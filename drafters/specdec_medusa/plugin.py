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


def _torch_medusa(target, checkpoint=None, *, top_t=None, choices=None):
    import attrs

    from specdec.errors import require

    require("torch", extra="torch", feature="the torch Medusa drafter")
    from specdec_medusa.checkpoint import load_medusa_checkpoint
    from specdec_medusa.torch import TorchMedusaDrafter

    checkpoint = require_checkpoint("medusa", checkpoint, target, package="specdec_medusa")
    config, weights = load_medusa_checkpoint(checkpoint)
    check_target(config, target, drafter="Medusa")
    if choices is not None:
        config = attrs.evolve(config, choices=choices)
    return TorchMedusaDrafter(config, weights, lm_head=target.lm_head, dtype=target.dtype, device=target.device,
                              top_t=top_t)


def _torch_static_tree(choices):
    from specdec.errors import require

    require("torch", extra="torch", feature="the torch Medusa tree builder")
    from specdec_medusa.torch import TorchStaticTreeBuilder

    return TorchStaticTreeBuilder(choices)


def _numpy_static_tree(choices):
    from specdec_medusa.tree import StaticTreeBuilder

    return StaticTreeBuilder(choices)


def _mlx_medusa(target, checkpoint=None, *, top_t=None, choices=None):
    import attrs

    from specdec.errors import require

    require("mlx.core", extra="mlx", feature="the mlx Medusa drafter")
    from specdec_medusa.checkpoint import load_medusa_checkpoint
    from specdec_medusa.mlx import MlxMedusaDrafter

    checkpoint = require_checkpoint("medusa", checkpoint, target, package="specdec_medusa")
    config, weights = load_medusa_checkpoint(checkpoint)
    check_target(config, target, drafter="Medusa")
    if choices is not None:
        config = attrs.evolve(config, choices=choices)
    return MlxMedusaDrafter(config, weights, lm_head=target.lm_head, dtype=target.dtype, top_t=top_t)


def _mlx_static_tree(choices):
    from specdec.errors import require

    require("mlx.core", extra="mlx", feature="the mlx Medusa tree builder")
    from specdec_medusa.mlx import MlxStaticTreeBuilder

    return MlxStaticTreeBuilder(choices)


@hookimpl
def specdec_register_drafters(register):
    register("medusa", "numpy", _numpy_medusa)
    register("medusa", "torch", _torch_medusa)
    register("medusa", "mlx", _mlx_medusa)


@hookimpl
def specdec_register_tree_builders(register):
    register("medusa_tree", "numpy", _numpy_static_tree)
    register("medusa_tree", "torch", _torch_static_tree)
    register("medusa_tree", "mlx", _mlx_static_tree)
