"""Registers the ReDrafter drafter with specdec (entry point ``specdec: redrafter``)."""

from __future__ import annotations

import attrs

from specdec.plugins.hookspecs import hookimpl
from specdec.plugins.support import backend_class, lazy_call, load_trained
from specdec.plugins.specs import CliOption, DrafterSpec, Layout
from specdec_redrafter.checkpoint import load_redrafter_checkpoint

CLASSES = {
    "numpy": "specdec_redrafter.reference:RedrafterDrafter",
    "torch": "specdec_redrafter.torch:TorchRedrafterDrafter",
    "mlx": "specdec_redrafter.mlx:MlxRedrafterDrafter",
}


def _factory(backend_name: str):
    def redrafter(
        target,
        checkpoint=None,
        *,
        backend=None,
        beam_width=None,
        beam_length=None,
        sample=False,
        int8=None,
    ):
        drafter_class = backend_class(backend_name, CLASSES, feature="the ReDrafter drafter")
        config, weights = load_trained(
            "redrafter",
            "ReDrafter",
            "specdec_redrafter",
            load_redrafter_checkpoint,
            checkpoint,
            target,
        )
        return drafter_class(
            config,
            weights,
            embed_tokens=target.embed_tokens,
            lm_head=target.lm_head,
            beam_width=beam_width,
            beam_length=beam_length,
            sample=sample,
            int8=int8,
        )

    return redrafter


def _evaluation_task(checkpoint, target, overrides):
    from specdec_redrafter.train import RedrafterTask  # optional: torch (train extra)

    config, weights = load_redrafter_checkpoint(checkpoint)
    # drafting evaluates with it, as inference does
    shortlist = weights.pop("vocab_shortlist", None)
    task = RedrafterTask(
        attrs.evolve(config, **overrides),
        embed_tokens=target.embed_tokens,
        lm_head=target.lm_head,
        shortlist=shortlist,
    )
    task.module.load_weights(weights)
    return task


LAYOUTS = (
    Layout(
        name="apple",
        aliases=("tensorrt-llm", "trtllm"),
        detect=lazy_call("specdec_redrafter.export", "detect_apple"),
        read=lazy_call("specdec_redrafter.export", "read_apple"),
        write=lazy_call("specdec_redrafter.export", "write_apple"),
    ),
)

SPEC = DrafterSpec(
    name="redrafter",
    model_type="specdec_redrafter",
    implementations={b: _factory(b) for b in CLASSES},
    make_random_checkpoint=lazy_call("specdec_redrafter.checkpoint", "make_random_redrafter"),
    train=lazy_call("specdec_redrafter.train", "train_redrafter"),
    evaluation_task=_evaluation_task,
    train_options=(
        CliOption(flag="--beam-width", type=int, default=4, help="ReDrafter beam width"),
        CliOption(
            flag="--beam-length", type=int, default=5, help="ReDrafter beam length, root included"
        ),
        CliOption(
            flag="--draft-layers",
            type=int,
            default=1,
            help="residual blocks between the recurrence and the head (more data carries more)",
        ),
    ),
    default_shortlist=8192,
    beam_options=True,
    pairs_with_lookup=True,
    load_checkpoint=lazy_call("specdec_redrafter.checkpoint", "load_redrafter_checkpoint"),
    save_checkpoint=lazy_call("specdec_redrafter.checkpoint", "save_redrafter"),
    package="specdec_redrafter",
    layouts=LAYOUTS,
    tree_size=lazy_call("specdec_redrafter.config", "tree_size"),
)


@hookimpl
def specdec_register_drafter_specs(register):
    register(SPEC)
