"""One sampling group's part of a decode step (``specdec.decode.loop.Decoder``): its draft and
tree (``draft_group``), and the verifier's verdict on its rows of the forward, copied to the
host and checked (``verify_group``)."""

from __future__ import annotations

import numpy as np

from specdec.decode import checks as step_checks
from specdec.decode.batching import (
    Checked,
    Group,
    cut_to_budgets,
    draw,
    plain_group,
    verify_uniform_shape,
    verify_uniforms,
)
from specdec.decode.plan import DecodePlan
from specdec.types import DraftContext, SamplingConfig, TargetOutput

__all__ = ["draft_group", "verify_group"]


def draft_group(
    plan: DecodePlan,
    key: tuple[SamplingConfig, bool],
    slots: np.ndarray,
    active: dict,
    budgets: dict,
    hidden,
    *,
    sample_shape,
    want_draft_probs: bool,
) -> Group:
    """The group's draft and tree: a one-node tree per row when it does not draft, else the
    drafter's, cut to the rows' ``budgets``. ``active``: slot -> (request id, state);
    ``hidden``: (num_slots, H) each slot's hidden state at its root."""
    backend, target = plan.backend, plan.target
    sampling, drafts = key
    states, ids = [active[s][1] for s in slots], tuple(active[s][0] for s in slots)
    where = backend.from_numpy(slots, target)
    group = Group(
        sampling=sampling, slots=slots, ids=ids, states=states, where=where, draft=None, tree=None
    )
    if not drafts:
        return plain_group(group, backend, target)
    context = DraftContext(
        root_tokens=backend.from_numpy(np.array([s.root for s in states], dtype=np.int64), target),
        hidden=hidden[where],
        sampling=sampling,
        num_generated=np.array([s.emitted for s in states], dtype=np.int64),
        uniforms=draw(states, sample_shape) if sample_shape else None,
        want_draft_probs=want_draft_probs,
        history=tuple(s.history for s in states),
        slots=slots,
    )
    draft = plan.drafter.propose(context)
    cut = tuple(budgets.get(i) for i in ids)
    try:
        built = plan.tree_builder.build(draft)
    except Exception as exc:  # a bad draft fails in the tree builder first: name the drafter
        step_checks.checked_draft(plan, draft, cause=exc)
        raise
    tree, full = cut_to_budgets(built, cut, backend, target)
    return Group(
        sampling=sampling,
        slots=slots,
        ids=ids,
        states=states,
        where=where,
        draft=draft,
        tree=tree,
        budgets=cut,
        full_nodes=full,
    )


def verify_group(plan: DecodePlan, group: Group, output: TargetOutput) -> Checked:
    """Verify ``group`` on its rows of the output; the verdict copied to the host (the step's
    one wait for the device) and checked."""
    backend, target = plan.backend, plan.target
    uniforms = verify_uniforms(group.states, verify_uniform_shape(group.draft))
    verdict = plan.verifier.verify(
        group.tree,
        group.draft,
        output,
        group.sampling,
        None if uniforms is None else backend.from_numpy(uniforms, target),
    )
    path = backend.to_numpy(verdict.path)
    num_accepted = backend.to_numpy(verdict.num_accepted)
    bonus = backend.to_numpy(verdict.bonus_tokens)
    beams, tokens, parents, num_nodes = step_checks.check_group(plan, group.draft, group.tree)
    step_checks.check_verdict(
        plan.source("verifier"),
        path,
        num_accepted,
        bonus,
        parents,
        num_nodes,
        int(target.vocab_size),
    )
    return Checked(
        output=output,
        verdict=verdict,
        path=path,
        num_accepted=num_accepted,
        bonus=bonus,
        beams=beams,
        tokens=tokens,
        num_nodes=num_nodes,
    )
