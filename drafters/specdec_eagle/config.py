"""EAGLE drafter configuration and weight layout.

Weights are a flat dict of arrays named as in EAGLE's own checkpoints (``Linear`` weights are
(out, in), applied as ``x @ weight.T + bias``; H the target's hidden size, I the draft layer's MLP
width, Hq / Hkv its query / key-value heads of size Dh):

| name | shape | note |
|---|---|---|
| ``fc.weight`` | (H, 2H) | fuses [embedding ; feature] |
| ``fc.bias`` | (H,) | only when ``fc_bias`` |
| ``layers.0.self_attn.q_proj.weight`` | (Hq * Dh, H) | EAGLE's layer 0: no input norm |
| ``layers.0.self_attn.k_proj.weight``, ``v_proj.weight`` | (Hkv * Dh, H) | |
| ``layers.0.self_attn.o_proj.weight`` | (H, Hq * Dh) | |
| ``layers.0.post_attention_layernorm.weight`` | (H,) | RMSNorm before the MLP |
| ``layers.0.mlp.gate_proj.weight``, ``up_proj.weight`` | (I, H) | SwiGLU |
| ``layers.0.mlp.down_proj.weight`` | (H, I) | |
| ``vocab_shortlist`` | (S,) int | ``shortlist_size`` S (``specdec.drafting.shortlist``) |

The token embedding and the LM head are the target's own (V, H) arrays, never stored here.
"""

from __future__ import annotations

from typing import Any

import attrs
import numpy as np

from specdec.models.checkpoints import check_weight_shapes, config_from_dict
from specdec.drafting.shortlist import check_shortlist

__all__ = ["MODEL_TYPE", "EagleConfig", "check_weights", "product_weights", "tree_size"]

MODEL_TYPE = "specdec_eagle"


def _positive_int(instance, attribute, value):
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"EagleConfig.{attribute.name} must be a positive integer, got {value!r}")


def _positive_float(instance, attribute, value):
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not value > 0:
        raise ValueError(f"EagleConfig.{attribute.name} must be a positive number, got {value!r}")


@attrs.frozen(kw_only=True)
class EagleConfig:
    """Hyper-parameters of an EAGLE drafter (docs/algorithms/eagle.md).

    vocab_size V, hidden_size H: the target's. num_heads, num_kv_heads, head_dim,
    intermediate_size, rope_theta, rms_norm_eps: the draft decoder layer's (by default the
    target's own layout). fc_bias: the fusing Linear(2H -> H) has a bias (EAGLE-1 does).
    shortlist_size: S, when the drafter proposes only the S token ids of its ``vocab_shortlist``
    weight (its LM head then multiplies by S rows of the target's); None: all V.
    top_k, depth, total_tokens: the dynamic tree's defaults (``reference.dynamic_tree``): each
    expanded node's children and the frontier width, the number of drafted levels, and the
    drafted nodes the target verifies. target: what the drafter was trained for
    (name, fingerprint, sizes).
    """

    vocab_size: int = attrs.field(validator=_positive_int)
    hidden_size: int = attrs.field(validator=_positive_int)
    num_heads: int = attrs.field(validator=_positive_int)
    num_kv_heads: int = attrs.field(validator=_positive_int)
    head_dim: int = attrs.field(validator=_positive_int)
    intermediate_size: int = attrs.field(validator=_positive_int)
    rope_theta: float = attrs.field(default=10000.0, converter=float, validator=_positive_float)
    rms_norm_eps: float = attrs.field(default=1e-6, converter=float, validator=_positive_float)
    fc_bias: bool = attrs.field(default=True, validator=attrs.validators.instance_of(bool))
    shortlist_size: int | None = attrs.field(default=None)
    top_k: int = attrs.field(default=4, validator=_positive_int)
    depth: int = attrs.field(default=3, validator=_positive_int)
    total_tokens: int = attrs.field(default=12, validator=_positive_int)
    target: dict = attrs.field(factory=dict, converter=dict)
    model_type: str = attrs.field(default=MODEL_TYPE)

    @num_kv_heads.validator
    def _check_heads(self, attribute, value):
        _positive_int(self, attribute, value)
        if self.num_heads % value:
            raise ValueError(
                f"EagleConfig.num_heads ({self.num_heads}) must be a multiple of num_kv_heads "
                f"({value})"
            )

    @head_dim.validator
    def _check_head_dim(self, attribute, value):
        _positive_int(self, attribute, value)
        if value % 2:
            raise ValueError(
                f"EagleConfig.head_dim must be even for rotary embeddings, got {value}"
            )

    @shortlist_size.validator
    def _check_shortlist(self, attribute, value):
        if value is not None:
            _positive_int(self, attribute, value)
            if value > self.vocab_size:
                raise ValueError(
                    f"EagleConfig.shortlist_size={value} exceeds vocab_size={self.vocab_size}"
                )

    @model_type.validator
    def _check_model_type(self, attribute, value):
        if value != MODEL_TYPE:
            raise ValueError(
                f"not an EAGLE config: model_type is {value!r}, expected {MODEL_TYPE!r}"
            )

    @property
    def draft_vocab_size(self) -> int:
        """How many tokens the drafter can propose: S with a shortlist, else V."""
        return self.shortlist_size or self.vocab_size

    def to_dict(self) -> dict[str, Any]:
        """A JSON-serialisable dict (the content of ``config.json``)."""
        return attrs.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> EagleConfig:
        """Inverse of ``to_dict``; unknown keys are an error so typos do not pass silently."""
        return config_from_dict(cls, data, label="EAGLE", model_type=MODEL_TYPE)

    def weight_shapes(self) -> dict[str, tuple[int, ...]]:
        """The name and shape of every weight this config needs (see the module docstring)."""
        hidden, inner = self.hidden_size, self.intermediate_size
        q_out, kv_out = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        shapes: dict[str, tuple[int, ...]] = {"fc.weight": (hidden, 2 * hidden)}
        if self.fc_bias:
            shapes["fc.bias"] = (hidden,)
        attn, mlp = "layers.0.self_attn.", "layers.0.mlp."
        shapes.update(
            {
                attn + "q_proj.weight": (q_out, hidden),
                attn + "k_proj.weight": (kv_out, hidden),
                attn + "v_proj.weight": (kv_out, hidden),
                attn + "o_proj.weight": (hidden, q_out),
                "layers.0.post_attention_layernorm.weight": (hidden,),
                mlp + "gate_proj.weight": (inner, hidden),
                mlp + "up_proj.weight": (inner, hidden),
                mlp + "down_proj.weight": (hidden, inner),
            }
        )
        if self.shortlist_size is not None:
            shapes["vocab_shortlist"] = (self.shortlist_size,)
        return shapes


def check_weights(config: EagleConfig, weights: dict[str, Any]) -> None:
    """Raise ValueError listing missing, unexpected and wrongly shaped weights for ``config``."""
    check_weight_shapes(
        config.weight_shapes(),
        weights,
        label="EAGLE",
        settings=f"heads {config.num_heads}/{config.num_kv_heads} of {config.head_dim}, "
        f"intermediate_size {config.intermediate_size}, fc_bias={config.fc_bias}, "
        f"shortlist_size={config.shortlist_size}",
    )
    if config.shortlist_size is not None:
        check_shortlist(
            np.asarray(weights["vocab_shortlist"]), config.vocab_size, config.shortlist_size
        )


def product_weights(config: EagleConfig) -> list[str]:
    """The weights a drafter multiplies by (the fc and the layer's projections): what int8
    drafting rounds (``specdec.reference.quantize``), besides the head rows."""
    return [n for n in config.weight_shapes() if n == "fc.weight" or n.endswith("_proj.weight")]


def tree_size(config: EagleConfig) -> int:
    """The nodes of one row's tree under the config's total_tokens, root included
    (``DrafterSpec.tree_size``)."""
    return config.total_tokens + 1
