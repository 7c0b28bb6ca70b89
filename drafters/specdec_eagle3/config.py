"""EAGLE-3 drafter configuration and weight layout.

Weights are a flat dict of arrays under the names EAGLE-3's own checkpoints use (SafeAILab/EAGLE
``eagle/traineagle3/cnets.py``, SpecForge ``specforge/modeling/draft/llama3_eagle.py``), so the
EAGLE/SpecForge layout is this one (``Linear`` weights are (out, in), applied as ``x @ weight.T``;
H the target's hidden size, I the draft layer's MLP width, Hq / Hkv its query / key-value heads
of size Dh, N the draft vocabulary):

| name | shape | note |
|---|---|---|
| ``fc.weight`` | (H, 3H) | fuses the target's low, middle and high layer outputs |
| ``midlayer.input_layernorm.weight`` | (H,) | RMSNorm of the token embedding |
| ``midlayer.hidden_norm.weight`` | (H,) | RMSNorm of the feature |
| ``midlayer.self_attn.q_proj.weight`` | (Hq * Dh, 2H) | reads [normed embedding ; normed feature] |
| ``midlayer.self_attn.k_proj.weight``, ``v_proj.weight`` | (Hkv * Dh, 2H) | |
| ``midlayer.self_attn.o_proj.weight`` | (H, Hq * Dh) | |
| ``midlayer.post_attention_layernorm.weight`` | (H,) | RMSNorm before the MLP |
| ``midlayer.mlp.gate_proj.weight``, ``up_proj.weight`` | (I, H) | SwiGLU |
| ``midlayer.mlp.down_proj.weight`` | (H, I) | |
| ``norm.weight`` | (H,) | the draft's own final norm |
| ``lm_head.weight`` | (N, H) | the draft's own head over its vocabulary |
| ``d2t`` | (N,) int | draft id i is target id i + d2t[i], ascending |

Two optional tensors, each present exactly when its config field says so (published heads carry
them: vLLM's speculators ``Eagle3DraftModel`` saves its ``embed_tokens`` and, with
``norm_before_fc``, an ``input_norm``; SGLang's EAGLE-3 model defines the same ``input_norm``):

- ``embed_tokens.weight`` (V, H), with ``own_embedding``: the head's token embedding, used
  instead of the target's;
- ``input_norm.weight`` (3H,), with ``norm_before_fc``: one RMSNorm over [low ; mid ; high]
  before ``fc``.

Without ``embed_tokens.weight`` the token embedding is the target's (V, H), not stored here.
"""

from __future__ import annotations

from typing import Any

import attrs
import numpy as np

from specdec.models.checkpoints import check_weight_shapes, config_from_dict
from specdec.errors import InvalidInputError

__all__ = [
    "MODEL_TYPE",
    "Eagle3Config",
    "check_weights",
    "default_hidden_layers",
    "draft_to_target",
    "product_weights",
    "resolve_layers",
    "tree_size",
]

MODEL_TYPE = "specdec_eagle3"


def _positive_int(instance, attribute, value):
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ValueError(f"Eagle3Config.{attribute.name} must be a positive integer, got {value!r}")


def _positive_float(instance, attribute, value):
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not value > 0:
        raise ValueError(f"Eagle3Config.{attribute.name} must be a positive number, got {value!r}")


def default_hidden_layers(num_layers: int) -> tuple[int, int, int]:
    """The target layers EAGLE-3 fuses by default, as 0-based *output-of-layer* indices (the
    contract's ``hidden_layers``): (1, L//2 - 1, L - 4). They are the inputs of layers 2, L//2 and
    L - 3, vLLM's and llama.cpp's input-of-layer ids (docs/scale-out.md). A target of fewer than
    8 layers (test models) fuses its first, middle and last: (0, (L-1)//2, L-1)."""
    if (
        isinstance(num_layers, bool)
        or not isinstance(num_layers, (int, np.integer))
        or num_layers < 1
    ):
        raise ValueError(f"a target's layer count must be a positive integer, got {num_layers!r}")
    if num_layers < 8:
        return (0, (num_layers - 1) // 2, num_layers - 1)
    return (1, num_layers // 2 - 1, num_layers - 4)


@attrs.frozen(kw_only=True)
class Eagle3Config:
    """Hyper-parameters of an EAGLE-3 drafter (docs/algorithms/eagle3.md).

    vocab_size V, hidden_size H: the target's. draft_vocab_size N: the rows of the draft's own
    LM head (``d2t`` maps them to target ids). hidden_layers: the three target decoder layers
    (0-based, output-of-layer) whose outputs are fused, low to high; None (an imported head that
    names none): ``default_hidden_layers`` of the target it is loaded for. num_heads, num_kv_heads,
    head_dim, intermediate_size, rope_theta, rms_norm_eps: the draft decoder layer's.
    norm_before_residual: the attention's residual is the normed feature (the speculators
    variant) instead of the raw one. own_embedding: the head carries its own token embedding
    (``embed_tokens.weight``), which it drafts with instead of the target's. norm_before_fc: the
    fused layers pass one RMSNorm (``input_norm.weight``, over all 3H) before ``fc``. top_k, depth,
    total_tokens: the dynamic tree's defaults.
    target: what the drafter was trained for (name, fingerprint, sizes).
    """

    vocab_size: int = attrs.field(validator=_positive_int)
    hidden_size: int = attrs.field(validator=_positive_int)
    draft_vocab_size: int = attrs.field(validator=_positive_int)
    hidden_layers: tuple[int, ...] | None = attrs.field(
        default=None, converter=lambda v: None if v is None else tuple(int(i) for i in v)
    )
    num_heads: int = attrs.field(validator=_positive_int)
    num_kv_heads: int = attrs.field(validator=_positive_int)
    head_dim: int = attrs.field(validator=_positive_int)
    intermediate_size: int = attrs.field(validator=_positive_int)
    rope_theta: float = attrs.field(default=10000.0, converter=float, validator=_positive_float)
    rms_norm_eps: float = attrs.field(default=1e-6, converter=float, validator=_positive_float)
    norm_before_residual: bool = attrs.field(
        default=False, validator=attrs.validators.instance_of(bool)
    )
    own_embedding: bool = attrs.field(default=False, validator=attrs.validators.instance_of(bool))
    norm_before_fc: bool = attrs.field(default=False, validator=attrs.validators.instance_of(bool))
    top_k: int = attrs.field(default=4, validator=_positive_int)
    depth: int = attrs.field(default=4, validator=_positive_int)
    total_tokens: int = attrs.field(default=12, validator=_positive_int)
    target: dict = attrs.field(factory=dict, converter=dict)
    model_type: str = attrs.field(default=MODEL_TYPE)

    @draft_vocab_size.validator
    def _check_draft_vocab(self, attribute, value):
        _positive_int(self, attribute, value)
        if value > self.vocab_size:
            raise ValueError(
                f"Eagle3Config.draft_vocab_size={value} exceeds the target's "
                f"vocab_size={self.vocab_size}"
            )

    @hidden_layers.validator
    def _check_layers(self, attribute, value):
        if value is None:
            return
        if len(value) != 3 or any(i < 0 for i in value) or list(value) != sorted(value):
            raise ValueError(
                f"Eagle3Config.hidden_layers must be three ascending 0-based target layers "
                f"(low, middle, high), got {value!r}"
            )
        layers = self.target.get("num_hidden_layers") if isinstance(self.target, dict) else None
        if layers is not None and value[-1] >= int(layers):
            raise ValueError(
                f"Eagle3Config.hidden_layers {value!r} name a layer past the target's {layers}"
            )

    @num_kv_heads.validator
    def _check_heads(self, attribute, value):
        _positive_int(self, attribute, value)
        if self.num_heads % value:
            raise ValueError(
                f"Eagle3Config.num_heads ({self.num_heads}) must be a multiple of num_kv_heads "
                f"({value})"
            )

    @head_dim.validator
    def _check_head_dim(self, attribute, value):
        _positive_int(self, attribute, value)
        if value % 2:
            raise ValueError(
                f"Eagle3Config.head_dim must be even for rotary embeddings, got {value}"
            )

    @model_type.validator
    def _check_model_type(self, attribute, value):
        if value != MODEL_TYPE:
            raise ValueError(
                f"not an EAGLE-3 config: model_type is {value!r}, expected {MODEL_TYPE!r}"
            )

    def to_dict(self) -> dict[str, Any]:
        """A JSON-serialisable dict (the content of ``config.json``); ``own_embedding`` and
        ``norm_before_fc`` only when set, so a head without those tensors is saved as before."""
        data = attrs.asdict(self)
        for flag in ("own_embedding", "norm_before_fc"):
            if not data[flag]:
                del data[flag]
        data["hidden_layers"] = None if self.hidden_layers is None else list(self.hidden_layers)
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Eagle3Config:
        """Inverse of ``to_dict``; unknown keys are an error so typos do not pass silently."""
        return config_from_dict(cls, data, label="EAGLE-3", model_type=MODEL_TYPE)

    def weight_shapes(self) -> dict[str, tuple[int, ...]]:
        """The name and shape of every weight this config needs (see the module docstring)."""
        hidden, inner = self.hidden_size, self.intermediate_size
        q_out, kv_out = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        attn, mlp = "midlayer.self_attn.", "midlayer.mlp."
        optional = {
            "embed_tokens.weight": (self.vocab_size, hidden) if self.own_embedding else None,
            "input_norm.weight": (3 * hidden,) if self.norm_before_fc else None,
        }
        return {
            **{name: shape for name, shape in optional.items() if shape is not None},
            "fc.weight": (hidden, 3 * hidden),
            "midlayer.input_layernorm.weight": (hidden,),
            "midlayer.hidden_norm.weight": (hidden,),
            attn + "q_proj.weight": (q_out, 2 * hidden),
            attn + "k_proj.weight": (kv_out, 2 * hidden),
            attn + "v_proj.weight": (kv_out, 2 * hidden),
            attn + "o_proj.weight": (hidden, q_out),
            "midlayer.post_attention_layernorm.weight": (hidden,),
            mlp + "gate_proj.weight": (inner, hidden),
            mlp + "up_proj.weight": (inner, hidden),
            mlp + "down_proj.weight": (hidden, inner),
            "norm.weight": (hidden,),
            "lm_head.weight": (self.draft_vocab_size, hidden),
            "d2t": (self.draft_vocab_size,),
        }


def product_weights(config: Eagle3Config) -> list[str]:
    """The weights a drafter multiplies by (the fc, the layer's projections and the head): what
    int8 drafting rounds (``specdec.reference.quantize``)."""
    return [
        n
        for n in config.weight_shapes()
        if n in ("fc.weight", "lm_head.weight") or n.endswith("_proj.weight")
    ]


def resolve_layers(config: Eagle3Config, num_layers: int) -> Eagle3Config:
    """``config`` with its fused layers checked against a target of ``num_layers`` decoder layers
    (the default three when it names none)."""
    layers = config.hidden_layers or default_hidden_layers(num_layers)
    if max(layers) >= num_layers:
        plus_one = [int(i) + 1 for i in layers]
        raise InvalidInputError(
            f"this EAGLE-3 drafter fuses target layers {list(layers)} (0-based output-of-layer "
            f"ids; a speculators config.json writes them as eagle_aux_hidden_state_layer_ids "
            f"{plus_one}, llama.cpp's GGUF as eagle3.extract_layers {plus_one}, SpecForge's "
            f"config as eagle_config.eagle_aux_hidden_state_layer_ids {list(layers)}), but the "
            f"target has {num_layers} decoder layers (ids 0-{num_layers - 1}); use a drafter "
            "trained for this target"
        )
    return attrs.evolve(config, hidden_layers=layers)


def draft_to_target(d2t) -> np.ndarray:
    """(N,) int64 target ids i + d2t[i] of the draft vocabulary."""
    d2t = np.asarray(d2t, dtype=np.int64)
    return np.arange(len(d2t), dtype=np.int64) + d2t


def check_weights(config: Eagle3Config, weights: dict[str, Any]) -> None:
    """Raise ValueError listing missing, unexpected and wrongly shaped weights for ``config``, or
    a ``d2t`` that does not map the draft vocabulary to ascending target ids."""
    check_weight_shapes(
        config.weight_shapes(),
        weights,
        label="EAGLE-3",
        settings=f"heads {config.num_heads}/{config.num_kv_heads} of {config.head_dim}, "
        f"intermediate_size {config.intermediate_size}, draft_vocab_size "
        f"{config.draft_vocab_size}",
    )
    d2t = np.asarray(weights["d2t"])
    if not np.issubdtype(d2t.dtype, np.integer) and not np.array_equal(d2t, np.round(d2t)):
        raise ValueError(
            "EAGLE-3's d2t must hold integer offsets (target id = draft id + d2t[draft id])"
        )
    ids = draft_to_target(d2t)
    if ids.min() < 0 or ids.max() >= config.vocab_size or np.any(np.diff(ids) <= 0):
        raise ValueError(
            "EAGLE-3's d2t must map draft ids to distinct ascending target ids in [0, "
            f"{config.vocab_size}); got ids from {ids.min()} to "
            f"{ids.max()}{' not ascending' if np.any(np.diff(ids) <= 0) else ''}"
        )


def tree_size(config: Eagle3Config) -> int:
    """The nodes of one row's tree under the config's total_tokens, root included
    (``DrafterSpec.tree_size``)."""
    return config.total_tokens + 1
