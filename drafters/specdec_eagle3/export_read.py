"""Reading EAGLE-3 heads in the SpecForge and speculators layouts (``specdec_eagle3.export``
describes both): ``detect_*`` recognises a folder's layout from its config.json, ``read_*`` turns
it into specdec's checkpoint (config, float64 weights, notes), with the optional tensors the
authors' trainers save, and names any mismatch between tensors and config in the file's own keys.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

import attrs
import numpy as np
from safetensors.numpy import load_file

from specdec.errors import CorruptFileError, InvalidInputError
from specdec.models.files import read_json, read_torch_tensors
from specdec_eagle3.config import Eagle3Config, check_weights
from specdec_eagle3.export import (
    SPECFORGE_ARCHITECTURE,
    SPECULATORS_ARCHITECTURE,
    UNSUPPORTED_FLAGS,
    VERIFIER_TENSORS,
)

__all__ = ["detect_specforge", "detect_speculators", "read_specforge", "read_speculators"]


def _speculative_tokens(top: dict) -> int | None:
    """The tokens a speculators config's first proposal method drafts
    (``speculators_config.proposal_methods[0].speculative_tokens``; vLLM's chain length), or
    None where it says none."""
    methods = (top.get("speculators_config") or {}).get("proposal_methods") or [{}]
    value = methods[0].get("speculative_tokens") if isinstance(methods[0], dict) else None
    return int(value) if isinstance(value, int) and value > 0 else None


def _load_tensors(folder: Path) -> dict[str, np.ndarray]:
    if (folder / "model.safetensors").is_file():
        return load_file(str(folder / "model.safetensors"))
    if (folder / "pytorch_model.bin").is_file():
        state = read_torch_tensors(folder / "pytorch_model.bin")  # torch's safe unpickler only
        return {
            name: tensor.float().numpy() if tensor.is_floating_point() else tensor.numpy()
            for name, tensor in state.items()
        }
    raise InvalidInputError(f"{folder} holds no model.safetensors or pytorch_model.bin")


def _flag(name: str, *sources: Mapping[str, Any]) -> bool:
    return any(bool(source.get(name)) for source in sources if isinstance(source, Mapping))


def _file_name(name: str, prefix: str) -> str:
    """specdec's tensor name as the layout's file spells it (``midlayer.`` -> ``prefix``)."""
    return prefix + name.removeprefix("midlayer.") if name.startswith("midlayer.") else name


def _check_file_tensors(folder: Path, config: Eagle3Config, raw: Mapping, prefix: str) -> None:
    """The file's tensors are the ones its config.json describes, each of its shape; a mismatch is
    named in the file's own keys (``{prefix}*``)."""
    expected = {
        _file_name(name, prefix): shape
        for name, shape in config.weight_shapes().items()
        if name != "d2t"
    }
    optional = {"d2t": (config.draft_vocab_size,), "t2d": (config.vocab_size,)}
    known = {**expected, **optional}
    missing = sorted(set(expected) - set(raw))
    unexpected = sorted(set(raw) - set(known))
    wrong = sorted(
        f"{name}: {tuple(np.shape(raw[name]))} != {tuple(shape)}"
        for name, shape in known.items()
        if name in raw and tuple(np.shape(raw[name])) != tuple(shape)
    )
    found = []
    if missing:
        found.append(f"missing {missing}")
    if unexpected:
        found.append(f"unexpected {unexpected}")
    if wrong:
        found.append(f"wrong shapes {wrong}")
    if found:
        sizes = (
            f"hidden_size {config.hidden_size}, heads {config.num_heads}/{config.num_kv_heads} of "
            f"{config.head_dim}, intermediate_size {config.intermediate_size}, vocab_size "
            f"{config.vocab_size}, draft_vocab_size {config.draft_vocab_size}"
        )
        raise CorruptFileError(
            f"{folder}: the tensors of its weights file do not match its config.json ({sizes}): "
            f"{'; '.join(found)}; check that config.json and the weights file belong to the same "
            "head"
        )


def _read(
    folder, layer: dict, top: dict, prefix: str, layer_ids: _LayerIds
) -> tuple[Eagle3Config, dict, list[str]]:
    folder = Path(folder)
    eagle = top.get("eagle_config") if isinstance(top.get("eagle_config"), dict) else {}
    for flag in UNSUPPORTED_FLAGS:
        if _flag(flag, top, layer, eagle):
            raise InvalidInputError(
                f"{folder} is an EAGLE-3.1 head ({flag}=true), which specdec's EAGLE-3 does not "
                "run; retrain or convert it without that flag"
            )
    if int(layer.get("num_hidden_layers", 1)) != 1:
        raise InvalidInputError(
            f"{folder} has {layer.get('num_hidden_layers')} draft layers; EAGLE-3 has one"
        )
    hidden = int(layer["hidden_size"])
    if int(top.get("target_hidden_size") or layer.get("target_hidden_size") or hidden) != hidden:
        raise InvalidInputError(
            f"{folder} drafts at hidden size {hidden} from a target of another width "
            "(target_hidden_size); specdec's EAGLE-3 needs them equal"
        )
    raw = dict(_load_tensors(folder))
    notes = []
    ignored = sorted(name for name in raw if name in VERIFIER_TENSORS)
    for name in ignored:
        del raw[name]
    if ignored:
        notes.append(f"{', '.join(ignored)} ignored: the verifier's own, which the engines skip")
    norm_before_fc = _flag("norm_before_fc", top, layer, eagle)
    if "input_norm.weight" in raw and not norm_before_fc:
        raise InvalidInputError(
            f"{folder} holds input_norm.weight, which its config.json does not turn on: set "
            '"norm_before_fc": true in config.json if the head was trained with it, else drop '
            "the tensor"
        )
    if norm_before_fc and "input_norm.weight" not in raw:
        raw["input_norm.weight"] = np.ones(3 * hidden)  # as the speculators loader initialises it
        notes.append("norm_before_fc without input_norm.weight: the norm's weights are ones")
    vocab = int(layer["vocab_size"])
    draft_vocab = top.get("draft_vocab_size") or layer.get("draft_vocab_size") or vocab
    if "lm_head.weight" not in raw:
        raise InvalidInputError(
            f"{folder} has no lm_head.weight; heads that share the target's LM head are not "
            "supported"
        )
    if "embed_tokens.weight" in raw:
        notes.append("embed_tokens.weight: the head drafts with its own token embedding")
    block = top.get("specdec") or {}
    fields = dict(
        vocab_size=vocab,
        hidden_size=hidden,
        draft_vocab_size=int(draft_vocab),
        hidden_layers=block["hidden_layers"] if "hidden_layers" in block else layer_ids.read(top),
        num_heads=int(layer["num_attention_heads"]),
        num_kv_heads=int(layer.get("num_key_value_heads", layer["num_attention_heads"])),
        head_dim=int(layer.get("head_dim") or hidden // int(layer["num_attention_heads"])),
        intermediate_size=int(layer["intermediate_size"]),
        rope_theta=float(layer.get("rope_theta", 10000.0)),
        rms_norm_eps=float(layer.get("rms_norm_eps", 1e-6)),
        norm_before_residual=bool(
            top.get("norm_before_residual", layer.get("norm_before_residual", False))
        ),
        own_embedding="embed_tokens.weight" in raw,
        norm_before_fc=norm_before_fc,
        target=block.get("target", {}),
    )
    fields.update({k: block[k] for k in ("top_k", "depth", "total_tokens") if k in block})
    proposed = _speculative_tokens(top)
    if "depth" not in block and proposed is not None:
        fields["depth"] = proposed
        notes.append(
            f"depth {proposed}: speculators_config's speculative_tokens (the tokens a chain "
            "drafts; the tree's other settings are specdec's defaults unless given per call)"
        )
    if layer.get("rope_scaling"):
        raise InvalidInputError(
            f"{folder} uses rope_scaling {layer['rope_scaling']}; specdec's EAGLE-3 layer has "
            "plain rotary positions"
        )
    try:
        config = Eagle3Config(**fields)
    except ValueError as exc:  # a value the config cannot take, named by its field
        if "hidden_layers" in str(exc) and "hidden_layers" not in block:
            raise CorruptFileError(
                f"{folder}/config.json: {layer_ids.key} {layer_ids.written(top)} must name "
                f"three ascending target layers (low, middle, high), {layer_ids.convention}; "
                "fix that value"
            ) from exc
        raise CorruptFileError(f"{folder}/config.json: {exc}; fix that value") from exc
    _check_file_tensors(folder, config, raw, prefix)
    weights = {
        ("midlayer." + name.removeprefix(prefix) if name.startswith(prefix) else name): np.asarray(
            array, dtype=np.float64
        )
        for name, array in raw.items()
        if name not in ("d2t", "t2d")
    }
    weights["d2t"] = _draft_offsets(folder, raw, int(draft_vocab), vocab, notes)
    try:
        check_weights(config, weights)  # the names and shapes are checked: d2t's values are left
    except ValueError as exc:
        raise CorruptFileError(
            f"{folder}: {exc}; write the file's d2t again from the head's draft vocabulary"
        ) from exc
    return config, weights, notes


def _draft_offsets(folder: Path, raw: Mapping, draft_vocab: int, vocab: int, notes: list):
    """The head's ``d2t`` (draft id i is target id i + d2t[i]): the file's own; else from its
    ``t2d`` mask (the draft ids are the masked target ids in order, as speculators and SpecForge
    build both from one sorted id list); else, for a draft vocabulary as large as the target's,
    zeros (the identity). A smaller draft vocabulary with neither cannot be read."""
    if "d2t" in raw:
        return np.asarray(raw["d2t"], dtype=np.int64)
    if "t2d" in raw:
        ids = np.flatnonzero(np.asarray(raw["t2d"]).astype(bool))
        if len(ids) != draft_vocab:
            raise CorruptFileError(
                f"{folder}: t2d marks {len(ids)} target tokens but draft_vocab_size is "
                f"{draft_vocab}, and there is no d2t to say which tokens are drafted; write d2t "
                "(int64 offsets: draft id i is target id i + d2t[i]) or a t2d that marks "
                f"{draft_vocab} tokens"
            )
        notes.append("no d2t: the draft vocabulary is read from t2d (its marked ids, in order)")
        return ids - np.arange(draft_vocab, dtype=np.int64)
    if draft_vocab != vocab:
        raise CorruptFileError(
            f"{folder}: the head drafts {draft_vocab} of the target's {vocab} tokens "
            "(draft_vocab_size) but holds neither d2t nor t2d to say which; write d2t (int64 "
            "offsets: draft id i is target id i + d2t[i]) or t2d (a mask over the target "
            "vocabulary)"
        )
    notes.append("no d2t: the draft vocabulary is the target's")
    return np.zeros(draft_vocab, dtype=np.int64)


@attrs.frozen
class _LayerIds:
    """Where a layout keeps the fused layers' ids, and its convention: ``read`` turns the ids
    as written into specdec's 0-based output-of-layer ``hidden_layers`` (None: not written;
    a ``specdec`` block's own ``hidden_layers`` wins over them)."""

    key: str
    convention: str
    path: tuple
    offset: int

    def written(self, top: Mapping):
        value = top
        for part in self.path:
            value = value.get(part) if isinstance(value, Mapping) else None
        return value

    def read(self, top: Mapping):
        ids = self.written(top)
        return None if ids is None else [int(i) - self.offset for i in ids]


SPECFORGE_LAYERS = _LayerIds(
    key="eagle_config.eagle_aux_hidden_state_layer_ids",
    convention="SGLang's 0-based output-of-layer ids (0: the first layer's output)",
    path=("eagle_config", "eagle_aux_hidden_state_layer_ids"),
    offset=0,
)
SPECULATORS_LAYERS = _LayerIds(
    key="eagle_aux_hidden_state_layer_ids",
    convention="vLLM's input-of-layer ids, from 1 (1: the first layer's output)",
    path=("eagle_aux_hidden_state_layer_ids",),
    offset=1,
)


def read_specforge(folder) -> tuple[Eagle3Config, dict[str, np.ndarray], list[str]]:
    top = read_json(Path(folder) / "config.json", what="drafter config")
    return _read(folder, top, top, "midlayer.", SPECFORGE_LAYERS)


def read_speculators(folder) -> tuple[Eagle3Config, dict[str, np.ndarray], list[str]]:
    top = read_json(Path(folder) / "config.json", what="drafter config")
    return _read(folder, top["transformer_layer_config"], top, "layers.0.", SPECULATORS_LAYERS)


def detect_specforge(folder: Path, config: Mapping[str, Any]) -> bool:
    return (
        "draft_vocab_size" in config
        and int(config.get("num_hidden_layers", 0)) == 1
        and (config.get("architectures") in ([SPECFORGE_ARCHITECTURE], ["LlamaForCausalLM"]))
    )


def detect_speculators(folder: Path, config: Mapping[str, Any]) -> bool:
    """speculators names its EAGLE-3 configs by ``speculators_model_type``; a config that lacks it
    but has the architecture and the nested layer config is read as one too."""
    if config.get("speculators_model_type") == "eagle3":
        return True
    return config.get("architectures") == [SPECULATORS_ARCHITECTURE] and isinstance(
        config.get("transformer_layer_config"), dict
    )
