"""Value objects that flow through one decode step.

Shapes use one alphabet: B batch, N tree nodes, L beam length (the root included),
W beam width, K heads, T top-T tokens per head, V vocabulary, H hidden size, D tree depth.

Arrays inside these objects belong to the backend that made them (NumPy arrays for the
reference, torch tensors for the torch backend, ...). Validators here check only what can
be checked without reading device memory: ranks and shapes. The data invariants
(``parents[b, i] < i`` ...) are checked by ``specdec.reference.tree.check_tree``.
"""

from __future__ import annotations

import math
from typing import Any, Mapping

import attrs


def _rank(n: int):
    def check(instance, attribute, value):
        if value is not None and len(value.shape) != n:
            raise ValueError(
                f"{type(instance).__name__}.{attribute.name} must have rank {n}, got shape "
                f"{tuple(value.shape)}"
            )

    return check


@attrs.frozen(kw_only=True)
class SamplingConfig:
    """How target (and sampled-draft) logits become probabilities.

    ``temperature == 0`` means greedy: argmax, ties to the lowest token id.
    """

    temperature: float = attrs.field(default=0.0, converter=float)
    top_k: int | None = attrs.field(default=None)
    top_p: float | None = attrs.field(default=None)

    @temperature.validator
    def _check_temperature(self, attribute, value):
        if not math.isfinite(value) or value < 0:
            raise ValueError(f"temperature must be a finite number >= 0 (0 = greedy), got {value}")

    @top_k.validator
    def _check_top_k(self, attribute, value):
        if value is not None and (
            isinstance(value, bool) or not isinstance(value, int) or value < 1
        ):
            raise ValueError(f"top_k must be a positive integer or None, got {value!r}")

    @top_p.validator
    def _check_top_p(self, attribute, value):
        if value is not None and not (0.0 < float(value) <= 1.0):
            raise ValueError(f"top_p must be in (0, 1], got {value!r}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


@attrs.frozen(kw_only=True)
class DraftContext:
    """What a drafter sees at the start of a step.

    ``root_tokens`` (B,) int64: the last emitted token of each row; its KV entry is not in the
    cache yet, it is the root of this step's tree. ``hidden`` (B, H): the target's last-layer
    hidden state (after the final norm) at the position that produced ``root_tokens``.
    ``uniforms`` (B, W, L) float64 NumPy in [0, 1): randomness for drafters that sample their
    proposal (None when decoding is greedy). ``num_generated`` (B,) int64 NumPy: tokens emitted
    so far per row, the root included. ``want_draft_probs``: the verifier needs
    ``Draft.draft_probs`` even for a deterministic proposal. ``history``: one (T_b,) int64 NumPy
    array per row, the row's prompt and every token emitted so far, ending with the root while
    the row is unfinished (None when the caller has no text to give; the decode loop gives it).
    ``slots`` (B,) int64 NumPy: the target slot of each row's request (stateful drafters key
    their per-request state by it; the decode loop gives it).
    """

    root_tokens: Any = attrs.field(validator=_rank(1))
    hidden: Any = attrs.field(validator=_rank(2))
    sampling: SamplingConfig = attrs.field(factory=SamplingConfig)
    num_generated: Any = None
    uniforms: Any = None
    want_draft_probs: bool = False
    history: Any = None
    slots: Any = None


@attrs.frozen(kw_only=True)
class Draft:
    """A drafter's proposal; exactly one of ``beams`` or ``head_tokens`` is set.

    beams (B, W, L) int64: candidate sequences, ``beams[:, :, 0] == root_tokens``; beam 0 is
        the drafter's best. Produced by ReDrafter's beam search and by chain drafters.
    head_tokens (B, K, T) int64: the top-T tokens of each of K heads (Medusa), best first.
    draft_probs (B, W, L-1, V) or None: the drafter's distribution at each drafted position of
        each beam (``draft_probs[b, i, k]`` scores ``beams[b, i, k+1]``).
    sampled: True when each ``beams[b, i, k+1]`` was drawn from ``draft_probs[b, i, k]``
        independently per beam (multi-draft rejection sampling is exact only then). False for
        deterministic proposals (beam search, top-k), which the exact tree-walk verifier handles.
    beam_lengths (B, W) int64 NumPy or None: beams of different lengths. Beam i of row b is
        ``beams[b, i, :beam_lengths[b, i]]`` (1 <= length <= L, the root counts); the entries
        after it are padding that no tree builder reads (a prompt-lookup chain of 10 tokens
        beside 4-token model beams, a dynamic tree's short branches). On the host, so a tree
        builder knows the shapes without reading the device. None: every beam has L tokens.
        Only for drafts verified on the tree (no ``draft_probs``).
    """

    root_tokens: Any = attrs.field(validator=_rank(1))
    beams: Any = attrs.field(default=None, validator=_rank(3))
    head_tokens: Any = attrs.field(default=None, validator=_rank(3))
    draft_probs: Any = attrs.field(default=None, validator=_rank(4))
    sampled: bool = False
    beam_lengths: Any = attrs.field(default=None, validator=_rank(2))

    def __attrs_post_init__(self):
        if (self.beams is None) == (self.head_tokens is None):
            raise ValueError("Draft needs exactly one of beams (B, W, L) or head_tokens (B, K, T)")
        if self.draft_probs is not None and self.beams is None:
            raise ValueError("Draft.draft_probs is only meaningful for beams")
        if self.beam_lengths is not None:
            if self.beams is None or tuple(self.beam_lengths.shape) != tuple(self.beams.shape[:2]):
                raise ValueError(
                    f"Draft.beam_lengths must have the shape (B, W) of its beams "
                    f"{None if self.beams is None else tuple(self.beams.shape)}, "
                    f"got {tuple(self.beam_lengths.shape)}"
                )
            if self.draft_probs is not None:
                raise ValueError(
                    "Draft.beam_lengths is for drafts verified on the tree; a draft with "
                    "draft_probs (verified beam by beam) must have beams of one length"
                )
        if self.sampled and self.draft_probs is None:
            raise ValueError(
                "a sampled Draft must carry the draft_probs its tokens were drawn from"
            )

    @property
    def batch_size(self) -> int:
        return int(self.root_tokens.shape[0])


@attrs.frozen(kw_only=True)
class DraftTree:
    """A token tree to verify in one target forward. Node 0 is the root of every row.

    tokens (B, N) int64; parents (B, N) int64 with ``parents[:, 0] == -1`` and
    ``parents[b, i] < i``; depth (B, N) int64 (root 0), the position offset of each node;
    ancestor_mask (B, N, N) bool, ``ancestor_mask[b, i, j]`` iff node j is node i or one of
    its ancestors; num_nodes (B,) int64, rows are padded to N with nodes whose parent is the
    root and that nothing refers to.
    beam_to_node (B, W, L) int64 or None: for trees packed from beams, the node of each beam
        token (ReDrafter's "unpacker"); ``tokens[b, beam_to_node[b, i, k]] == beams[b, i, k]``.
    """

    tokens: Any = attrs.field(validator=_rank(2))
    parents: Any = attrs.field(validator=_rank(2))
    depth: Any = attrs.field(validator=_rank(2))
    ancestor_mask: Any = attrs.field(validator=_rank(3))
    num_nodes: Any = attrs.field(validator=_rank(1))
    beam_to_node: Any = attrs.field(default=None, validator=_rank(3))

    def __attrs_post_init__(self):
        b, n = self.tokens.shape
        for name in ("parents", "depth"):
            if tuple(getattr(self, name).shape) != (b, n):
                raise ValueError(
                    f"DraftTree.{name} must have shape {(b, n)}, got "
                    f"{tuple(getattr(self, name).shape)}"
                )
        if tuple(self.ancestor_mask.shape) != (b, n, n):
            raise ValueError(
                f"DraftTree.ancestor_mask must have shape {(b, n, n)}, got "
                f"{tuple(self.ancestor_mask.shape)}"
            )
        if tuple(self.num_nodes.shape) != (b,):
            raise ValueError(
                f"DraftTree.num_nodes must have shape {(b,)}, got {tuple(self.num_nodes.shape)}"
            )

    @property
    def batch_size(self) -> int:
        return int(self.tokens.shape[0])

    @property
    def size(self) -> int:
        """N, the padded number of nodes per row."""
        return int(self.tokens.shape[1])


@attrs.frozen(kw_only=True)
class Verdict:
    """What the verifier accepted.

    path (B, D+1) int64: node indices of the accepted path, ``path[:, 0] == 0`` (the root),
        entries past ``num_accepted[b]`` are -1.
    num_accepted (B,) int64: drafted tokens accepted (the root and the bonus not counted).
    bonus_tokens (B,) int64: the token the target chose after the last accepted node; it is
        emitted now and becomes the next step's root.
    """

    path: Any = attrs.field(validator=_rank(2))
    num_accepted: Any = attrs.field(validator=_rank(1))
    bonus_tokens: Any = attrs.field(validator=_rank(1))


@attrs.frozen(kw_only=True)
class TargetOutput:
    """logits (B, N, V) and last-layer hidden states after the final norm (B, N, H) of a tree
    forward; ``layers``: decoder layer index -> its output (B, N, H), for the layers asked for
    (logits and hidden are None, layers empty, for a forward without a tree). ``context``: one
    PromptOutput per prompt chunk of the forward, in order (its logits at the chunk's last
    token)."""

    logits: Any = attrs.field(validator=_rank(3))
    hidden: Any = attrs.field(validator=_rank(3))
    layers: Mapping[int, Any] = attrs.field(factory=dict)
    context: tuple = attrs.field(default=(), converter=tuple)


@attrs.frozen(kw_only=True)
class PromptOutput:
    """What the target computed for one admitted prompt of P tokens.

    logits (V,): at the last prompt position (they choose the first new token). hidden (P, H):
    last-layer hidden states after the final norm at every prompt position. ``layers``: decoder
    layer index -> its output (P, H), for the layers asked for.
    """

    logits: Any = attrs.field(validator=_rank(1))
    hidden: Any = attrs.field(validator=_rank(2))
    layers: Mapping[int, Any] = attrs.field(factory=dict)


@attrs.frozen(kw_only=True)
class Accepted:
    """What one step committed, told to stateful drafters (``RequestObserver.observe``).

    slots (B,) int64 NumPy: each row's slot. tokens (B, A) int64 NumPy: per row the root and the
    accepted drafted tokens (the entries now in the target's cache, in order), -1 past
    ``num_accepted[b] + 1``. num_accepted (B,) int64 NumPy. bonus_tokens (B,) int64 NumPy: the
    token chosen after them (the next root, not yet in the cache). hidden (B, A, H): the target's
    last-layer hidden states at those tokens' positions (backend arrays; entries past the
    accepted ones are unspecified). ``layers``: decoder layer index -> (B, A, H), as asked for in
    ``DrafterCaps.hidden_layers``. finished (B,) bool NumPy: the request ends with this step
    (``end`` follows).
    """

    slots: Any = attrs.field(validator=_rank(1))
    tokens: Any = attrs.field(validator=_rank(2))
    num_accepted: Any = attrs.field(validator=_rank(1))
    bonus_tokens: Any = attrs.field(validator=_rank(1))
    hidden: Any = attrs.field(validator=_rank(3))
    layers: Mapping[int, Any] = attrs.field(factory=dict)
    finished: Any = None


@attrs.frozen(kw_only=True)
class StepResult:
    """One target forward of the decode loop, already on the host.

    requests: the request id of each row (``specdec.decode.loop.decode_steps`` gives one row per
    prompt).
    new_tokens: per row, the tokens emitted by this step (empty for finished rows).
    num_accepted (B,), num_drafted (B,), num_verified (B,): per-row counts (numpy int64);
    num_accepted counts the drafted tokens the verifier accepted, also where the request's end
    (a stop token, its length) cut the step short and ``new_tokens`` keeps fewer
    (``GenerationStats.accepted_tokens`` counts only those kept, as an engine's ``Completion``
    does); num_drafted counts the distinct beams' tokens past the root, each beam at its own length.
    Times in seconds: draft (drafter + tree building), verify (target forward + verifier),
    other (commit, host transfer, bookkeeping), prefill (admitting prompts into slots).
    ``prefilled`` (B,) bool: rows whose request was admitted in this step (their first token
    comes from the prompt's forward, not from a tree). ``plain_reasons``: per row of a decode
    step, None where it drafted (verified more than its root), else why it decoded plainly (one
    of ``specdec.decode.budget.PLAIN_REASONS``); empty where not told.
    """

    step: int
    new_tokens: list[list[int]]
    num_accepted: Any
    num_drafted: Any
    num_verified: Any
    time_draft: float = 0.0
    time_verify: float = 0.0
    time_other: float = 0.0
    time_prefill: float = 0.0
    prefilled: Any = None
    requests: tuple[int, ...] = ()
    plain_reasons: tuple = ()

    @property
    def is_prefill(self) -> bool:
        """The rows' requests were admitted: their first tokens come from their prompts'
        forwards."""
        return self.prefilled is not None


# what each reason a step decoded plainly means (``specdec.decode.budget.PLAIN_REASONS``), as
# ``GenerationStats.describe_speculation`` says it
REASON_WORDS = {
    "prompt": "it carried a prompt's tokens",
    "measuring": "plain steps auto times drafting against",
    "prediction": "auto judged drafting would not pay, from this machine's step costs and the "
    "acceptance it had seen so far on this target (a fixed guess before any)",
    "realized": "drafting steps had delivered fewer tokens per second than plain ones",
    "never": "plain decoding asked for: speculation='never' or drafter='none'",
    "no draft": "the drafter proposed nothing",
}


@attrs.frozen(kw_only=True)
class GenerationStats:
    """Aggregates over a generation; ``tokens_per_step`` counts the bonus token
    (plain decoding = 1.0). ``drafting_row_steps``: the decode row-steps in which a row drafted
    (verified more than its root): what ``speculation="auto"`` chose, ``drafting_share`` of the
    decode row-steps (``describe_speculation`` says it in words); ``plain_reasons``: the others,
    counted by why they decoded plainly ({reason: row-steps}, ``PLAIN_REASONS`` of
    ``specdec.decode.budget``). ``accepted_tokens``: drafted tokens accepted and kept (a step
    that a request's end cut short counts what it kept), so per request new tokens = 1 + decode
    steps + accepted tokens, as an engine's ``Completion`` counts."""

    steps: int
    new_tokens: int
    row_steps: int
    drafted_tokens: int
    verified_tokens: int
    accepted_tokens: int
    time_draft: float
    time_verify: float
    time_other: float
    time_prefill: float
    drafting_row_steps: int = 0
    decode_row_steps: int = 0
    plain_reasons: dict = attrs.field(factory=dict)

    @property
    def verified_drafts(self) -> int:
        """Drafted nodes the target verified (roots not counted): what the steps' trees held
        after any budget cut them."""
        return max(self.verified_tokens - self.decode_row_steps, 0)

    @property
    def drafting_share(self) -> float:
        """The share of the decode row-steps in which the row drafted."""
        return self.drafting_row_steps / self.decode_row_steps if self.decode_row_steps else 0.0

    def describe_speculation(self) -> str:
        """One line: how often the rows drafted, and what it gave. A step counts as drafting when
        the row verified more than its root: under ``speculation="always"`` too, a drafter that
        proposes nothing for a step (prompt lookup where the text has no match) leaves it plain."""
        if not self.decode_row_steps:
            return "no decode step"
        plain = ", ".join(
            f"{n} {why}" + (f" ({REASON_WORDS[why]})" if why in REASON_WORDS else "")
            for why, n in sorted(self.plain_reasons.items())
        )
        # a batch's count is of row steps (each request's part of a step): 31 of 31 "decode
        # steps" read wrong beside stats.steps of 29 for two rows
        steps = "decode steps" if self.decode_row_steps <= self.steps else "decode row steps"
        accepted = (
            f"{self.accepted_tokens} of {self.drafted_tokens} drafted tokens accepted"
            if self.drafted_tokens
            else "nothing drafted"
        )
        return (
            f"drafted in {self.drafting_row_steps} of {self.decode_row_steps} {steps} "
            f"({self.drafting_share:.0%}); {accepted}"
            + (
                f" ({self.verified_drafts / self.drafting_row_steps:.1f} verified a drafting step)"
                if self.drafting_row_steps
                else ""
            )
            + f"; {self.tokens_per_step:.2f} tokens per step"
            + (f"; plain steps by reason: {plain}" if plain else "")
            + (  # where auto drafted in under half of the steps: drafting every step read as
                # boilerplate beside 85% drafted on a CPU with AVX-512
                "; speculation='always' drafts every step, to compare with what auto chose"
                if ("prediction" in self.plain_reasons or "realized" in self.plain_reasons)
                and self.drafting_share < 0.5
                else ""
            )
        )

    @property
    def tokens_per_step(self) -> float:
        return self.new_tokens / self.row_steps if self.row_steps else 0.0

    @property
    def time_total(self) -> float:
        return self.time_prefill + self.time_draft + self.time_verify + self.time_other

    @property
    def tokens_per_second(self) -> float:
        return self.new_tokens / self.time_total if self.time_total > 0 else 0.0


@attrs.frozen(kw_only=True)
class GenerationResult:
    """tokens: the new tokens of each row (a flat list when a single prompt was given)."""

    tokens: list
    stats: GenerationStats
    text: Any = None
