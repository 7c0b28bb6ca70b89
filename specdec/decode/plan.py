"""``DecodePlan``: the pieces of one generation (backend, target, drafter, tree builder, verifier)
and the settings of requests made from bare prompts; ``specdec.decode.loop.Decoder`` runs one."""

from __future__ import annotations

from typing import Sequence

import attrs

from specdec.capabilities import drafter_caps
from specdec.protocols import Backend, Drafter, TargetModel, TreeBuilder, Verifier
from specdec.decode.requests import Request, batch_seeds
from specdec.slots import LOWER_OPTIONS, check_tree_room
from specdec.types import SamplingConfig

__all__ = ["DecodePlan"]


# a drafter's sizes that its options set, by attribute: (attribute, the option's name)
SIZES = (
    ("beam_width", "beam_width"),
    ("beam_length", "beam_length"),
    ("draft_length", "draft_length"),
    ("top_k", "tree_top_k"),
    ("depth", "depth"),
    ("total_tokens", "total_tokens"),
    ("top_t", "top_t"),
)


TREE_SIZES = {"beam_width", "beam_length", "draft_length", "depth", "total_tokens"}


def drafter_settings(drafter) -> list[str]:
    """A drafter object's beam or tree sizes as options ("beam_width=2", ...), and the
    prompt-lookup beam's length where one rides beside it ("lookup draft_length=10")."""
    inner = getattr(drafter, "inner", None)  # a drafter beside a prompt-lookup beam
    own = inner or drafter
    found = [
        f"{name}={getattr(own, attribute)}"
        for attribute, name in SIZES
        if type(getattr(own, attribute, None)) is int
    ]
    if type(getattr(own, "draft_length", None)) is int:  # a chain: its beams follow its length
        found = [f"draft_length={own.draft_length}"]
        if getattr(own, "store", None) is not None:
            found.append("with the answer store")
    most = getattr(getattr(own, "caps", None), "max_tree_size", None)
    if type(most) is int and most > 1 and not any(f.split("=")[0] in TREE_SIZES for f in found):
        found.append(f"trees of at most {most} nodes")  # Medusa's: no option sizes its tree
    if inner is not None and type(getattr(drafter, "draft_length", None)) is int:
        found.append(f"lookup draft_length={drafter.draft_length}")
    return found


@attrs.frozen(kw_only=True, repr=False)
class DecodePlan:
    """Everything a generation needs besides its requests; ``sampling``, ``max_new_tokens`` and
    ``eos_token_ids`` are the settings of requests made from bare prompts (``decode_steps``);
    ``speculation`` says how much each request drafts per step (``specdec.decode.budget``)."""

    backend: Backend
    target: TargetModel
    drafter: Drafter
    tree_builder: TreeBuilder
    verifier: Verifier
    sampling: SamplingConfig = attrs.field(factory=SamplingConfig)
    max_new_tokens: int = 128
    eos_token_ids: tuple[int, ...] = ()
    # "drafter" -> "drafter 'x' (plugin p, dist 1.0)"
    sources: dict[str, str] = attrs.field(factory=dict)
    # how much each request drafts per step (specdec.decode.budget): "auto", "always", "never", a
    # Speculation object, or None ($SPECDEC_SPECULATION, else "auto")
    speculation: object = None
    # how to make the drafter's trees smaller in its own settings (specdec.slots.lower_options)
    smaller_trees: str = LOWER_OPTIONS
    # how the drafter, tree builder and verifier were made (hashable; None: the drafter object
    # itself): "auto" keeps what it learnt per target and setting (specdec.decode.memory)
    setting: object = None
    # the drafter's settings came from a plan ``specdec plan`` kept (the caller named none)
    planned: bool = False

    def __repr__(self) -> str:
        """What the plan decodes with, in words (its components' sources and settings)."""
        parts = [
            self.describe_drafter(),
            self.source("tree_builder"),
            self.source("verifier"),
            f"speculation={self.speculation!r}",
            f"sampling={self.sampling!r}",
            f"max_new_tokens={self.max_new_tokens}",
            f"on backend {getattr(self.backend, 'name', type(self.backend).__name__)!r}",
        ]
        return f"DecodePlan({'; '.join(parts)})"

    def describe_drafter(self) -> str:
        """The drafter's source, with its beams' or tree's sizes where it has them."""
        sizes = drafter_settings(self.drafter)
        return self.source("drafter") + (f" ({', '.join(sizes)})" if sizes else "")

    def check_tree_room(self, room: int, fix: str = "") -> None:
        """The drafter's trees (``DrafterCaps.max_tree_size``) fit the ``room`` positions a slot
        has for the last step's tree; ``fix``: how the caller gets more room
        (``specdec.slots.check_tree_room``)."""
        who = self.source("drafter")
        limit = drafter_caps(self.drafter, who).max_tree_size
        check_tree_room(limit, room, who, fix, self.smaller_trees)

    def source(self, kind: str) -> str:
        """Who made the ``kind`` component, for errors about what it returned."""
        return (
            self.sources.get(kind)
            or f"{kind.replace('_', ' ')} {type(getattr(self, kind)).__name__}"
        )

    def requests(self, prompts: Sequence[Sequence[int]], seed=None) -> list[Request]:
        """One Request per prompt with the plan's settings (seeds as
        ``specdec.decode.requests.batch_seeds``)."""
        seeds = (
            batch_seeds(seed, len(prompts)) if not self.sampling.greedy else [None] * len(prompts)
        )
        return [
            Request(
                prompt=p,
                sampling=self.sampling,
                seed=s,
                max_new_tokens=self.max_new_tokens,
                stop_token_ids=self.eos_token_ids,
            )
            for p, s in zip(prompts, seeds)
        ]
