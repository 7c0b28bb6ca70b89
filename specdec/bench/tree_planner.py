"""Choose a tree drafter's settings on this machine by decoding with them.

EAGLE and EAGLE-3 grow a dynamic tree from their own scores each step (children per expanded
node, levels, nodes kept for the target), so a run recorded at the largest tree does not tell
what a smaller one would have accepted, as a recorded run of the widest, longest beams does for
beams cut narrower and shorter (``specdec.bench.planner``). Each setting is decoded for real over
the prompts instead (greedy, every step drafting its whole tree: the per-step budgets of
``specdec.decode.budget`` cut it under load, not here), each prompt timed in the decode phase
(prefill excluded) against plain decoding of the same prompt decoded beside it
(``specdec.bench.side_by_side``: a setting's candidates and plain decoding take each prompt in
turn); a setting's speedup is the median over the prompts of those ratios, which a prompt
slowed by other work on the machine moves less than a total would (and which, unlike a median
step, counts the large trees' slower steps with the tokens they bring). Plain decoding timed
before and after every setting had let a virtual machine's drift of minutes into the figures:
settings decoding the same trees measured 1.98x and 1.72x, 1.67x and 1.35x in one plan.

What ``generate`` decodes now, naming no setting (the checkpoint's own tree, or a plan kept
before), is decoded beside the first option's candidates and shown with the others
(``TreePlanRow.current``); it is never the choice. The settings are searched one option at a
time (coordinate ascent), in the order the drafter's spec lists them
(``DrafterSpec.tree_options``): each option's candidates with the others at their best so far
(the checkpoint's own before an option is reached); then the prompt-lookup beam riding along or
not, where the drafter takes one. That is the sum of the candidate counts in runs, not their
product: 15 runs for EAGLE-3's grid instead of 90. Every run of the search names a setting, so a
plan kept before does not stand in for the checkpoint's own. ``save`` keeps the best for
``generate`` (``specdec.tuning.plans.save_drafter_plan``), which uses it when the caller names
none of the settings."""

from __future__ import annotations

from collections.abc import Sequence

import attrs
import numpy as np

import specdec
from specdec.errors import InvalidInputError
from specdec.generation.encoding import encode_prompts
from specdec.generation.resolve import resolve
from specdec.plugins.registry import default_registry
from specdec.progress import progress as progress_bar
from specdec.bench.side_by_side import PLAIN, decode_once, side_by_side
from specdec.bench.trust import Measured, behind, impossible, leads, reasons_not_to_keep
from specdec.tuning.plans import save_drafter_plan

__all__ = ["TreePlanRow", "plan_tree", "why_not_kept"]


@attrs.frozen(kw_only=True)
class TreePlanRow:
    """One decoded setting: ``options`` (the drafter's tree settings given; those not named are
    its defaults), ``lookup`` (the prompt-lookup beam rode along), measured ``tokens_per_step``
    (bonus counted), ``nodes_per_step`` (nodes verified per step, root counted) and ``speedup``
    (decode-phase tokens/s over plain decoding's)."""

    options: dict
    lookup: bool | None
    tokens_per_step: float
    nodes_per_step: float
    speedup: float
    busy: bool = False  # decoded while other work took the cores (specdec.bench.trust)
    # what generate decodes now, naming no setting (the checkpoint's own, or a plan kept before;
    # lookup None: its default): shown beside the others, never chosen or kept
    current: bool = False

    def same_trees(self, other: "TreePlanRow") -> bool:
        """Whether ``other`` decoded the same tokens and nodes per step over every prompt: most
        often the same trees (a ``tree_top_k`` and ``depth`` that cap the tree below
        ``total_tokens``), whose speeds differ by noise alone."""
        return (self.tokens_per_step, self.nodes_per_step) == (
            other.tokens_per_step,
            other.nodes_per_step,
        )

    def alike(self, other: "TreePlanRow") -> bool:
        """Whether ``other`` decoded tokens and nodes per step within ``ALIKE`` of these: a
        setting whose trees differ from generate's by a node now and then (2.15 against 2.17
        tokens, 9.2 nodes per step) was kept at 1.53x over 1.35x, and bench measured them
        tied."""
        return all(
            abs(a - b) <= ALIKE * max(a, b)
            for a, b in (
                (self.tokens_per_step, other.tokens_per_step),
                (self.nodes_per_step, other.nodes_per_step),
            )
        )


ALIKE = 0.02  # tokens and nodes per step this close: most often (nearly) the same trees


def plan_noise(rows: Sequence[TreePlanRow]) -> float:
    """How far apart this plan measured rows that decoded the same trees (the largest ratio of
    two such rows' speedups, less 1; 0 where no two did): its own noise, measured."""
    quiet = [r for r in rows if not r.busy and r.speedup > 0]
    return max(
        (a.speedup / b.speedup - 1 for a in quiet for b in quiet if a.same_trees(b)), default=0.0
    )


def _better(row: TreePlanRow | None, best: TreePlanRow | None) -> TreePlanRow | None:
    """The search's best so far: a row timed on a quiet machine before any timed beside other
    work (whose speedups say little), then the faster; None (a refused setting) never."""
    if row is None or best is None:
        return row or best
    return row if (row.busy, -row.speedup) < (best.busy, -best.speedup) else best


def plan_tree(
    model,
    drafter: str,
    prompts: Sequence,
    *,
    backend: str = "torch",
    dtype: str | None = None,
    max_new_tokens: int = 64,
    lookup: bool | None = None,
    save: bool = False,
    clock: Measured | None = None,
    progress: bool = False,
) -> list[TreePlanRow]:
    """Every setting decoded, best first (module docstring), timed inside ``clock``. ``lookup``:
    None tries the prompt-lookup beam on and off (where the drafter takes it), True or False
    keeps it so. ``save`` keeps the best for ``generate`` unless it cannot be trusted
    (``specdec.bench.trust.reasons_not_to_keep``: a busy machine, a speedup above its tokens per
    step)."""
    clock = clock if clock is not None else Measured()
    registry = default_registry()
    backend_obj = registry.get("backend", backend).factory()
    spec = resolve("drafter", drafter, registry, backend_obj.name).spec
    if spec is None or not spec.tree_options:
        trees = [n for n in registry.names("drafter_spec") if registry.drafter_spec(n).tree_options]
        raise InvalidInputError(
            f"drafter {drafter!r} has no tree settings to plan; tree drafters installed: "
            f"{', '.join(sorted(trees)) or 'none'} (a beam drafter such as redrafter is planned "
            "by its beams: specdec plan --widths ... --lengths ...)"
        )
    target = specdec.load(model, backend=backend, dtype=dtype)
    template = getattr(target, "chat_template", None)
    ids = [
        encode_prompts(p, target.tokenizer, target.vocab_size, chat_template=template)[0][0]
        for p in prompts
    ]
    rows: dict[tuple, TreePlanRow | None] = {}  # None: a setting the drafter refused
    most = 1 + sum(map(len, spec.tree_options.values())) + (lookup is None)  # settings at most
    bar = progress_bar(  # a prompt at a time: an option's settings decode side by side, minutes
        total=most * len(ids), desc=f"plan: decoding at most {most} tree settings", unit="prompt",
        enabled=progress, announce=True,
    )  # fmt: skip

    def key_of(options: dict, with_lookup: bool | None) -> tuple:
        return (tuple(sorted(options.items())), with_lookup)

    def run(wanted: list[tuple[dict, bool | None]]) -> list[TreePlanRow | None]:
        """``wanted`` settings (options, lookup) decoded side by side with plain decoding, prompt
        by prompt (``specdec.bench.side_by_side``), those decoded before not again."""
        fresh = {key_of(*w): w for w in wanted if key_of(*w) not in rows}
        settings = {
            key: (drafter, {**options, "lookup": with_lookup})
            for key, (options, with_lookup) in fresh.items()
        }
        if settings:
            decoded = side_by_side(
                target, ids, {"plain": PLAIN, **settings}, backend=backend,
                tokens=max_new_tokens, clock=clock, stop_at_eos=False,
                on_decode=lambda key: key == "plain" or bar.update(1),
            )  # fmt: skip
            plain = decoded["plain"]
            for key, (options, with_lookup) in fresh.items():
                one = decoded[key]
                rows[key] = one and TreePlanRow(
                    options=dict(options),
                    lookup=with_lookup,
                    tokens_per_step=one.tokens_per_step,
                    nodes_per_step=one.nodes_per_step,
                    # each prompt's against plain decoding of the same prompt, seconds apart
                    speedup=float(np.median(one.rates / plain.rates)),
                    busy=one.busy,
                    current=key == key_of({}, None),  # generate's setting: no option named
                )
        return [rows[key_of(*w)] for w in wanted]

    # untimed, once, a whole prompt: the first decode with the drafter pays what a first call
    # pays (building it, its first forwards at each tree size and position), which counted
    # against generate's setting, decoded first: 1.06x against 1.49x for the same trees after
    # no warm-up, and still 17.2 against 18.9 tokens/s after a warm-up of 8 tokens
    decode_once(
        target, ids[0], drafter, {"lookup": None}, backend=backend, tokens=max_new_tokens,
        stop_at_eos=False,
    )  # fmt: skip

    start_lookup = bool(spec.pairs_with_lookup) if lookup is None else lookup
    # every run names a setting: generate then uses the checkpoint's own for the others, never
    # a plan kept before (it applies one only where the caller names none); an option's
    # candidates, with the others at their best so far, are decoded side by side
    best, now = None, [({}, None)]  # generate's setting, beside the first option's candidates
    for name, candidates in spec.tree_options.items():
        base, with_lookup = (best.options, best.lookup) if best else ({}, start_lookup)
        wanted = [({**base, name: int(value)}, with_lookup) for value in candidates]
        for row in run(now + wanted)[len(now) :]:
            best = _better(row, best)
        now = []
    if best is None:
        raise InvalidInputError(f"drafter {drafter!r} refused every tree setting tried")
    if lookup is None:
        best = _better(run([(best.options, not best.lookup)])[0], best)
    bar.close()
    ranked = sorted(
        (row for row in rows.values() if row is not None),
        key=lambda r: (r.busy, impossible(r.speedup, r.tokens_per_step), -r.speedup),
    )
    top = next(row for row in ranked if not row.current)
    if save and not why_not_kept(ranked, clock, prompts=len(ids)):
        save_drafter_plan(
            backend_obj,
            target,
            drafter,
            options=top.options,
            details={
                "lookup": top.lookup,
                "measured_speedup": round(top.speedup, 3),
                "tokens_per_step": round(top.tokens_per_step, 3),
                "prompts": len(ids),
            },
        )
    return ranked


def why_not_kept(
    ranked: Sequence[TreePlanRow], clock: Measured, *, prompts: int | None = None
) -> list[str]:
    """Why the best setting of ``plan_tree``'s rows is not kept for ``generate`` (none: it is):
    ``specdec.bench.trust``'s reasons, and a best that decoded the same tokens and nodes per
    step as generate's setting now (most often the same trees: its lead is noise) or no faster
    than it."""
    top = next(row for row in ranked if not row.current)
    reasons = reasons_not_to_keep(
        clock, top.speedup, top.tokens_per_step, busy=top.busy, prompts=prompts
    )
    now = next((row for row in ranked if row.current), None)
    if now is None or now.busy:
        return reasons
    noise = plan_noise(ranked)
    if top.same_trees(now):
        reasons.append(
            "it decoded the same tokens and nodes per step as generate's setting now (most often "
            f"the same trees: {top.speedup:.2f}x against {now.speedup:.2f}x is noise)"
        )
    elif top.alike(now):
        reasons.append(
            f"it decoded nearly the same tokens and nodes per step as generate's setting now "
            f"({top.tokens_per_step:.2f} against {now.tokens_per_step:.2f} tokens, "
            f"{top.nodes_per_step:.1f} against {now.nodes_per_step:.1f} nodes: most often the "
            f"same trees, so {top.speedup:.2f}x against {now.speedup:.2f}x is noise)"
        )
    elif not leads(top.speedup, now.speedup):
        reasons.append(
            f"it measured {top.speedup:.2f}x, {behind(top.speedup, now.speedup)} of generate's "
            "setting now"
        )
    elif top.speedup < (1 + noise) * now.speedup:
        reasons.append(
            f"it measured {top.speedup:.2f}x against generate's setting now at "
            f"{now.speedup:.2f}x, a lead within this plan's own noise (rows that decoded the "
            f"same trees measured up to {noise:.0%} apart)"
        )
    return reasons
