"""What the decode loop needs to know about a drafter or a verifier, declared as data.

A drafter has a ``caps: DrafterCaps`` attribute and a verifier a ``caps: VerifierCaps``
attribute; the loop and ``generate`` read nothing else from them besides the protocol methods
(docs/design.md section 2, docs/decisions/0006-request-slots.md). ``drafter_caps`` and
``verifier_caps`` read them and name the plugin when one is missing; ``request_end`` reads once
whether a stateful drafter's ``end`` takes the request's finish reason.
"""

from __future__ import annotations

import inspect
from typing import Any, Callable, Mapping

import attrs

from specdec.errors import PluginOutputError


def _options(value: Mapping[str, Any] | None) -> Mapping[str, Any]:
    return dict(value or {})


@attrs.frozen(kw_only=True)
class DrafterCaps:
    """A drafter's needs and habits.

    tree_builder: the tree builder its drafts are meant for and its options (``"prefix_tree"``
        packs beams, ``"medusa_tree"`` the heads' top-k, ...); the user may pick another.
    sample_shape: (W, L) when the drafter draws its proposal with the loop's uniforms
        (``DraftContext.uniforms`` (B, W, L)); None when it draws nothing.
    sampled_proposals: its beams are independent draws from ``Draft.draft_probs`` (the loop then
        verifies sampled decoding with rejection sampling by default).
    stateful: the loop calls ``begin`` / ``observe`` / ``end``
        (``specdec.protocols.RequestObserver``) so the drafter can keep per-request state, e.g. its
        own KV cache.
    prompt_states: (stateful drafters) ``begin`` needs the target's hidden states at every
        prompt position (``PromptOutput.hidden`` (P, H) and ``layers``), as a feature-level
        drafter does: its requests are then prefilled whole by ``TargetModel.admit``. False:
        they are prefilled in chunks like any other, and ``begin`` gets the states at the last
        prompt position only ((1, H)), once the prompt is in (a token-level drafter, a draft
        model with its own cache). True by default, what stateful drafters always got.
    hidden_layers: decoder layers (0-based) whose outputs the drafter needs beside the last
        layer's, in ``PromptOutput.layers`` and ``Accepted.layers`` (e.g. low, mid and high
        layers for fused-feature drafters). Only stateful drafters receive them.
    max_tree_size: the most nodes (root included) one row's draft tree can hold, e.g.
        1 + W * (L - 1) for W beams of length L; the loop refuses a drafter whose trees cannot
        fit the room a slot keeps for them before any step runs (None: not known in advance;
        each tree is then checked when it is verified).
    """

    tree_builder: tuple[str, Mapping[str, Any]] = attrs.field(
        default=("prefix_tree", {}), converter=lambda v: (str(v[0]), _options(v[1]))
    )
    sample_shape: tuple[int, int] | None = attrs.field(
        default=None, converter=lambda v: None if v is None else (int(v[0]), int(v[1]))
    )
    sampled_proposals: bool = False
    stateful: bool = False
    prompt_states: bool = True
    hidden_layers: tuple[int, ...] = attrs.field(
        default=(), converter=lambda v: tuple(int(i) for i in v)
    )
    max_tree_size: int | None = attrs.field(
        default=None,
        converter=lambda v: None if v is None else int(v),
        validator=lambda _, __, v: _check_tree_size(v),
    )


@attrs.frozen(kw_only=True)
class VerifierCaps:
    """needs_draft_probs: the verifier reads ``Draft.draft_probs`` (the loop asks the drafter for
    them, ``DraftContext.want_draft_probs``). needs_sampled_draft: it is exact only for beams
    drawn from ``draft_probs`` (``Draft.sampled``). samples: it draws sampled requests' tokens
    (False: greedy only, temperature, top-k and top-p ignored; ``generate`` and the engine then
    refuse sampled requests)."""

    needs_draft_probs: bool = False
    needs_sampled_draft: bool = False
    samples: bool = True


class VerifierRule:
    """The base of every backend's verifiers: what a rule declares as class attributes, and the
    ``caps`` the loop reads from them. ``lossless``: the output distribution is the target's;
    ``needs_draft_probs``: ``Draft.draft_probs`` must be given; ``needs_sampled_draft``: the
    beams must be drawn from them (``Draft.sampled``); ``uses_uniforms``: it reads uniforms;
    ``uses_beam_uniforms``: it reads ``uniforms[:, :, 1:]``."""

    lossless: bool = True
    needs_draft_probs: bool = False
    needs_sampled_draft: bool = False
    uses_uniforms: bool = True
    uses_beam_uniforms: bool = False

    @property
    def caps(self) -> VerifierCaps:
        """What the loop reads: whether this rule needs the drafter's distributions."""
        return VerifierCaps(
            needs_draft_probs=self.needs_draft_probs,
            needs_sampled_draft=self.needs_sampled_draft,
            samples=self.uses_uniforms,  # a rule that reads no uniforms cannot sample
        )


def _check_tree_size(value) -> None:
    if value is not None and value < 1:
        raise ValueError(
            f"DrafterCaps.max_tree_size must be None or an integer >= 1 (the root), got {value!r}"
        )


def drafter_caps(drafter: Any, source: str = "") -> DrafterCaps:
    """``drafter.caps``, or an error naming the plugin when it declares none."""
    caps = getattr(drafter, "caps", None)
    if not isinstance(caps, DrafterCaps):
        who = source or f"drafter {type(drafter).__name__}"
        raise PluginOutputError(
            f"{who} declares no capabilities: a drafter needs a `caps` attribute holding a "
            f"specdec.DrafterCaps (got {type(caps).__name__}); see docs/writing-a-drafter.md"
        )
    return caps


def ends_with_reason(drafter: Any) -> bool:
    """Whether ``drafter.end`` takes the request's finish reason after its slot (``end(slot,
    reason)``). An ``end(slot)`` written before the reason existed does not (nor one whose
    signature cannot be read): it is called with the slot alone."""
    end = getattr(drafter, "end", None)
    if end is None:
        return False
    try:
        inspect.signature(end).bind(0, "stop")
    except (TypeError, ValueError):
        return False
    return True


def request_end(drafter: Any) -> Callable[[int, str], None]:
    """``end(slot, reason)`` for a stateful drafter, passing the reason only to an ``end`` that
    takes one (``ends_with_reason``, decided once, here)."""
    if ends_with_reason(drafter):
        return lambda slot, reason: drafter.end(slot, reason)
    return lambda slot, reason: drafter.end(slot)


def verifier_caps(verifier: Any, source: str = "") -> VerifierCaps:
    """``verifier.caps``, or an error naming the plugin when it declares none."""
    caps = getattr(verifier, "caps", None)
    if not isinstance(caps, VerifierCaps):
        who = source or f"verifier {type(verifier).__name__}"
        raise PluginOutputError(
            f"{who} declares no capabilities: a verifier needs a `caps` attribute holding a "
            f"specdec.VerifierCaps (got {type(caps).__name__}); see docs/writing-a-backend.md"
        )
    return caps
