"""Reading an EAGLE-3 head from llama.cpp's GGUF (the format: ``specdec_eagle3.llamacpp``): the
file found and recognised from its header alone (``gguf_file``, ``detect_gguf``), then its keys and
tensors checked and turned back into specdec's checkpoint (``read_gguf``), with the fix named
where specdec cannot run what the file holds."""

from __future__ import annotations

import struct
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from specdec.errors import CorruptFileError, InvalidInputError
from specdec.models.files import parse_json
from specdec.models.gguf_header import check_gguf, gguf_architecture
from specdec_eagle3.config import Eagle3Config, check_weights
from specdec_eagle3.llamacpp import ARCH, SPECDEC_KEY, TENSOR_NAMES, gguf_module, unpermute

__all__ = ["detect_gguf", "gguf_file", "read_gguf"]


def gguf_file(path) -> Path | None:
    """The GGUF file ``path`` is, or the one GGUF file a folder without config.json holds."""
    path = Path(path)
    if path.is_file():
        file = path
    elif path.is_dir() and not (path / "config.json").exists():
        found = sorted(path.glob("*.gguf"))
        if len(found) != 1:
            return None
        file = found[0]
    else:
        return None
    try:
        with open(file, "rb") as handle:
            magic = handle.read(4)
    except OSError:
        return None
    if magic != b"GGUF" and file.suffix.lower() != ".gguf":
        return None
    check_gguf(file)  # a damaged one is refused, naming it, before a reader trusts its header
    return file


def _architecture(file: Path) -> str | None:
    try:
        return gguf_architecture(file)  # the header alone: no second parse of the vocabulary
    except (ValueError, OSError, struct.error):
        return None


def detect_gguf(folder: Path, config: Mapping[str, Any]) -> bool:
    """A GGUF file (or a folder holding just one) of architecture ``eagle3``."""
    file = gguf_file(folder)
    return file is not None and _architecture(file) == ARCH


def _tensor(gguf, tensor) -> tuple[np.ndarray, str | None]:
    """A tensor's values as numpy (float or int, in numpy's axis order) and a note when they were
    dequantized."""
    kind = tensor.tensor_type
    plain = (gguf.GGMLQuantizationType.F32, gguf.GGMLQuantizationType.F16)
    ints = (
        gguf.GGMLQuantizationType.I8,
        gguf.GGMLQuantizationType.I16,
        gguf.GGMLQuantizationType.I32,
        gguf.GGMLQuantizationType.I64,
    )
    if kind in plain or kind in ints or kind == gguf.GGMLQuantizationType.F64:
        return np.asarray(tensor.data), None
    try:
        values = gguf.quants.dequantize(tensor.data, kind)
    except NotImplementedError as exc:
        raise InvalidInputError(
            f"tensor {tensor.name} is stored as {kind.name}, which the gguf package cannot "
            "dequantize: convert the head again as f32, f16 or bf16"
        ) from exc
    shape = tuple(int(n) for n in reversed(tensor.shape))
    note = (
        None
        if kind == gguf.GGMLQuantizationType.BF16
        else f"{tensor.name} dequantized from {kind.name}"
    )
    return np.asarray(values, dtype=np.float32).reshape(shape), note


def _check_absolute(file: Path, ids: np.ndarray) -> None:
    """``d2t`` must hold distinct ascending target ids; repeated values that are ascending as
    offsets are a converter that stored SpecForge's offsets (``target = i + d2t[i]``)."""
    steps = np.diff(ids)
    if steps.size and np.all(steps >= 0) and np.any(steps == 0) and ids.min() >= 0:
        raise InvalidInputError(
            f"{file} stores d2t as offsets (target id = i + d2t[i]), while llama.cpp's EAGLE-3 "
            "graph reads absolute target ids: convert the head again with a current "
            "convert_hf_to_gguf.py (it writes d2t + arange)"
        )


def _exact(block: Mapping[str, Any], name: str, stored) -> float:
    """A float key (stored as float32), or the exact value the specdec entry records for it when
    that rounds to the stored one (the key was not changed since)."""
    exact = block.get(name)
    if exact is not None and np.float32(exact) == np.float32(stored):
        return float(exact)
    return float(stored)


def read_gguf(path) -> tuple[Eagle3Config, dict[str, np.ndarray], list[str]]:
    """An EAGLE-3 head in llama.cpp's GGUF -> (config, float64 weights with int64 ``d2t``, notes).
    Refused with the fix: another architecture, a draft with its own token embedding or without
    its own LM head, llama3 rope scaling, partial rotary, layer ids specdec cannot fuse."""
    gguf = gguf_module()
    file = gguf_file(path)
    if file is None:
        raise InvalidInputError(
            f"{path} is not a GGUF file, nor a folder holding exactly one: pass the head's .gguf"
        )
    reader = gguf.GGUFReader(str(file))

    def value(key, default=None):
        field = reader.get_field(key)
        return default if field is None else field.contents()

    arch = value("general.architecture")
    if arch != ARCH:
        raise InvalidInputError(
            f"{file} is a GGUF of architecture {arch!r}, not an EAGLE-3 head (general.architecture "
            f"'{ARCH}'): pass the draft head's GGUF (the target model goes in model=)"
        )

    def key(name, default=None):
        return value(f"{ARCH}.{name}", default)

    required = ("embedding_length", "feed_forward_length", "attention.head_count")
    missing = [f"{ARCH}.{name}" for name in required if key(name) is None]
    if missing:
        raise InvalidInputError(
            f"{file} lacks {missing}, which llama.cpp's loader reads: convert the head again"
        )

    if int(key("block_count", 1)) != 1:
        raise InvalidInputError(
            f"{file} has {key('block_count')} draft layers (eagle3.block_count); EAGLE-3 has one"
        )
    hidden = int(key("embedding_length"))
    if int(key("target_hidden_size", hidden)) != hidden:
        raise InvalidInputError(
            f"{file} drafts at hidden size {hidden} from a target of width "
            f"{key('target_hidden_size')} (eagle3.target_hidden_size); specdec's EAGLE-3 needs "
            "them equal"
        )
    heads = int(key("attention.head_count"))
    kv_heads = int(key("attention.head_count_kv", heads))
    head_dim = int(key("attention.key_length", hidden // heads))
    if int(key("attention.value_length", head_dim)) != head_dim:
        raise InvalidInputError(
            f"{file} has keys of {head_dim} and values of {key('attention.value_length')} "
            "(eagle3.attention.key_length / value_length); specdec's EAGLE-3 needs them equal"
        )
    if int(key("rope.dimension_count", head_dim)) != head_dim:
        raise InvalidInputError(
            f"{file} rotates {key('rope.dimension_count')} of its {head_dim} head dimensions "
            "(eagle3.rope.dimension_count); specdec's EAGLE-3 rotates them all"
        )
    scaling = key("rope.scaling.type")
    if scaling not in (None, "none"):
        raise InvalidInputError(
            f"{file} uses rope scaling {scaling!r}; specdec's EAGLE-3 layer has plain rotary "
            "positions"
        )
    extract = key("extract_layers")
    if extract is None or len(extract) != 3:
        raise InvalidInputError(
            f"{file} fuses target layers {extract} (eagle3.extract_layers); EAGLE-3 fuses three"
        )
    if min(extract) < 1 or list(extract) != sorted(set(extract)):
        raise InvalidInputError(
            f"{file} fuses target layer inputs {list(extract)} (eagle3.extract_layers, llama.cpp's "
            "input-of-layer ids); specdec fuses the outputs of three distinct ascending layers, "
            "ids 1 and up (id 0 would be the token embedding)"
        )
    tokens = value("tokenizer.ggml.tokens")
    vocab = len(tokens) if tokens is not None else key("vocab_size")
    if vocab is None:
        raise InvalidInputError(
            f"{file} holds no vocabulary (tokenizer.ggml.tokens, eagle3.vocab_size): convert it "
            "again with the target given (--target-model-dir)"
        )
    tensors = {t.name: t for t in reader.tensors}
    by_gguf = {gguf_name: name for name, gguf_name in TENSOR_NAMES.items()}
    if "token_embd.weight" in tensors:
        raise InvalidInputError(
            f"{file} carries its own token embedding (token_embd.weight), which specdec reads "
            "from the SpecForge and speculators layouts but not from GGUF; convert the head to "
            "one of those"
        )
    if "output.weight" not in tensors:
        raise InvalidInputError(
            f"{file} has no output.weight; heads that share the target's LM head are not supported"
        )
    if "rope_freqs.weight" in tensors or "blk.0.rope_freqs.weight" in tensors:
        raise InvalidInputError(
            f"{file} scales its rotary frequencies (rope_freqs, llama3 rope scaling); specdec's "
            "EAGLE-3 layer has plain rotary positions"
        )
    unexpected = sorted(set(tensors) - set(by_gguf))
    if unexpected:
        raise InvalidInputError(
            f"{file} has tensors specdec's EAGLE-3 does not run: {unexpected} (e.g. fc_norm: an "
            "EAGLE-3.1 head); convert it without them"
        )
    notes, weights = [], {}
    for gguf_name, tensor in tensors.items():
        array, note = _tensor(gguf, tensor)
        if note:
            notes.append(note)
        name = by_gguf[gguf_name]
        if name == "d2t":
            ids = np.asarray(array, dtype=np.int64).reshape(-1)
            _check_absolute(file, ids)
            weights["d2t"] = ids - np.arange(len(ids), dtype=np.int64)  # absolute -> offsets
        else:
            weights[name] = np.asarray(array, dtype=np.float64)
    draft_vocab = int(weights["lm_head.weight"].shape[0])
    if "d2t" not in weights:
        weights["d2t"] = np.zeros(draft_vocab, dtype=np.int64)
        notes.append("no d2t: the draft vocabulary is the target's")
    for name, count in {
        "midlayer.self_attn.q_proj.weight": heads,
        "midlayer.self_attn.k_proj.weight": kv_heads,
    }.items():
        if name in weights:
            weights[name] = unpermute(weights[name], count)
    block = parse_json(
        value(SPECDEC_KEY) or "{}",
        what=f"{file}'s {SPECDEC_KEY} key",
        fix="convert or export the head again",
    )
    if not isinstance(block, dict):
        raise CorruptFileError(f"{file}'s {SPECDEC_KEY} key is not a JSON object: export it again")
    layers = block["hidden_layers"] if "hidden_layers" in block else [i - 1 for i in extract]
    fields = dict(
        vocab_size=int(vocab),
        hidden_size=hidden,
        draft_vocab_size=draft_vocab,
        hidden_layers=layers,
        num_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=head_dim,
        intermediate_size=int(key("feed_forward_length")),
        rope_theta=_exact(block, "rope_theta", key("rope.freq_base", 10000.0)),
        rms_norm_eps=_exact(block, "rms_norm_eps", key("attention.layer_norm_rms_epsilon", 1e-6)),
        norm_before_residual=bool(key("norm_before_residual", False)),
        target=block.get("target", {}),
    )
    fields.update({k: block[k] for k in ("top_k", "depth", "total_tokens") if k in block})
    config = Eagle3Config(**fields)
    check_weights(config, weights)
    return config, weights, notes
