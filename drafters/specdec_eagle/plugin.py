"""Registers the EAGLE drafter with specdec (entry point ``specdec: eagle``)."""

from __future__ import annotations

import attrs

from specdec.plugins.hookspecs import hookimpl
from specdec.plugins.support import backend_class, lazy_call, load_trained
from specdec.plugins.specs import CliOption, DrafterSpec
from specdec_eagle.checkpoint import load_eagle_checkpoint

CLASSES = {
    "numpy": "specdec_eagle.reference:EagleDrafter",
    "torch": "specdec_eagle.torch:TorchEagleDrafter",
    "mlx": "specdec_eagle.mlx:MlxEagleDrafter",
}


def _factory(backend_name: str):
    def eagle(
        target,
        checkpoint=None,
        *,
        backend=None,
        tree_top_k=None,
        depth=None,
        total_tokens=None,
        int8=None,
    ):
        """``tree_top_k``: the children each expanded node proposes
        (``top_k`` is generate's sampling option); ``int8``: the drafter's products with int8
        weights where measured faster (None), always (True, torch on a CPU) or never (False)."""
        drafter_class = backend_class(backend_name, CLASSES, feature="the EAGLE drafter")
        config, weights = load_trained(
            "eagle", "EAGLE", "specdec_eagle", load_eagle_checkpoint, checkpoint, target
        )
        return drafter_class(
            config,
            weights,
            embed_tokens=target.embed_tokens,
            lm_head=target.lm_head,
            top_k=tree_top_k,
            depth=depth,
            total_tokens=total_tokens,
            int8=int8,
        )

    return eagle


def _evaluation_task(checkpoint, target, overrides):
    from specdec_eagle.train import EagleTask  # optional: torch (train extra)

    config, weights = load_eagle_checkpoint(checkpoint)
    task = EagleTask(
        attrs.evolve(config, **overrides),
        embed_tokens=target.embed_tokens,
        lm_head=target.lm_head,
        shortlist=weights.get("vocab_shortlist"),
    )
    task.module.load_weights(weights)
    return task


# the tree settings specdec plan searches, in this order (specdec.bench.tree_planner)
TREE_OPTIONS = {
    "total_tokens": (4, 6, 8, 12, 16, 24),
    "depth": (2, 3, 4, 5, 6),
    "tree_top_k": (2, 4, 8),
}

SPEC = DrafterSpec(
    name="eagle",
    model_type="specdec_eagle",
    implementations={b: _factory(b) for b in CLASSES},
    make_random_checkpoint=lazy_call("specdec_eagle.checkpoint", "make_random_eagle"),
    tree_options=TREE_OPTIONS,
    train=lazy_call("specdec_eagle.train", "train_eagle"),
    evaluation_task=_evaluation_task,
    train_options=(
        CliOption(
            flag="--top-k",
            type=int,
            default=4,
            help="EAGLE tree: children per expanded node and frontier width",
        ),
        CliOption(flag="--depth", type=int, default=3, help="EAGLE tree: drafted levels"),
        CliOption(
            flag="--total-tokens",
            type=int,
            default=12,
            help="EAGLE tree: drafted nodes the target verifies",
        ),
        CliOption(
            flag="--window",
            type=int,
            default=64,
            help="EAGLE training: positions per training window",
        ),
        CliOption(
            flag="--noise",
            type=float,
            default=0.1,
            help="EAGLE training: uniform noise on input features",
        ),
        CliOption(
            flag="--feature-weight",
            type=float,
            default=1.0,
            help="EAGLE training: weight of the feature loss",
        ),
        CliOption(
            flag="--ce-weight",
            type=float,
            default=0.1,
            help="EAGLE training: weight of the cross-entropy",
        ),
        CliOption(
            flag="--unroll",
            type=int,
            default=1,
            help="EAGLE training: drafting steps per position (later ones read the draft's own "
            "features)",
        ),
    ),
    default_shortlist=8192,
    pairs_with_lookup=True,
    load_checkpoint=lazy_call("specdec_eagle.checkpoint", "load_eagle_checkpoint"),
    save_checkpoint=lazy_call("specdec_eagle.checkpoint", "save_eagle"),
    package="specdec_eagle",
    tree_size=lazy_call("specdec_eagle.config", "tree_size"),
)


@hookimpl
def specdec_register_drafter_specs(register):
    register(SPEC)
