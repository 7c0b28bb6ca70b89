"""Registers the EAGLE-3 drafter with specdec (entry point ``specdec: eagle3``)."""

from __future__ import annotations

from specdec.plugins.hookspecs import hookimpl
from specdec.plugins.support import backend_class, lazy_call, load_trained
from specdec.plugins.specs import DrafterSpec, Layout

CLASSES = {
    "numpy": "specdec_eagle3.reference:Eagle3Drafter",
    "torch": "specdec_eagle3.torch:TorchEagle3Drafter",
    "mlx": "specdec_eagle3.mlx:MlxEagle3Drafter",
}


def _factory(backend_name: str):
    def eagle3(target, checkpoint=None, *, backend=None, tree_top_k=None, depth=None, total_tokens=None):
        """``tree_top_k``: the children each expanded node proposes (``top_k`` is generate's sampling option)."""
        from specdec_eagle3.checkpoint import load_eagle3_checkpoint
        from specdec_eagle3.config import resolve_layers

        drafter_class = backend_class(backend_name, CLASSES, feature="the EAGLE-3 drafter")
        config, weights = load_trained("eagle3", "EAGLE-3", "specdec_eagle3", load_eagle3_checkpoint, checkpoint, target)
        config = resolve_layers(config, int(target.num_layers))
        return drafter_class(config, weights, embed_tokens=target.embed_tokens, top_k=tree_top_k, depth=depth,
                             total_tokens=total_tokens)

    return eagle3


LAYOUTS = (
    Layout(name="specforge", aliases=("sglang", "tensorrt-llm", "trtllm"),
           detect=lazy_call("specdec_eagle3.export", "detect_specforge"),
           read=lazy_call("specdec_eagle3.export", "read_specforge"),
           write=lazy_call("specdec_eagle3.export", "write_specforge")),
    Layout(name="speculators", aliases=("vllm",), detect=lazy_call("specdec_eagle3.export", "detect_speculators"),
           read=lazy_call("specdec_eagle3.export", "read_speculators"),
           write=lazy_call("specdec_eagle3.export", "write_speculators")),
)

SPEC = DrafterSpec(
    name="eagle3", model_type="specdec_eagle3", implementations={b: _factory(b) for b in CLASSES},
    make_random_checkpoint=lazy_call("specdec_eagle3.checkpoint", "make_random_eagle3"),
    pairs_with_lookup=False,
    load_checkpoint=lazy_call("specdec_eagle3.checkpoint", "load_eagle3_checkpoint"),
    save_checkpoint=lazy_call("specdec_eagle3.checkpoint", "save_eagle3"), package="specdec_eagle3",
    layouts=LAYOUTS, tree_size=lazy_call("specdec_eagle3.config", "tree_size"),
)


@hookimpl
def specdec_register_drafter_specs(register):
    register(SPEC)
