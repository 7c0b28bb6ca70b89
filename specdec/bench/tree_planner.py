"""Choose a tree drafter's settings on this machine by decoding with them.

EAGLE and EAGLE-3 grow a dynamic tree from their own scores each step (children per expanded
node, levels, nodes kept for the target), so a run recorded at the largest tree does not tell
what a smaller one would have accepted, as a recorded run of the widest, longest beams does for
beams cut narrower and shorter (``specdec.bench.planner``). Each setting is decoded for real over
the prompts instead (greedy, every step drafting its whole tree: the per-step budgets of
``specdec.decode.budget`` cut it under load, not here) and timed in the decode phase (prefill
excluded) against plain decoding timed before and after, on the same target.

The settings are searched one option at a time (coordinate ascent), in the order the drafter's
spec lists them (``DrafterSpec.tree_options``): each option's candidates with the others at their
best so far, the drafter's own defaults to start from; then the prompt-lookup beam riding along
or not, where the drafter takes one. That is the sum of the candidate counts in runs, not their
product: 15 runs for EAGLE-3's grid instead of 90. ``save`` keeps the best for ``generate``
(``specdec.tuning.dtype.save_drafter_plan``), which uses it when the caller names none of the
settings.
"""

from __future__ import annotations

from collections.abc import Sequence

import attrs

import specdec
from specdec.errors import InvalidInputError
from specdec.generation.api import encode_prompts
from specdec.generation.resolve import resolve
from specdec.plugins.registry import default_registry
from specdec.tuning.dtype import save_drafter_plan

__all__ = ["TreePlanRow", "plan_tree"]


@attrs.frozen(kw_only=True)
class TreePlanRow:
    """One decoded setting: ``options`` (the drafter's tree settings given; those not named are
    its defaults), ``lookup`` (the prompt-lookup beam rode along), measured ``tokens_per_step``
    (bonus counted), ``nodes_per_step`` (nodes verified per step, root counted) and ``speedup``
    (decode-phase tokens/s over plain decoding's)."""

    options: dict
    lookup: bool
    tokens_per_step: float
    nodes_per_step: float
    speedup: float


def _decode(target, prompts, drafter, options: dict, lookup: bool, backend, tokens: int):
    """(decode-phase tokens/s, tokens per step, nodes per step) over ``prompts``."""
    emitted, seconds, steps, verified = 0, 0.0, 0, 0
    for prompt in prompts:
        stats = specdec.generate(
            target,
            prompt,
            drafter=drafter,
            backend=backend,
            max_new_tokens=tokens,
            stop_at_eos=False,
            speculation="always",
            **({} if drafter == "none" else {"lookup": lookup}),
            **options,
        ).stats
        emitted += stats.new_tokens - 1  # the first token comes from the prompt's forward
        seconds += stats.time_draft + stats.time_verify + stats.time_other
        steps += stats.steps - 1
        verified += stats.verified_tokens
    return emitted / max(seconds, 1e-9), emitted / max(steps, 1), verified / max(steps, 1)


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
) -> list[TreePlanRow]:
    """Every setting decoded, best first (module docstring). ``lookup``: None tries the
    prompt-lookup beam on and off (where the drafter takes it), True or False keeps it so."""
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
    plain = [_decode(target, ids, "none", {}, False, backend, max_new_tokens)[0]]
    rows: dict[tuple, TreePlanRow] = {}

    def run(options: dict, with_lookup: bool) -> TreePlanRow | None:
        key = (tuple(sorted(options.items())), with_lookup)
        if key not in rows:
            try:
                rate, tau, nodes = _decode(
                    target, ids, drafter, options, with_lookup, backend, max_new_tokens
                )
            except InvalidInputError:  # a setting the drafter or the lookup beam refuses
                return None
            rows[key] = TreePlanRow(
                options=dict(options),
                lookup=with_lookup,
                tokens_per_step=tau,
                nodes_per_step=nodes,
                speedup=rate,  # tokens/s for now; over plain's once plain is timed again
            )
        return rows[key]

    start_lookup = bool(spec.pairs_with_lookup) if lookup is None else lookup
    best = run({}, start_lookup)
    if best is None:
        raise InvalidInputError(f"drafter {drafter!r} could not decode with its own defaults")
    for name, candidates in spec.tree_options.items():
        for value in candidates:
            row = run({**best.options, name: int(value)}, best.lookup)
            if row is not None and row.speedup > best.speedup:
                best = row
    if lookup is None:
        row = run(best.options, not best.lookup)
        if row is not None and row.speedup > best.speedup:
            best = row
    plain.append(_decode(target, ids, "none", {}, False, backend, max_new_tokens)[0])
    plain_rate = sum(plain) / len(plain)
    ranked = sorted(
        (attrs.evolve(r, speedup=r.speedup / plain_rate) for r in rows.values()),
        key=lambda r: -r.speedup,
    )
    if save:
        top = ranked[0]
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
