"""Training against a control: the same run at learning rate 0 keeps the initial drafter, so
whatever the trained drafter gains over it is what training taught (not what the teacher's text
gives away). The teacher (``unpredictable_model``) rarely repeats itself, so the untrained
drafter accepts almost nothing."""

from __future__ import annotations

import pytest

from specdec_medusa.train import train_medusa
from specdec_redrafter.train import train_redrafter

COMMON = dict(
    steps=400,
    prompts=64,
    heldout_prompts=16,
    max_new_tokens=20,
    top_k=8,
    batch_size=32,
    progress=False,
)
RUNS = {
    "redrafter": (train_redrafter, dict(beam_width=3, beam_length=4)),
    "medusa": (train_medusa, dict(config_overrides=dict(choices="small8", head="full"))),
}
LEARNING_RATE = 1e-2


@pytest.fixture(scope="module")
def teacher_cache(tmp_path_factory):
    """One teacher-data cache for every run of the module (the data are made once)."""
    return tmp_path_factory.mktemp("teacher-cache")


@pytest.mark.parametrize("kind", sorted(RUNS))
def test_training_beats_the_same_run_at_learning_rate_zero(
    kind, unpredictable_model, unpredictable_prompt_source, teacher_cache, tmp_path
):
    train, options = RUNS[kind]

    def final(lr: float) -> dict:
        report = train(
            unpredictable_model,
            tmp_path / f"lr={lr}",
            lr=lr,
            cache=teacher_cache,
            prompt_source=unpredictable_prompt_source,
            **COMMON,
            **options,
        )
        return report["history"][-1]

    control, trained = final(0.0), final(LEARNING_RATE)
    assert control["heldout_sequences"] == trained["heldout_sequences"] == "all"
    # the teacher is not trivially predictable: the initial drafter accepts a token in under 1 step
    # of 5
    assert control["tokens_per_step"] < 1.2, control
    assert trained["tokens_per_step"] > control["tokens_per_step"] + 0.5, (trained, control)
    # at learning rate 0 the running loss is the initial weights' loss, i.e. the first step's
    assert trained["loss"] < 0.5 * control["loss"], (trained["loss"], control["loss"])
