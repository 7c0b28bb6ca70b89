"""Registers the ReDrafter drafter with specdec (entry point ``specdec: redrafter``)."""

from __future__ import annotations

from specdec.checkpoints import check_target, require_checkpoint
from specdec.hookspecs import hookimpl


def _numpy_redrafter(target, checkpoint=None, *, beam_width=None, beam_length=None, sample=False):
    from specdec_redrafter.checkpoint import load_redrafter_checkpoint
    from specdec_redrafter.reference import RedrafterDrafter

    checkpoint = require_checkpoint("redrafter", checkpoint, target, package="specdec_redrafter")
    config, weights = load_redrafter_checkpoint(checkpoint)
    check_target(config, target, drafter="ReDrafter")
    return RedrafterDrafter(
        config, weights, embed_tokens=target.embed_tokens, lm_head=target.lm_head,
        beam_width=beam_width, beam_length=beam_length, sample=sample,
    )


def _torch_redrafter(target, checkpoint=None, *, beam_width=None, beam_length=None, sample=False):
    from specdec.errors import require

    require("torch", extra="torch", feature="the torch ReDrafter")
    from specdec_redrafter.checkpoint import load_redrafter_checkpoint
    from specdec_redrafter.torch import TorchRedrafterDrafter

    checkpoint = require_checkpoint("redrafter", checkpoint, target, package="specdec_redrafter")
    config, weights = load_redrafter_checkpoint(checkpoint)
    check_target(config, target, drafter="ReDrafter")
    return TorchRedrafterDrafter(
        config, weights, embed_tokens=target.embed_tokens, lm_head=target.lm_head,
        beam_width=beam_width, beam_length=beam_length, sample=sample,
    )


def _mlx_redrafter(target, checkpoint=None, *, beam_width=None, beam_length=None, sample=False):
    from specdec.errors import require

    require("mlx.core", extra="mlx", feature="the mlx ReDrafter")
    from specdec_redrafter.checkpoint import load_redrafter_checkpoint
    from specdec_redrafter.mlx import MlxRedrafterDrafter

    checkpoint = require_checkpoint("redrafter", checkpoint, target, package="specdec_redrafter")
    config, weights = load_redrafter_checkpoint(checkpoint)
    check_target(config, target, drafter="ReDrafter")
    return MlxRedrafterDrafter(
        config, weights, embed_tokens=target.embed_tokens, lm_head=target.lm_head,
        beam_width=beam_width, beam_length=beam_length, sample=sample,
    )


@hookimpl
def specdec_register_drafters(register):
    register("redrafter", "numpy", _numpy_redrafter)
    register("redrafter", "torch", _torch_redrafter)
    register("redrafter", "mlx", _mlx_redrafter)
