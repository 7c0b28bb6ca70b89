"""Registers the ReDrafter drafter with specdec (entry point ``specdec: redrafter``)."""

from __future__ import annotations

from specdec.hookspecs import hookimpl
from specdec.plugin_support import backend_class, load_trained

CLASSES = {
    "numpy": "specdec_redrafter.reference:RedrafterDrafter",
    "torch": "specdec_redrafter.torch:TorchRedrafterDrafter",
    "mlx": "specdec_redrafter.mlx:MlxRedrafterDrafter",
}


def _factory(backend: str):
    def redrafter(target, checkpoint=None, *, beam_width=None, beam_length=None, sample=False):
        from specdec_redrafter.checkpoint import load_redrafter_checkpoint

        drafter_class = backend_class(backend, CLASSES, feature="the ReDrafter drafter")
        config, weights = load_trained("redrafter", "ReDrafter", "specdec_redrafter", load_redrafter_checkpoint,
                                       checkpoint, target)
        return drafter_class(config, weights, embed_tokens=target.embed_tokens, lm_head=target.lm_head,
                             beam_width=beam_width, beam_length=beam_length, sample=sample)

    return redrafter


@hookimpl
def specdec_register_drafters(register):
    for backend in CLASSES:
        register("redrafter", backend, _factory(backend))
