"""Registers the ReDrafter drafter with specdec (entry point ``specdec: redrafter``)."""

from __future__ import annotations

from specdec.hookspecs import hookimpl
from specdec.plugin_support import backend_class, load_trained
from specdec.specs import CliOption, DrafterSpec, Layout

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


def _make_random(path, model_path, *, seed, **config):
    from specdec_redrafter.checkpoint import make_random_redrafter

    return make_random_redrafter(path, model_path, seed=seed, **config)


def _train(model, out, **options):
    from specdec_redrafter.train import train_redrafter

    return train_redrafter(model, out, **options)


def _evaluation_task(checkpoint, target, overrides):
    import attrs

    from specdec_redrafter.checkpoint import load_redrafter_checkpoint
    from specdec_redrafter.train import RedrafterTask

    config, weights = load_redrafter_checkpoint(checkpoint)
    task = RedrafterTask(attrs.evolve(config, **overrides), embed_tokens=target.embed_tokens, lm_head=target.lm_head)
    task.module.load_weights(weights)
    return task


def _lazy(module: str, name: str):
    """``module.name``, imported when first called (registering the plugin stays cheap)."""
    def call(*args, **kwargs):
        import importlib

        return getattr(importlib.import_module(module), name)(*args, **kwargs)

    return call


LAYOUTS = (Layout(name="apple", aliases=("tensorrt-llm", "trtllm"), detect=_lazy("specdec_redrafter.export", "detect_apple"),
                  read=_lazy("specdec_redrafter.export", "read_apple"),
                  write=_lazy("specdec_redrafter.export", "write_apple")),)

SPEC = DrafterSpec(
    name="redrafter", model_type="specdec_redrafter", implementations={b: _factory(b) for b in CLASSES},
    make_random_checkpoint=_make_random, train=_train, evaluation_task=_evaluation_task,
    train_options=(CliOption(flag="--beam-width", type=int, default=4, help="ReDrafter beam width"),
                   CliOption(flag="--beam-length", type=int, default=5, help="ReDrafter beam length, root included")),
    default_shortlist=8192, beam_options=True, pairs_with_lookup=True,
    load_checkpoint=_lazy("specdec_redrafter.checkpoint", "load_redrafter_checkpoint"),
    save_checkpoint=_lazy("specdec_redrafter.checkpoint", "save_redrafter"), package="specdec_redrafter",
    layouts=LAYOUTS,
)


@hookimpl
def specdec_register_drafter_specs(register):
    register(SPEC)
