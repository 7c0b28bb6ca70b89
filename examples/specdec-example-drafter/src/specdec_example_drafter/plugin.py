"""The specdec plugin: one DrafterSpec, ``ngram``, implemented once for every backend ("*")."""

from __future__ import annotations

import specdec
from specdec.plugins.specs import DrafterSpec


def make_ngram(target, checkpoint=None, *, backend, ngram=2, beam_width=None, beam_length=None):
    """The drafter factory: ``backend`` is the Backend object the target runs on; the keyword
    options are what ``specdec.generate(..., ngram=3)`` accepts (anything else is refused)."""
    from specdec_example_drafter.drafter import NgramDrafter

    if checkpoint is not None:
        raise specdec.InvalidInputError("drafter 'ngram' reads no checkpoint")
    return NgramDrafter(
        backend,
        target,
        ngram=ngram,
        beam_width=2 if beam_width is None else beam_width,
        beam_length=5 if beam_length is None else beam_length,
    )


SPEC = DrafterSpec(name="ngram", implementations={"*": make_ngram}, beam_options=True)


@specdec.hookimpl
def specdec_register_drafter_specs(register):
    register(SPEC)
