"""Registers the EAGLE-3 drafter with specdec (entry point ``specdec: eagle3``)."""

from __future__ import annotations

import math
import sys

import attrs

from specdec.models.llama import LlamaConfig
from specdec.plugins.hookspecs import hookimpl
from specdec.plugins.support import backend_class, lazy_call, load_trained
from specdec.plugins.specs import CliOption, DrafterSpec, Layout
from specdec_eagle3.checkpoint import load_eagle3_checkpoint
from specdec_eagle3.config import draft_to_target, resolve_layers

CLASSES = {
    "numpy": "specdec_eagle3.reference:Eagle3Drafter",
    "torch": "specdec_eagle3.torch:TorchEagle3Drafter",
    "mlx": "specdec_eagle3.mlx:MlxEagle3Drafter",
}


def _factory(backend_name: str):
    def eagle3(
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
        (``top_k`` is generate's sampling option); ``int8``: as EAGLE's."""
        drafter_class = backend_class(backend_name, CLASSES, feature="the EAGLE-3 drafter")
        config, weights = load_trained(
            "eagle3", "EAGLE-3", "specdec_eagle3", load_eagle3_checkpoint, checkpoint, target
        )
        config = resolve_layers(config, int(target.num_layers))
        for line in layer_constant_notes(config, getattr(target, "config", None)) + part_notes(
            config
        ):
            print(line, file=sys.stderr, flush=True)
        return drafter_class(
            config,
            weights,
            embed_tokens=target.embed_tokens,
            top_k=tree_top_k,
            depth=depth,
            total_tokens=total_tokens,
            int8=int8,
        )

    return eagle3


def layer_constant_notes(config, target_config) -> list[str]:
    """A line per constant of the head's decoder layer (rotary base, norm epsilon) that differs
    from the target's: a hand-written head that left them out of its config.json read
    transformers' defaults (10000, 1e-6) where SmolLM2 has 100000 and 1e-5, with no word."""
    notes = []
    for name, default in (("rope_theta", 10000.0), ("rms_norm_eps", 1e-6)):
        head, target = getattr(config, name), getattr(target_config, name, None)
        if target is None or math.isclose(head, float(target), rel_tol=1e-6):
            continue
        why = (
            f" (a config.json without {name} reads {default:g}, transformers' default)"
            if math.isclose(head, default)
            else ""
        )
        notes.append(
            f"specdec: the EAGLE-3 head's {name} is {head:g} and the target's {target:g}{why}: "
            "give the value the head was trained with in its config.json"
        )
    return notes


def part_notes(config) -> list[str]:
    """A line per optional part of a published head that changes how it drafts (its own token
    embedding, a norm before its fc): `specdec import` said so, a head loaded by `drafter=` did
    not, so a user could not tell that the head's own embedding was read."""
    parts = [
        text
        for flag, text in (
            ("own_embedding", "its own token embedding (embed_tokens.weight), not the target's"),
            ("norm_before_fc", "a norm on the fused features before its fc (input_norm.weight)"),
        )
        if getattr(config, flag, False)
    ]
    return [f"specdec: the EAGLE-3 head drafts with {' and '.join(parts)}"] if parts else []


def _evaluation_task(checkpoint, target, overrides):
    from specdec_eagle3.task import Eagle3Task  # optional: torch (train extra)

    config, weights = load_eagle3_checkpoint(checkpoint)
    config = resolve_layers(config, LlamaConfig.from_folder(target.folder).num_hidden_layers)
    task = Eagle3Task(
        attrs.evolve(config, **overrides),
        embed_tokens=target.embed_tokens,
        ids=draft_to_target(weights["d2t"]),
    )
    task.module.load_weights(weights)
    return task


TRAIN_OPTIONS = (
    CliOption(
        flag="--draft-vocab",
        type=int,
        default=8192,
        help="EAGLE-3: draft vocabulary size, the target ids with the most teacher mass (0: all)",
    ),
    CliOption(
        flag="--top-k",
        type=int,
        default=4,
        help="EAGLE-3 tree: children per expanded node and frontier width",
    ),
    CliOption(flag="--depth", type=int, default=3, help="EAGLE-3 tree: drafted levels"),
    CliOption(
        flag="--total-tokens",
        type=int,
        default=12,
        help="EAGLE-3 tree: drafted nodes the target verifies",
    ),
    CliOption(
        flag="--window",
        type=int,
        default=64,
        help="EAGLE-3 training: positions per training window",
    ),
    CliOption(
        flag="--unroll",
        type=int,
        default=3,
        help="EAGLE-3 training-time test: steps per position (step j > 0 reads the draft's "
        "own outputs)",
    ),
    CliOption(
        flag="--unroll-decay",
        type=float,
        default=0.8,
        help="EAGLE-3 training: step j's loss weight is DECAY**j",
    ),
)

LAYOUTS = (
    Layout(
        name="specforge",
        aliases=("sglang", "tensorrt-llm", "trtllm"),
        detect=lazy_call("specdec_eagle3.export_read", "detect_specforge"),
        read=lazy_call("specdec_eagle3.export_read", "read_specforge"),
        write=lazy_call("specdec_eagle3.export", "write_specforge"),
        takes_model=True,  # optional: names the target in the printed sglang command
    ),
    Layout(
        name="speculators",
        aliases=("vllm",),
        detect=lazy_call("specdec_eagle3.export_read", "detect_speculators"),
        read=lazy_call("specdec_eagle3.export_read", "read_speculators"),
        write=lazy_call("specdec_eagle3.export", "write_speculators"),
        takes_model=True,  # optional: names the target in verifier.name_or_path
    ),
    Layout(
        name="gguf",
        aliases=("llama.cpp", "llamacpp"),
        detect=lazy_call("specdec_eagle3.llamacpp_read", "detect_gguf"),
        read=lazy_call("specdec_eagle3.llamacpp_read", "read_gguf"),
        write=lazy_call("specdec_eagle3.llamacpp_write", "write_gguf"),
        takes_model=True,
        dtypes=("float32", "float16", "bfloat16"),
    ),
)

# the tree settings specdec plan searches, in this order (specdec.bench.tree_planner)
TREE_OPTIONS = {
    "total_tokens": (4, 6, 8, 12, 16, 24),
    "depth": (2, 3, 4, 5, 6),
    "tree_top_k": (2, 4, 8),
}

SPEC = DrafterSpec(
    name="eagle3",
    model_type="specdec_eagle3",
    implementations={b: _factory(b) for b in CLASSES},
    make_random_checkpoint=lazy_call("specdec_eagle3.checkpoint", "make_random_eagle3"),
    pairs_with_lookup=False,
    tree_options=TREE_OPTIONS,
    train=lazy_call("specdec_eagle3.train", "train_eagle3"),
    evaluation_task=_evaluation_task,
    train_options=TRAIN_OPTIONS,
    takes_shortlist=False,  # --draft-vocab instead
    load_checkpoint=lazy_call("specdec_eagle3.checkpoint", "load_eagle3_checkpoint"),
    save_checkpoint=lazy_call("specdec_eagle3.checkpoint", "save_eagle3"),
    package="specdec_eagle3",
    layouts=LAYOUTS,
    tree_size=lazy_call("specdec_eagle3.config", "tree_size"),
)


@hookimpl
def specdec_register_drafter_specs(register):
    register(SPEC)
