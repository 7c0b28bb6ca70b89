"""ReDrafter drafter configuration and weight layout.

Weights are stored as a flat dict of arrays with these names (``Linear`` weights are
(out, in), applied as ``x @ weight.T + bias``; E is exit_dim, H the target's hidden size):

| name | shape | present when |
|---|---|---|
| ``input_proj.weight``, ``input_proj.bias`` | (E, 2H), (E,) | ``exit_dim != 2H`` |
| ``lm_head.{i}.linear.weight`` | (E, E) | ``i < num_draft_layers`` (residual SiLU blocks) |
| ``lm_head.{i}.linear.bias`` | (E,) | ``i < num_draft_layers`` |
| ``lm_head.{num_draft_layers}.weight`` | (V, E) | ``head == "full"`` |
| ``head_proj.weight`` | (H, E) | ``head == "tied"`` (then the target's LM head (V, H)) |
| ``rnn_w.weight`` | (H, H) | ``rnn`` |
| ``rnn_u.weight``, ``rnn_u.bias`` | (H, H), (H,) | ``rnn`` |
| ``vocab_shortlist`` | (S,) int | ``shortlist_size`` S (``specdec.drafting.shortlist``) |

The token embedding is the target's own ``embed_tokens`` (V, H), so the RNN state has size H.
"""

from __future__ import annotations

from typing import Any

import attrs
import numpy as np

from specdec.models.checkpoints import check_weight_shapes, config_from_dict
from specdec.drafting.shortlist import check_shortlist

__all__ = [
    "MODEL_TYPE",
    "RNN_VARIANTS",
    "HEADS",
    "RedrafterConfig",
    "beam_tree_size",
    "check_weights",
    "tree_size",
]

MODEL_TYPE = "specdec_redrafter"
RNN_VARIANTS = ("apple", "trtllm", "paper")
HEADS = ("full", "tied")


def _positive_int(instance, attribute, value):
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(
            f"RedrafterConfig.{attribute.name} must be a positive integer, got {value!r}"
        )


def _one_of(choices):
    def check(instance, attribute, value):
        if value not in choices:
            raise ValueError(
                f"RedrafterConfig.{attribute.name} must be one of {choices}, got {value!r}"
            )

    return check


@attrs.frozen(kw_only=True)
class RedrafterConfig:
    """Hyper-parameters of a ReDrafter drafter (docs/algorithms/redrafter.md).

    vocab_size V, hidden_size H: the target's. exit_dim: width of the residual blocks
    (default 2H; an ``input_proj`` 2H -> exit_dim exists only when it differs).
    rnn_variant: the recurrence, used when ``rnn`` (otherwise the state is the cumulative sum
    of the drafted tokens' embeddings):
      "apple":  s_0 = 0,     s_t = SiLU(W e_t + U s_{t-1} + b)
      "trtllm": s_1 = W e_1, s_t = W e_t + U s_{t-1} + b
      "paper":  s_1 = e_1,   s_t = SiLU(W e_t + U s_{t-1} + b)
    where e_t is the embedding of the t-th token of the beam (e_1: the root).
    head: "full" (exit_dim -> V) or "tied" (exit_dim -> H, then the target's LM head).
    draft_top_k: keep only the top-k drafter logits before ranking beams (None: no warp).
    shortlist_size: S, when the drafter proposes only the S token ids of its ``vocab_shortlist``
    weight (``specdec.drafting.shortlist``: the head then costs S/V of the full projection); None:
    all V. beam_width W, beam_length L (root included): defaults for beam search.
    target: what the drafter was trained for (name, fingerprint, vocab_size, hidden_size).
    """

    vocab_size: int = attrs.field(validator=_positive_int)
    hidden_size: int = attrs.field(validator=_positive_int)
    exit_dim: int = attrs.field(
        default=attrs.Factory(lambda self: 2 * self.hidden_size, takes_self=True),
        validator=_positive_int,
    )
    num_draft_layers: int = attrs.field(default=1)
    rnn: bool = attrs.field(default=True, validator=attrs.validators.instance_of(bool))
    rnn_variant: str = attrs.field(default="apple", validator=_one_of(RNN_VARIANTS))
    head: str = attrs.field(default="full", validator=_one_of(HEADS))
    draft_top_k: int | None = attrs.field(default=None)
    shortlist_size: int | None = attrs.field(default=None)
    beam_width: int = attrs.field(default=4, validator=_positive_int)
    beam_length: int = attrs.field(default=4)
    target: dict = attrs.field(factory=dict, converter=dict)
    model_type: str = attrs.field(default=MODEL_TYPE)

    @num_draft_layers.validator
    def _check_layers(self, attribute, value):
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ValueError(
                f"RedrafterConfig.num_draft_layers must be an integer >= 0, got {value!r}"
            )

    @draft_top_k.validator
    def _check_top_k(self, attribute, value):
        if value is not None:
            _positive_int(self, attribute, value)

    @shortlist_size.validator
    def _check_shortlist(self, attribute, value):
        if value is not None:
            _positive_int(self, attribute, value)
            if value > self.vocab_size:
                raise ValueError(
                    f"RedrafterConfig.shortlist_size={value} exceeds vocab_size={self.vocab_size}"
                )

    @property
    def draft_vocab_size(self) -> int:
        """How many tokens the drafter can propose: S with a shortlist, else V."""
        return self.shortlist_size or self.vocab_size

    @beam_length.validator
    def _check_length(self, attribute, value):
        if isinstance(value, bool) or not isinstance(value, int) or value < 2:
            raise ValueError(
                "RedrafterConfig.beam_length must be an integer >= 2 (the root plus at least one "
                f"drafted token), got {value!r}"
            )

    @model_type.validator
    def _check_model_type(self, attribute, value):
        if value != MODEL_TYPE:
            raise ValueError(
                f"not a ReDrafter config: model_type is {value!r}, expected {MODEL_TYPE!r}"
            )

    def to_dict(self) -> dict[str, Any]:
        """A JSON-serialisable dict (the content of ``config.json``)."""
        return attrs.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RedrafterConfig:
        """Inverse of ``to_dict``; unknown keys are an error so typos do not pass silently."""
        return config_from_dict(cls, data, label="ReDrafter", model_type=MODEL_TYPE)

    def weight_shapes(self) -> dict[str, tuple[int, ...]]:
        """The name and shape of every weight this config needs (see the module docstring)."""
        hidden, exit_dim = self.hidden_size, self.exit_dim
        shapes: dict[str, tuple[int, ...]] = {}
        if exit_dim != 2 * hidden:
            shapes["input_proj.weight"] = (exit_dim, 2 * hidden)
            shapes["input_proj.bias"] = (exit_dim,)
        for i in range(self.num_draft_layers):
            shapes[f"lm_head.{i}.linear.weight"] = (exit_dim, exit_dim)
            shapes[f"lm_head.{i}.linear.bias"] = (exit_dim,)
        if self.head == "full":
            shapes[f"lm_head.{self.num_draft_layers}.weight"] = (self.vocab_size, exit_dim)
        else:
            shapes["head_proj.weight"] = (hidden, exit_dim)
        if self.rnn:
            shapes["rnn_w.weight"] = (hidden, hidden)
            shapes["rnn_u.weight"] = (hidden, hidden)
            shapes["rnn_u.bias"] = (hidden,)
        if self.shortlist_size is not None:
            shapes["vocab_shortlist"] = (self.shortlist_size,)
        return shapes


def check_weights(config: RedrafterConfig, weights: dict[str, Any]) -> None:
    """Raise ValueError listing missing, unexpected and wrongly shaped weights for ``config``."""
    check_weight_shapes(
        config.weight_shapes(),
        weights,
        label="ReDrafter",
        settings=f"head={config.head!r}, rnn={config.rnn}, exit_dim={config.exit_dim}, "
        f"num_draft_layers={config.num_draft_layers}, shortlist_size={config.shortlist_size}",
    )
    if config.shortlist_size is not None:
        check_shortlist(
            np.asarray(weights["vocab_shortlist"]), config.vocab_size, config.shortlist_size
        )


def beam_tree_size(beam_width: int, beam_length: int) -> int:
    """The most nodes (root included) of the prefix tree of W beams of length L: 1 + W * (L - 1)."""
    return 1 + beam_width * (beam_length - 1)


def tree_size(config: RedrafterConfig) -> int:
    """The most nodes of one row's tree under the config's own beams (``DrafterSpec.tree_size``)."""
    return beam_tree_size(config.beam_width, config.beam_length)
