"""Registers the draft-model drafter with specdec (entry point ``specdec: draft_model``).

``drafter="draft_model"`` with ``draft_model=FOLDER_OR_BUNDLED_NAME`` (a smaller model with the
target's tokenizer), ``draft_length=K`` (default 4) and ``sample`` (default True: when decoding
samples, the chain is drawn from the draft model and verified by rejection sampling). A folder
whose config.json has ``"model_type": "specdec_draft_model"`` and ``"draft_model"`` also works as
``drafter=FOLDER``. One implementation serves every backend: the draft model is loaded as a
second target on the target's backend (docs/algorithms/draft-model.md).
"""

from __future__ import annotations

from specdec.errors import InvalidInputError
from specdec.plugins.hookspecs import hookimpl
from specdec.plugins.support import lazy_call
from specdec.plugins.specs import DrafterSpec
from specdec_draftmodel.checkpoint import (
    DEFAULT_DRAFT_LENGTH,
    HOW_TO_PASS,
    load_draft_model,
    read_drafter_folder,
)
from specdec_draftmodel.drafter import DraftModelDrafter


def draft_model_factory(
    target, checkpoint=None, *, backend, draft_model=None, draft_length=None, sample=True
):
    saved = read_drafter_folder(checkpoint) if checkpoint is not None else {}
    source = draft_model if draft_model is not None else saved.get("draft_model")
    if source is None:
        raise InvalidInputError(f"drafter 'draft_model' needs a draft model: {HOW_TO_PASS}")
    if draft_length is None:
        draft_length = saved.get("draft_length", DEFAULT_DRAFT_LENGTH)
    if isinstance(draft_length, bool) or not isinstance(draft_length, int) or draft_length < 1:
        raise InvalidInputError(
            f"drafter 'draft_model': draft_length must be an integer >= 1, got {draft_length!r}"
        )
    draft, folder = load_draft_model(backend, target, source)
    return DraftModelDrafter(
        backend,
        target,
        draft,
        draft_length=draft_length,
        sample=sample,
        label=f"the draft model {folder}",
    )


SPEC = DrafterSpec(
    name="draft_model",
    model_type="specdec_draft_model",
    implementations={"*": draft_model_factory},
    make_random_checkpoint=lazy_call("specdec_draftmodel.checkpoint", "make_random_draft_model"),
)


@hookimpl
def specdec_register_drafter_specs(register):
    register(SPEC)
