"""ReDrafter in the layout of Apple's reference implementation (apple/ml-recurrent-drafter), which
TensorRT-LLM's ReDrafter converter (``examples/redrafter/convert_checkpoint.py``) reads.

Upstream layout (``recurrent_drafting/modeling_drafter.py`` and ``configuration_drafter.py``;
``save_pretrained`` writes ``config.json`` + ``model.safetensors``), E = exit_dim, H = hidden_size,
L = num_draft_layers, V = vocab_size:

| name | shape | present when |
|---|---|---|
| ``input_proj.weight``, ``input_proj.bias`` | (E, 2H), (E,) | ``2H != E`` |
| ``lm_head.{i}.linear.weight``, ``.bias`` | (E, E), (E,) | ``i < L`` |
| ``lm_head.{L}.weight`` | (V, E) | always (the drafter's own head, no bias) |
| ``rnn_u.weight``, ``rnn_u.bias``, ``rnn_w.weight`` | (H, H), (H,), (H, H) | ``rnn`` |

``config.json``: ``model_type = "recurrent_drafting_drafter"``, ``vocab_size``, ``hidden_size``,
``exit_dim``, ``num_draft_layers``, ``num_lookback_tokens`` (unused upstream), ``rnn``. Upstream
drafts with ``s_t = SiLU(W e_t + U s_{t-1} + b)`` from ``s_0 = 0`` (our ``rnn_variant="apple"``),
the features ``[h ; s]``, and keeps the top 50 drafter logits (a constant in both Apple's and
TensorRT-LLM's beam search).

What has no counterpart there is converted exactly or refused:

- ``head="tied"`` -> ``lm_head.{L}.weight = lm_head_target @ head_proj`` (V, E), computed in
  float64 from the target's LM head (the same map, rounded once to the file's dtype);
- a vocabulary shortlist -> refused (a bias-free linear head cannot give -inf outside the list);
  ``drop_shortlist=True`` exports the head over all V tokens instead, and says so;
- ``rnn_variant`` "trtllm" or "paper" -> refused (upstream has only the "apple" recurrence).

The fields upstream lacks (beam defaults, ``draft_top_k``, the target record) travel in a
``specdec`` entry of ``config.json``, which the upstream loaders ignore, so an export imports back
with the same settings.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Mapping

import numpy as np
from safetensors.numpy import load_file, save_file

from specdec.errors import InvalidInputError
from specdec.models.files import read_json, read_torch_tensors, readable
from specdec_redrafter.config import RedrafterConfig, check_weights

__all__ = [
    "APPLE_MODEL_TYPE",
    "UPSTREAM_TOP_K",
    "apple_config",
    "apple_weight_shapes",
    "export_apple",
    "is_apple_config",
    "materialise",
    "read_apple",
]

APPLE_MODEL_TYPE = "recurrent_drafting_drafter"
# warp_logits(top_k=50) in Apple's modeling_drafter.py and TensorRT-LLM's redrafter_helper.py
UPSTREAM_TOP_K = 50
SPECDEC_KEY = "specdec"
# Names TensorRT-LLM's converter also accepts for the head and the input projection
# (hf_drafter docstring).
ALTERNATE_PREFIXES = (
    ("lm_heads.", "lm_head."),
    ("input_projs.", "input_proj."),
    ("0.", "lm_head."),
)
DTYPES = {"float32": np.float32, "float16": np.float16}


def apple_weight_shapes(
    *, vocab_size: int, hidden_size: int, exit_dim: int, num_draft_layers: int, rnn: bool
) -> dict[str, tuple[int, ...]]:
    """Every tensor of an upstream drafter with its shape (``Drafter.__init__``)."""
    shapes: dict[str, tuple[int, ...]] = {}
    if 2 * hidden_size != exit_dim:
        shapes["input_proj.weight"] = (exit_dim, 2 * hidden_size)
        shapes["input_proj.bias"] = (exit_dim,)
    for i in range(num_draft_layers):
        shapes[f"lm_head.{i}.linear.weight"] = (exit_dim, exit_dim)
        shapes[f"lm_head.{i}.linear.bias"] = (exit_dim,)
    shapes[f"lm_head.{num_draft_layers}.weight"] = (vocab_size, exit_dim)
    if rnn:
        shapes["rnn_u.weight"] = (hidden_size, hidden_size)
        shapes["rnn_u.bias"] = (hidden_size,)
        shapes["rnn_w.weight"] = (hidden_size, hidden_size)
    return shapes


def is_apple_config(config: Mapping[str, Any]) -> bool:
    return config.get("model_type") == APPLE_MODEL_TYPE


def materialise(
    config: RedrafterConfig,
    weights: Mapping[str, np.ndarray],
    *,
    lm_head=None,
    drop_shortlist: bool = False,
) -> tuple[RedrafterConfig, dict[str, np.ndarray], list[str]]:
    """The same drafter with a full head and no shortlist, as the upstream layout holds it.

    -> (config, float64 weights, notes on what changed). Raises InvalidInputError for what cannot
    be carried over. ``lm_head`` (V, H): the target's LM head, needed when
    ``config.head == "tied"``.
    """
    check_weights(config, weights)
    notes: list[str] = []
    if config.rnn and config.rnn_variant != "apple":
        raise InvalidInputError(
            f"this ReDrafter uses rnn_variant={config.rnn_variant!r}; Apple's reference code and "
            "TensorRT-LLM (redrafter_helper.py) run only s_t = SiLU(W e_t + U s_(t-1) + b) from "
            "s_0 = 0 (rnn_variant='apple'), so its drafts there would differ: retrain with "
            "rnn_variant='apple' to export it"
        )
    if config.shortlist_size is not None and not drop_shortlist:
        raise InvalidInputError(
            f"this ReDrafter drafts only a vocabulary shortlist of {config.shortlist_size} of "
            f"{config.vocab_size} tokens, which Apple's layout and TensorRT-LLM cannot express "
            "(their head is a bias-free linear map to all tokens, so tokens outside the list "
            "cannot be given -inf): pass drop_shortlist=True (`--drop-shortlist`) to export the "
            "head over the full vocabulary (the drafter may then propose any token, so its drafts "
            "can differ from the shortlisted ones), or retrain with --shortlist 0"
        )
    out = {
        name: np.asarray(array, dtype=np.float64)
        for name, array in weights.items()
        if name != "vocab_shortlist"
    }
    fields = config.to_dict()
    if config.shortlist_size is not None:
        fields["shortlist_size"] = None
        notes.append(
            f"the vocabulary shortlist ({config.shortlist_size} of {config.vocab_size} tokens) was "
            "dropped on request: the exported head scores all tokens"
        )
    if config.head == "tied":
        if lm_head is None:
            raise InvalidInputError(
                "this ReDrafter ties its head to the target's LM head (head='tied'), which Apple's "
                "layout lacks: the export writes lm_head.{L}.weight = lm_head_target @ head_proj "
                "and needs the target: pass model= (`--model`, the target folder or bundled name)"
            )
        lm_head = np.asarray(lm_head, dtype=np.float64)
        if lm_head.shape != (config.vocab_size, config.hidden_size):
            raise InvalidInputError(
                f"the target's LM head has shape {lm_head.shape}, expected "
                f"(vocab_size, hidden_size) = {(config.vocab_size, config.hidden_size)}"
            )
        out[f"lm_head.{config.num_draft_layers}.weight"] = lm_head @ out.pop("head_proj.weight")
        fields["head"] = "full"
        notes.append(
            "the tied head was materialised: lm_head.{L}.weight = the target's LM head @ head_proj "
            "(the same map, rounded once to the file's dtype)"
        )
    fields.pop("model_type", None)
    return RedrafterConfig.from_dict(fields), out, notes


def apple_config(config: RedrafterConfig, *, dtype: str = "float32") -> dict[str, Any]:
    """The upstream ``config.json`` of a full-head drafter, with the ``specdec`` entry."""
    return {
        "architectures": ["Drafter"],
        "model_type": APPLE_MODEL_TYPE,
        "vocab_size": config.vocab_size,
        "hidden_size": config.hidden_size,
        "exit_dim": config.exit_dim,
        "num_draft_layers": config.num_draft_layers,
        "num_lookback_tokens": -1,
        "rnn": config.rnn,
        "torch_dtype": dtype,
        SPECDEC_KEY: {
            "draft_top_k": config.draft_top_k,
            "beam_width": config.beam_width,
            "beam_length": config.beam_length,
            "target": dict(config.target),
        },
    }


def export_apple(
    config: RedrafterConfig,
    weights: Mapping[str, np.ndarray],
    out,
    *,
    lm_head=None,
    drop_shortlist: bool = False,
    dtype: str = "float32",
) -> tuple[Path, list[str]]:
    """Write ``config.json`` and ``model.safetensors`` in Apple's layout into ``out``.

    -> (folder, notes). Notes name every conversion and every behaviour the engines fix themselves.
    """
    if dtype not in DTYPES:
        raise InvalidInputError(f"dtype must be one of {sorted(DTYPES)}, got {dtype!r}")
    config, full, notes = materialise(
        config, weights, lm_head=lm_head, drop_shortlist=drop_shortlist
    )
    shapes = apple_weight_shapes(
        vocab_size=config.vocab_size,
        hidden_size=config.hidden_size,
        exit_dim=config.exit_dim,
        num_draft_layers=config.num_draft_layers,
        rnn=config.rnn,
    )
    assert set(full) == set(shapes), (sorted(full), sorted(shapes))  # same names by construction
    if config.draft_top_k != UPSTREAM_TOP_K:
        notes.append(
            f"Apple's code and TensorRT-LLM keep the top {UPSTREAM_TOP_K} drafter logits at every "
            f"step (a constant there); this drafter has draft_top_k={config.draft_top_k}, so their "
            f"beams can differ from specdec's: set draft_top_k={UPSTREAM_TOP_K} here to draft as "
            "they do"
        )
    folder = Path(out)
    folder.mkdir(parents=True, exist_ok=True)
    arrays = {name: np.ascontiguousarray(full[name], dtype=DTYPES[dtype]) for name in shapes}
    save_file(arrays, str(folder / "model.safetensors"), metadata={"format": "pt"})
    readable(folder / "model.safetensors")
    (folder / "config.json").write_text(
        json.dumps(apple_config(config, dtype=dtype), indent=2) + "\n"
    )
    return folder, notes


def _read_tensors(folder: Path) -> dict[str, np.ndarray]:
    """``model.safetensors``, else ``model.pt`` (TensorRT-LLM's converter reads either)."""
    if (folder / "model.safetensors").is_file():
        return dict(load_file(str(folder / "model.safetensors")))
    if (folder / "model.pt").is_file():
        state = read_torch_tensors(folder / "model.pt")  # torch's safe unpickler only
        return {name: tensor.float().numpy() for name, tensor in state.items()}
    raise InvalidInputError(
        f"{folder} has an Apple ReDrafter config.json but neither model.safetensors nor model.pt"
    )


def read_apple(folder) -> tuple[RedrafterConfig, dict[str, np.ndarray], list[str]]:
    """An Apple-layout drafter folder as (specdec config, float64 weights, notes).

    Published drafters (no ``specdec`` entry) draft here as upstream does: ``rnn_variant="apple"``,
    ``draft_top_k=50``. TensorRT-LLM's alternate names (``lm_heads.``, ``input_projs.``, ``0.``)
    are accepted; MLX's unused ``emb_norm.weight`` is ignored (upstream never applies it).
    """
    folder = Path(folder)
    raw = read_json(folder / "config.json", what="drafter config")
    if not is_apple_config(raw):
        raise InvalidInputError(
            f"{folder}/config.json has model_type {raw.get('model_type')!r}, not "
            f"{APPLE_MODEL_TYPE!r}: not an Apple ReDrafter folder"
        )
    missing = [
        key
        for key in ("vocab_size", "hidden_size", "exit_dim", "num_draft_layers")
        if key not in raw
    ]
    if missing:
        raise InvalidInputError(
            f"{folder}/config.json lacks {missing}, which Apple's DrafterConfig needs"
        )
    tensors = _read_tensors(folder)
    notes: list[str] = []
    renamed = {}
    for name, array in tensors.items():
        for old, new in ALTERNATE_PREFIXES:
            if name.startswith(old) and not name.startswith(new):
                name = new + name[len(old) :]
                break
        renamed[name] = array
    if "emb_norm.weight" in renamed and raw.get("emb_norm"):
        renamed.pop("emb_norm.weight")
        notes.append(
            "emb_norm.weight was ignored: Apple's MLX drafter creates it but never applies it"
        )
    extra = dict(raw.get(SPECDEC_KEY) or {})
    fields = dict(
        vocab_size=int(raw["vocab_size"]),
        hidden_size=int(raw["hidden_size"]),
        exit_dim=int(raw["exit_dim"]),
        num_draft_layers=int(raw["num_draft_layers"]),
        rnn=bool(raw.get("rnn", False)),
        rnn_variant="apple",
        head="full",
        draft_top_k=extra.get("draft_top_k", UPSTREAM_TOP_K),
    )
    for key in ("beam_width", "beam_length", "target"):
        if key in extra:
            fields[key] = extra[key]
    config = RedrafterConfig(**fields)
    shapes = apple_weight_shapes(
        vocab_size=config.vocab_size,
        hidden_size=config.hidden_size,
        exit_dim=config.exit_dim,
        num_draft_layers=config.num_draft_layers,
        rnn=config.rnn,
    )
    unexpected = sorted(set(renamed) - set(shapes))
    missing = sorted(set(shapes) - set(renamed))
    wrong = sorted(
        f"{name}: {tuple(renamed[name].shape)} != {shape}"
        for name, shape in shapes.items()
        if name in renamed and tuple(renamed[name].shape) != shape
    )
    if missing or unexpected or wrong:
        raise InvalidInputError(
            f"{folder} does not hold the Apple ReDrafter its config.json describes "
            f"(exit_dim={config.exit_dim}, num_draft_layers={config.num_draft_layers}, "
            f"rnn={config.rnn}): missing {missing}, unexpected {unexpected}, wrong shapes {wrong}"
        )
    weights = {name: np.asarray(array, dtype=np.float64) for name, array in renamed.items()}
    check_weights(config, weights)
    return config, weights, notes


def write_apple(
    config: RedrafterConfig,
    weights: Mapping[str, np.ndarray],
    out,
    *,
    lm_head=None,
    dtype: str = "float32",
    drop_shortlist: bool = False,
    choices=None,
) -> tuple[list[str], tuple[str, ...]]:
    """``export_apple`` as the spec's layout writer: (notes, the TensorRT-LLM commands that load
    it)."""
    if choices is not None:
        raise InvalidInputError(
            "choices applies to Medusa heads; a ReDrafter's tree comes from its beams"
        )
    _, notes = export_apple(
        config, weights, out, lm_head=lm_head, drop_shortlist=drop_shortlist, dtype=dtype
    )
    exported = materialise(config, weights, lm_head=lm_head, drop_shortlist=drop_shortlist)[0]
    commands = (
        "python examples/redrafter/convert_checkpoint.py --model_dir TARGET_HF_FOLDER "
        f"--drafter_model_dir {out} --output_dir tllm_redrafter --dtype float16 "
        f"--redrafter_num_beams {exported.beam_width} --redrafter_draft_len_per_beam "
        f"{exported.beam_length - 1}",
        "trtllm-build --checkpoint_dir tllm_redrafter --output_dir engine_redrafter --gemm_plugin "
        "float16 --speculative_decoding_mode explicit_draft_tokens --max_batch_size 4",
    )
    return notes, commands


def detect_apple(folder: Path, config: Mapping[str, Any]) -> bool:
    return is_apple_config(config)
