"""Writing an EAGLE-3 head as llama.cpp's GGUF (``specdec export --format gguf``); the format is
described in ``specdec_eagle3.llamacpp``."""

from __future__ import annotations

import json
import shlex
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from specdec.errors import InvalidInputError
from specdec.models.checkpoints import check_compatible
from specdec_eagle3.config import Eagle3Config, check_weights, draft_to_target, resolve_layers
from specdec_eagle3.export import no_options
from specdec_eagle3.llamacpp import (
    ARCH,
    FILE_NAMES,
    FILE_TYPES,
    SPECDEC_KEY,
    TENSOR_NAMES,
    gguf_module,
    permute,
    rotary_heads,
)
from specdec_eagle3.llamacpp_vocab import target_vocabulary

__all__ = ["write_gguf"]


def _specdec_block(config: Eagle3Config) -> dict[str, Any]:
    return {
        "top_k": config.top_k,
        "depth": config.depth,
        "total_tokens": config.total_tokens,
        "target": config.target,
        "hidden_layers": None if config.hidden_layers is None else list(config.hidden_layers),
        "rope_theta": config.rope_theta,  # the keys hold float32; these are exact
        "rms_norm_eps": config.rms_norm_eps,
    }


def write_gguf(
    config: Eagle3Config,
    weights: Mapping[str, np.ndarray],
    out,
    *,
    lm_head=None,
    dtype: str = "float32",
    choices=None,
    drop_shortlist: bool = False,
    model=None,
):
    """llama.cpp's GGUF (one file in ``out``) -> (notes, the ``llama-server`` command)."""
    no_options(choices, drop_shortlist)
    if dtype not in FILE_NAMES:
        raise InvalidInputError(f"dtype must be one of {sorted(FILE_NAMES)}, got {dtype!r}")
    gguf = gguf_module()
    check_weights(config, weights)
    carried = [
        name
        for name, flag in (
            ("embed_tokens.weight (its own token embedding)", config.own_embedding),
            ("input_norm.weight (norm_before_fc)", config.norm_before_fc),
        )
        if flag
    ]
    if carried:
        raise InvalidInputError(
            f"this EAGLE-3 head carries {' and '.join(carried)}, which llama.cpp's EAGLE-3 GGUF "
            "cannot hold; export --format speculators (vLLM) or specforge (SGLang) instead"
        )
    target = target_vocabulary(model)
    check_compatible(
        config,
        drafter="EAGLE-3",
        vocab_size=target["vocab_size"],
        hidden_size=target["hidden_size"],
        name=target["name"],
    )
    layers = resolve_layers(config, target["num_layers"]).hidden_layers
    notes = [
        target["vocab_note"],
        "q and k rows permuted for llama.cpp's rotary layout, as its converter does",
        "d2t written as absolute target ids (llama.cpp's meaning); t2d not written",
        (
            f"eagle3.extract_layers {[i + 1 for i in layers]}: llama.cpp's input-of-layer ids "
            "(specdec's output-of-layer hidden_layers + 1)"
        ),
        "llama.cpp drafts a chain of --spec-draft-n-max tokens, not the dynamic tree",
    ]
    if config.hidden_layers is None:
        notes.append(
            f"this head names no fused layers: written are the default three of the target's "
            f"{target['num_layers']} layers"
        )
    folder = Path(out)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / FILE_NAMES[dtype]
    writer = gguf.GGUFWriter(str(path), ARCH)
    if target["name"]:
        writer.add_name(f"EAGLE-3 draft for {target['name']}")
    writer.add_block_count(1)
    writer.add_context_length(int(config.target.get("max_position_embeddings", 8192)))
    writer.add_embedding_length(config.hidden_size)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_head_count(config.num_heads)
    writer.add_head_count_kv(config.num_kv_heads)
    writer.add_key_length(config.head_dim)
    writer.add_value_length(config.head_dim)
    writer.add_rope_freq_base(config.rope_theta)
    writer.add_layer_norm_rms_eps(config.rms_norm_eps)
    writer.add_file_type(getattr(gguf.LlamaFileType, FILE_TYPES[dtype]))
    writer.add_vocab_size(config.vocab_size)
    writer.add_rope_dimension_count(config.head_dim)
    writer.add_array(f"{ARCH}.extract_layers", [int(i) + 1 for i in layers])
    writer.add_uint32(f"{ARCH}.target_hidden_size", config.hidden_size)
    writer.add_bool(f"{ARCH}.norm_before_residual", config.norm_before_residual)
    writer.add_string(SPECDEC_KEY, json.dumps(_specdec_block(config), sort_keys=True))
    target["write_vocab"](writer)
    writer.add_quantization_version(gguf.GGML_QUANT_VERSION)
    heads = rotary_heads(config)
    for name, gguf_name in TENSOR_NAMES.items():
        if name == "d2t":
            ids = draft_to_target(weights["d2t"])
            writer.add_tensor(gguf_name, ids, raw_dtype=gguf.GGMLQuantizationType.I64)
            continue
        array = np.asarray(weights[name])
        if name in heads:
            array = permute(array, heads[name])
        if array.ndim == 1 or dtype == "float32":  # norms stay float32, as upstream's converter
            writer.add_tensor(gguf_name, np.ascontiguousarray(array, dtype=np.float32))
        elif dtype == "float16":
            writer.add_tensor(gguf_name, np.ascontiguousarray(array, dtype=np.float16))
        else:  # bfloat16: rounded to nearest even by the gguf package, as upstream's converter
            bf16 = gguf.GGMLQuantizationType.BF16
            packed = gguf.quants.quantize(np.ascontiguousarray(array, dtype=np.float32), bf16)
            writer.add_tensor(gguf_name, packed, raw_dtype=bf16)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    given = Path(str(model)).expanduser()
    if given.suffix == ".gguf" and given.is_file():
        target_gguf = shlex.quote(str(given.resolve()))
    else:
        target_gguf = "TARGET.gguf"
        notes.append(
            "TARGET.gguf in the command: the target's own GGUF (llama.cpp's convert_hf_to_gguf.py "
            "makes it from the Hugging Face folder; export with that file as --model to have it "
            "written)"
        )
    command = (
        f"llama-server -m {target_gguf} -md {path} --spec-type draft-eagle3 "
        f"--spec-draft-n-max {config.depth}"
    )
    return notes, (command,)
