"""The configuration of a Medusa drafter, stored as ``config.json`` next to its weights.

Weight names (one dict of arrays, float64 in the reference):

- ``medusa_head.{k}.{j}.linear.weight`` (H, H) and ``.bias`` (H,): residual block j of head k,
  ``x <- x + SiLU(x @ weight.T + bias)``, for j = 0..num_layers-1.
- ``medusa_head.{k}.{num_layers}.weight`` (V, H): the vocabulary projection of head k, no bias,
  only when ``head == "full"``. With ``head == "tied"`` every head ends with the target's LM head.
"""

from __future__ import annotations

from typing import Any

import attrs

from specdec.models.checkpoints import config_from_dict

from specdec_medusa.choices import Choices, resolve_choices

MODEL_TYPE = "specdec_medusa"
HEAD_KINDS = ("full", "tied")
TARGET_KEYS = ("name", "fingerprint", "vocab_size", "hidden_size")


def _positive(instance, attribute, value):
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"MedusaConfig.{attribute.name} must be a positive integer, got {value!r}")


def _convert_choices(value):
    """Lists of lists (as read from JSON) -> tuples; anything odd is left for resolve_choices to
    reject."""
    if isinstance(value, str):
        return value
    try:
        return tuple(tuple(path) if not isinstance(path, (str, bytes)) else path for path in value)
    except TypeError:
        return value


def _convert_target(value):
    return dict(value or {})


@attrs.frozen(kw_only=True)
class MedusaConfig:
    """K Medusa heads for one target model.

    vocab_size V and hidden_size H are the target's. num_heads K: head k predicts the token
    k+1 positions after the root. num_layers: residual SiLU blocks per head. head: "full"
    (each head owns an H -> V projection) or "tied" (each head ends with the target's LM
    head). top_t T: tokens each head proposes. choices: a preset name from
    ``specdec_medusa.choices.PRESETS`` or an explicit list of top-index paths. target: what
    the heads were trained on, keys ``name``, ``fingerprint``, ``vocab_size``, ``hidden_size``
    (any may be missing).
    """

    vocab_size: int = attrs.field(validator=_positive)
    hidden_size: int = attrs.field(validator=_positive)
    num_heads: int = attrs.field(default=4, validator=_positive)
    num_layers: int = attrs.field(default=1)
    head: str = attrs.field(default="full")
    top_t: int = attrs.field(default=8, validator=_positive)
    choices: Any = attrs.field(default="cpu16", converter=_convert_choices)
    target: dict = attrs.field(factory=dict, converter=_convert_target, hash=False)
    model_type: str = attrs.field(default=MODEL_TYPE)

    @num_layers.validator
    def _check_num_layers(self, attribute, value):
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ValueError(f"MedusaConfig.num_layers must be an integer >= 0, got {value!r}")

    @head.validator
    def _check_head(self, attribute, value):
        if value not in HEAD_KINDS:
            raise ValueError(f"MedusaConfig.head must be one of {HEAD_KINDS}, got {value!r}")

    @model_type.validator
    def _check_model_type(self, attribute, value):
        if value != MODEL_TYPE:
            raise ValueError(
                f"config has model_type {value!r}, not {MODEL_TYPE!r}: this is not a Medusa "
                "drafter checkpoint"
            )

    @target.validator
    def _check_target(self, attribute, value):
        unknown = sorted(set(value) - set(TARGET_KEYS))
        if unknown:
            raise ValueError(
                f"MedusaConfig.target has unknown keys {unknown}; allowed keys are "
                f"{list(TARGET_KEYS)}"
            )
        for key, own in (("vocab_size", self.vocab_size), ("hidden_size", self.hidden_size)):
            if value.get(key) is not None and value[key] != own:
                raise ValueError(
                    f"MedusaConfig.target[{key!r}] = {value[key]} disagrees with "
                    f"MedusaConfig.{key} = {own}; they describe the same target model and must be "
                    "equal"
                )

    def __attrs_post_init__(self):
        if self.top_t > self.vocab_size:
            raise ValueError(
                f"MedusaConfig.top_t = {self.top_t} exceeds vocab_size = {self.vocab_size}"
            )
        self.resolved_choices  # validate the tree against K and T now, not at the first step

    @property
    def resolved_choices(self) -> Choices:
        """The choices as validated paths in canonical node order."""
        return resolve_choices(self.choices, num_heads=self.num_heads, top_t=self.top_t)

    def weight_shapes(self) -> dict[str, tuple[int, ...]]:
        """Every weight name this config expects, with its shape."""
        h, v = self.hidden_size, self.vocab_size
        shapes: dict[str, tuple[int, ...]] = {}
        for k in range(self.num_heads):
            for j in range(self.num_layers):
                shapes[f"medusa_head.{k}.{j}.linear.weight"] = (h, h)
                shapes[f"medusa_head.{k}.{j}.linear.bias"] = (h,)
            if self.head == "full":
                shapes[f"medusa_head.{k}.{self.num_layers}.weight"] = (v, h)
        return shapes

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict; explicit choices become lists of lists."""
        data = attrs.asdict(self, recurse=False)
        if not isinstance(self.choices, str):
            data["choices"] = [list(path) for path in self.choices]
        data["target"] = dict(self.target)
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "MedusaConfig":
        """Inverse of ``to_dict``; unknown keys are an error (they usually mean another format)."""
        return config_from_dict(cls, data, label="Medusa")


def tree_size(config: MedusaConfig) -> int:
    """The nodes of one row's tree under the config's choices, root included
    (``DrafterSpec.tree_size``)."""
    return 1 + len(config.resolved_choices)
