"""Host-side pieces of a decode step over many requests (``specdec.decode.loop.Decoder``): joining
the trees of several sampling groups into one forward and splitting its output back, the verdict
that commits them together (the step's records: ``specdec.decode.step_results``).

Requests that share sampling settings form a group: one draft, one tree, one verifier call.
Every group's tree rides the same target forward: ``merge_trees`` pads their rows to the widest
(padding nodes hang off the root and attend to it and themselves, as ``DraftTree`` pads), the
verifier of each group reads its rows of the output (``group_output``), and ``merge_verdicts``
pads the groups' accepted paths into the one verdict ``commit`` takes.

Requests whose budget is 0 this step (``specdec.decode.budget``) form groups of their own that do
not draft: ``plain_group_tree`` gives them one-node trees on the host, with no drafter call. A
drafting request's tree is cut to its budget by ``cut_tree`` (its first nodes: parents come
first, so they form a tree).
"""

from __future__ import annotations

from typing import Sequence

import attrs
import numpy as np

from specdec.reference.tree import check_beam_lengths
from specdec.slots import on_target
from specdec.decode.requests import RequestState
from specdec.types import (
    Accepted,
    Draft,
    DraftTree,
    PromptOutput,
    SamplingConfig,
    TargetOutput,
    Verdict,
)

__all__ = [
    "Checked",
    "commit_verdict",
    "drafted_counts",
    "Group",
    "cut_to_budgets",
    "cut_tree",
    "draw",
    "drafted_tokens",
    "group_output",
    "last_position",
    "merge_trees",
    "merge_verdicts",
    "observe_accepted",
    "on_target",
    "plain_group",
    "plain_tree",
    "step_tree",
    "verify_uniform_shape",
    "verify_uniforms",
]


def verify_uniform_shape(draft: Draft) -> tuple[int, int]:
    """(D+1, W+1) of the verifier's uniforms for this draft (see ``specdec.protocols.Verifier``)."""
    if draft.beams is not None:
        return int(draft.beams.shape[2]), int(draft.beams.shape[1]) + 1
    return int(draft.head_tokens.shape[1]) + 1, 1


def drafted_tokens(beams: np.ndarray, lengths: np.ndarray | None = None) -> np.ndarray:
    """(B,) the tokens drafted in each row of ``beams`` (B, W, L) with ``lengths`` (B, W) (None:
    all L), roots not counted: a drafter that repeats a beam (a lookup beam without a match)
    drafted it once."""
    lengths = check_beam_lengths(lengths, beams.shape)  # (B, W): L each when None
    running = np.arange(beams.shape[2]) < lengths[..., None]  # (B, W, L)
    tokens = np.where(running, beams, -1)
    # (B, W, W): beam i equals beam j
    same = (tokens[:, :, None, :] == tokens[:, None, :, :]).all(axis=-1)
    repeats = np.tril(same, k=-1).any(axis=-1)  # (B, W): beam i equals an earlier beam
    return np.where(repeats, 0, lengths - 1).sum(axis=-1).astype(np.int64)


def merge_trees(
    trees: Sequence[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]],
) -> DraftTree:
    """One DraftTree (NumPy) whose rows are those of ``trees`` in order, each given as host
    arrays (tokens, parents, depth, ancestor_mask, num_nodes), padded to the widest."""
    width = max(t[0].shape[1] for t in trees)
    batch = sum(t[0].shape[0] for t in trees)
    tokens = np.zeros((batch, width), dtype=np.int64)
    parents = np.zeros((batch, width), dtype=np.int64)
    depth = np.ones((batch, width), dtype=np.int64)
    mask = np.zeros((batch, width, width), dtype=bool)
    mask[:, :, 0] = True
    mask[:, np.arange(width), np.arange(width)] = True
    num_nodes = np.zeros(batch, dtype=np.int64)
    row = 0
    for t_tokens, t_parents, t_depth, t_mask, t_num in trees:
        rows, n = t_tokens.shape
        block = slice(row, row + rows)
        tokens[block, :n], parents[block, :n], depth[block, :n] = t_tokens, t_parents, t_depth
        mask[block, :n, :n] = t_mask
        num_nodes[block] = t_num
        row += rows
    parents[:, 0], depth[:, 0] = -1, 0
    return DraftTree(
        tokens=tokens, parents=parents, depth=depth, ancestor_mask=mask, num_nodes=num_nodes
    )


def group_output(output: TargetOutput, start: int, stop: int, nodes: int) -> TargetOutput:
    """Rows ``start .. stop - 1`` of a merged forward's output, cut to the group's ``nodes``."""
    # basic slicing works on every backend's arrays
    cut = lambda value: value[start:stop, :nodes]  # noqa: E731
    return TargetOutput(
        logits=cut(output.logits),
        hidden=cut(output.hidden),
        layers={i: cut(v) for i, v in output.layers.items()},
    )


def merge_verdicts(checked: Sequence[Checked]) -> Verdict:
    """One host Verdict of the groups' checked verdicts in order; paths padded with -1."""
    width = max(c.path.shape[1] for c in checked)
    path = np.concatenate(
        [
            np.pad(c.path, ((0, 0), (0, width - c.path.shape[1])), constant_values=-1)
            for c in checked
        ]
    )
    return Verdict(
        path=path.astype(np.int64),
        num_accepted=np.concatenate([c.num_accepted for c in checked]).astype(np.int64),
        bonus_tokens=np.concatenate([c.bonus for c in checked]).astype(np.int64),
    )


def drafted_counts(group: Group, checked: Checked) -> np.ndarray:
    """(B,) tokens each row drafted: its distinct beams' tokens before deduplication into the
    tree, or, for a tree cut to a budget, what was verified."""
    num_nodes = checked.num_nodes
    drafted = (
        drafted_tokens(checked.beams, group.draft.beam_lengths)
        if checked.beams is not None
        else num_nodes - 1
    )
    return np.where(num_nodes < group.full_nodes, num_nodes - 1, drafted).astype(np.int64)


def commit_verdict(checked: Sequence[Checked], backend, target) -> Verdict:
    """The verdict the step commits: one group's own, or the groups' merged onto the target."""
    if len(checked) == 1:
        return checked[0].verdict
    merged = merge_verdicts(checked)
    return Verdict(
        path=backend.from_numpy(merged.path, target),
        num_accepted=backend.from_numpy(merged.num_accepted, target),
        bonus_tokens=backend.from_numpy(merged.bonus_tokens, target),
    )


def draw(states: list[RequestState], shape: tuple[int, ...]) -> np.ndarray | None:
    """(B, *shape) uniforms, row b from request b's own generator; None for greedy requests."""
    draws = [state.draw(shape) for state in states]
    return None if draws[0] is None else np.stack(draws)


def verify_uniforms(states: list[RequestState], shape: tuple[int, int]) -> np.ndarray | None:
    """(B, D+1, W+1) verifier uniforms: ``[:, d, 0]`` draws the token at depth d, the one of
    position ``emitted + d`` of the request's token stream (``RequestState.token_uniforms``);
    the per-beam tests ``[:, :, 1:]`` come from its other generator. None for greedy requests."""
    depth, columns = shape
    if states[0].generator is None:
        return None
    out = np.empty((len(states), depth, columns))
    for b, state in enumerate(states):
        out[b, :, 0] = state.token_uniforms(depth)
        if columns > 1:
            out[b, :, 1:] = state.draw((depth, columns - 1))
    return out


def plain_tree(roots: np.ndarray) -> DraftTree:
    """One-node trees (host) of the roots (B,): plain decoding of each row."""
    batch = len(roots)
    return DraftTree(
        tokens=np.asarray(roots, dtype=np.int64)[:, None],
        parents=np.full((batch, 1), -1),
        depth=np.zeros((batch, 1), dtype=np.int64),
        ancestor_mask=np.ones((batch, 1, 1), dtype=bool),
        num_nodes=np.ones(batch, dtype=np.int64),
        beam_to_node=np.zeros((batch, 1, 1), dtype=np.int64),
    )


def cut_tree(
    tokens: np.ndarray,
    parents: np.ndarray,
    depth: np.ndarray,
    mask: np.ndarray,
    num_nodes: np.ndarray,
    budgets: Sequence[int | None],
) -> DraftTree | None:
    """The host tree cut to ``budgets`` (per row: drafted nodes kept, None all): row b keeps its
    first ``budgets[b] + 1`` nodes (parents come before children, so they form a tree) and the
    rest become padding; the width shrinks to the largest row. None when no row is cut."""
    keep = np.array(
        [n if k is None else min(int(n), int(k) + 1) for n, k in zip(num_nodes, budgets)],
        dtype=np.int64,
    )
    if np.array_equal(keep, num_nodes):
        return None
    width = int(keep.max())
    padding = np.arange(width)[None, :] >= keep[:, None]  # (B, width)
    cut_mask = mask[:, :width, :width].copy()
    cut_mask[padding] = False
    cut_mask[:, :, 0] |= padding
    rows, nodes = np.nonzero(padding)
    cut_mask[rows, nodes, nodes] = True
    return DraftTree(
        tokens=np.where(padding, 0, tokens[:, :width]),
        parents=np.where(padding, 0, parents[:, :width]),
        depth=np.where(padding, 1, depth[:, :width]),
        ancestor_mask=cut_mask,
        num_nodes=keep,
    )


@attrs.frozen(kw_only=True)
class Group:
    """The requests of one sampling group in a step, with their draft and tree."""

    sampling: SamplingConfig
    slots: np.ndarray
    ids: tuple[int, ...]
    states: list
    where: object  # slots on the target
    draft: Draft
    tree: DraftTree
    # per row: drafted nodes allowed (0: plain, None: the whole tree); () all None
    budgets: tuple = ()
    full_nodes: np.ndarray | None = (
        None  # per row: nodes of the tree before its budget cut it (host)
    )


@attrs.frozen(kw_only=True, eq=False)
class Checked:
    """What verifying one group left on the host, checked (``specdec.decode.checks``), with the
    group's rows of the target output and the verdict as the verifier made it."""

    output: TargetOutput  # the group's rows: logits (B, N, V), hidden (B, N, H), layers
    verdict: Verdict  # where the target computes, for ``commit``
    path: np.ndarray  # (B, D+1) int64 node indices, -1 past the accepted path
    num_accepted: np.ndarray  # (B,) int64
    bonus: np.ndarray  # (B,) int64 bonus tokens
    beams: np.ndarray | None  # (B, W, L) the distinct beams drafted (None: head drafts)
    tokens: np.ndarray  # (B, N) token of each tree node
    num_nodes: np.ndarray  # (B,) int64 nodes of each row's tree


def plain_group(group: Group, backend, target) -> Group:
    """``group`` (its requests, no draft yet) decoded plainly: one-node trees of the roots, built
    on the host, and the draft of the roots alone; no drafter call."""
    roots = np.array([s.root for s in group.states], dtype=np.int64)
    put = lambda a: on_target(a, backend, target)  # noqa: E731
    return attrs.evolve(
        group,
        tree=put(plain_tree(roots)),
        draft=Draft(root_tokens=put(roots), beams=put(roots[:, None, None])),
        budgets=(0,) * len(roots),
        full_nodes=np.ones(len(roots), dtype=np.int64),
    )


def cut_to_budgets(
    tree: DraftTree, budgets: Sequence, backend, target
) -> tuple[DraftTree, np.ndarray]:
    """(the tree cut to ``budgets`` (``cut_tree``; itself when none cuts it), its rows' node
    counts before the cut (host))."""
    host = backend.to_numpy
    full = host(tree.num_nodes).astype(np.int64)
    if all(b is None for b in budgets):
        return tree, full
    cut = cut_tree(
        host(tree.tokens),
        host(tree.parents),
        host(tree.depth),
        host(tree.ancestor_mask),
        full,
        budgets,
    )
    return (tree, full) if cut is None else (on_target(cut, backend, target), full)


def step_tree(groups: list[Group], backend, target) -> tuple[DraftTree | None, np.ndarray]:
    """The tree and slots of a step's forward: the one group's own, or the groups' merged (host)."""
    if not groups:
        return None, np.zeros(0, dtype=np.int64)
    if len(groups) == 1:
        return groups[0].tree, groups[0].slots
    host = backend.to_numpy
    merged = merge_trees(
        [
            (
                host(g.tree.tokens),
                host(g.tree.parents),
                host(g.tree.depth),
                host(g.tree.ancestor_mask),
                host(g.tree.num_nodes),
            )
            for g in groups
        ]
    )
    on_target = lambda a: backend.from_numpy(a, target)  # noqa: E731
    tree = DraftTree(
        tokens=on_target(merged.tokens),
        parents=on_target(merged.parents),
        depth=on_target(merged.depth),
        ancestor_mask=on_target(merged.ancestor_mask),
        num_nodes=on_target(merged.num_nodes),
    )
    return tree, np.concatenate([g.slots for g in groups])


def last_position(output: PromptOutput) -> PromptOutput:
    """A prompt chunk's output at its last position only: logits (V,), hidden (1, H), layers
    (1, H) each; what ``begin`` gets without ``DrafterCaps.prompt_states``, whatever the chunks."""
    return PromptOutput(
        logits=output.logits,
        hidden=output.hidden[-1:],
        layers={i: value[-1:] for i, value in output.layers.items()},
    )


def observe_accepted(plan, group: Group, checked: Checked) -> None:
    """Tell a stateful drafter what a group's step committed: tokens and hidden states on the
    path (a row that did not draft commits its root alone)."""
    backend, target = plan.backend, plan.target
    output, path, tokens = checked.output, checked.path, checked.tokens
    rows = np.arange(len(group.slots))[:, None]
    nodes = np.where(path >= 0, path, 0)  # (B, A)
    index = backend.from_numpy(rows, target), backend.from_numpy(nodes, target)
    plan.drafter.observe(
        Accepted(
            slots=group.slots,
            tokens=np.where(path >= 0, tokens[rows, nodes], -1),
            num_accepted=checked.num_accepted,
            bonus_tokens=checked.bonus,
            hidden=output.hidden[index],
            layers={i: value[index] for i, value in output.layers.items()},
            finished=np.array([s.done for s in group.states]),
        )
    )
