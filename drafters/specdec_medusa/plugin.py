"""Registers the Medusa drafter and its static tree builder with specdec
(entry point ``specdec: medusa``)."""

from __future__ import annotations

import attrs

from specdec.plugins.hookspecs import hookimpl
from specdec.plugins.support import backend_class, lazy_call, load_trained
from specdec.plugins.specs import DrafterSpec, Layout
from specdec_medusa.checkpoint import load_medusa_checkpoint

DRAFTERS = {
    "numpy": "specdec_medusa.reference:MedusaDrafter",
    "torch": "specdec_medusa.torch:TorchMedusaDrafter",
    "mlx": "specdec_medusa.mlx:MlxMedusaDrafter",
}
TREE_BUILDERS = {
    "numpy": "specdec_medusa.tree:StaticTreeBuilder",
    "torch": "specdec_medusa.torch:TorchStaticTreeBuilder",
    "mlx": "specdec_medusa.mlx:MlxStaticTreeBuilder",
}


def _placement(backend: str, target) -> dict:
    """Where the heads compute: the target's dtype (and device on torch)."""
    if backend == "torch":
        return dict(dtype=target.dtype, device=target.device)
    return dict(dtype=target.dtype) if backend == "mlx" else {}


def _drafter_factory(backend_name: str):
    def medusa(target, checkpoint=None, *, backend=None, top_t=None, choices=None):
        drafter_class = backend_class(backend_name, DRAFTERS, feature="the Medusa drafter")
        config, weights = load_trained(
            "medusa", "Medusa", "specdec_medusa", load_medusa_checkpoint, checkpoint, target
        )
        if choices is not None:
            config = attrs.evolve(config, choices=choices)
        return drafter_class(
            config, weights, lm_head=target.lm_head, top_t=top_t, **_placement(backend_name, target)
        )

    return medusa


def _tree_factory(backend: str):
    def medusa_tree(choices):
        return backend_class(backend, TREE_BUILDERS, feature="the Medusa tree builder")(choices)

    return medusa_tree


def _evaluation_task(checkpoint, target, overrides):
    from specdec_medusa.train import MedusaTask  # optional: torch (train extra)

    config, weights = load_medusa_checkpoint(checkpoint)
    task = MedusaTask(attrs.evolve(config, **overrides), lm_head=target.lm_head)
    task.module.load_weights(weights)
    return task


LAYOUTS = (
    Layout(
        name="fasterdecoding",
        aliases=("tensorrt-llm", "trtllm"),
        detect=lazy_call("specdec_medusa.export_read", "detect_fasterdecoding"),
        read=lazy_call("specdec_medusa.export_read", "read_fasterdecoding"),
        write=lazy_call("specdec_medusa.export", "write_fasterdecoding"),
    ),
    Layout(
        name="vllm",
        detect=lazy_call("specdec_medusa.export_read", "detect_vllm"),
        read=lazy_call("specdec_medusa.export_read", "read_vllm"),
        write=lazy_call("specdec_medusa.export", "write_vllm"),
    ),
)

SPEC = DrafterSpec(
    name="medusa",
    model_type="specdec_medusa",
    implementations={b: _drafter_factory(b) for b in DRAFTERS},
    make_random_checkpoint=lazy_call("specdec_medusa.checkpoint", "make_random_medusa"),
    train=lazy_call("specdec_medusa.train", "train_medusa"),
    evaluation_task=_evaluation_task,
    load_checkpoint=lazy_call("specdec_medusa.checkpoint", "load_medusa_checkpoint"),
    save_checkpoint=lazy_call("specdec_medusa.checkpoint", "save_medusa"),
    package="specdec_medusa",
    layouts=LAYOUTS,
    tree_size=lazy_call("specdec_medusa.config", "tree_size"),
)


@hookimpl
def specdec_register_drafter_specs(register):
    register(SPEC)


@hookimpl
def specdec_register_tree_builders(register):
    for backend in TREE_BUILDERS:
        register("medusa_tree", backend, _tree_factory(backend))
