"""Host-side pieces of a decode step over many requests (``specdec.loop.Decoder``): joining the
trees of several sampling groups into one forward and splitting its output back, the verdict
that commits them together, and the bookkeeping of per-row results.

Requests that share sampling settings form a group: one draft, one tree, one verifier call.
Every group's tree rides the same target forward: ``merge_trees`` pads their rows to the widest
(padding nodes hang off the root and attend to it and themselves, as ``DraftTree`` pads), the
verifier of each group reads its rows of the output (``group_output``), and ``merge_verdicts``
pads the groups' accepted paths into the one verdict ``commit`` takes.
"""

from __future__ import annotations

from typing import Sequence

import attrs
import numpy as np

from specdec.reference.tree import check_beam_lengths
from specdec.requests import RequestState
from specdec.types import Draft, DraftTree, SamplingConfig, StepResult, TargetOutput, Verdict

__all__ = ["Group", "admissions", "draw", "drafted_tokens", "empty_step", "full_batch", "group_output",
           "join_admissions", "join_steps", "merge_trees", "merge_verdicts", "step_tree", "verify_uniform_shape"]


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
    same = (tokens[:, :, None, :] == tokens[:, None, :, :]).all(axis=-1)  # (B, W, W): beam i equals beam j
    repeats = np.tril(same, k=-1).any(axis=-1)  # (B, W): beam i equals an earlier beam
    return np.where(repeats, 0, lengths - 1).sum(axis=-1).astype(np.int64)


def merge_trees(trees: Sequence[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]]) -> DraftTree:
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
    return DraftTree(tokens=tokens, parents=parents, depth=depth, ancestor_mask=mask, num_nodes=num_nodes)


def group_output(output: TargetOutput, start: int, stop: int, nodes: int) -> TargetOutput:
    """Rows ``start .. stop - 1`` of a merged forward's output, cut to the group's ``nodes``."""
    cut = lambda value: value[start:stop, :nodes]  # noqa: E731 - basic slicing works on every backend's arrays
    return TargetOutput(logits=cut(output.logits), hidden=cut(output.hidden),
                        layers={i: cut(v) for i, v in output.layers.items()})


def merge_verdicts(paths: Sequence[np.ndarray], accepted: Sequence[np.ndarray], bonus: Sequence[np.ndarray]
                   ) -> Verdict:
    """One host Verdict of the groups' (path, num_accepted, bonus) in order; paths padded with -1."""
    width = max(p.shape[1] for p in paths)
    path = np.concatenate([np.pad(p, ((0, 0), (0, width - p.shape[1])), constant_values=-1) for p in paths])
    return Verdict(path=path.astype(np.int64), num_accepted=np.concatenate(accepted).astype(np.int64),
                   bonus_tokens=np.concatenate(bonus).astype(np.int64))


def empty_step(step: int) -> StepResult:
    """A decode step whose every row failed (``Decoder.step`` with ``failures``)."""
    zeros = np.zeros(0, dtype=np.int64)
    return StepResult(step=step, requests=(), new_tokens=[], num_accepted=zeros, num_drafted=zeros,
                      num_verified=zeros)


def join_steps(step: int, parts: Sequence[StepResult]) -> StepResult:
    """One StepResult of the rows of ``parts`` (decode steps of the same step) in order."""
    if not parts:
        return empty_step(step)
    if len(parts) == 1:
        return parts[0]
    join = lambda name: np.concatenate([getattr(p, name) for p in parts])  # noqa: E731
    return StepResult(
        step=step, requests=tuple(r for p in parts for r in p.requests),
        new_tokens=[t for p in parts for t in p.new_tokens], num_accepted=join("num_accepted"),
        num_drafted=join("num_drafted"), num_verified=join("num_verified"),
        time_draft=sum(p.time_draft for p in parts), time_verify=sum(p.time_verify for p in parts),
        time_other=sum(p.time_other for p in parts),
    )


def full_batch(result: StepResult, batch_size: int) -> StepResult:
    """``result`` with one row per request 0 .. batch_size - 1."""
    rows = np.asarray(result.requests, dtype=np.int64)
    tokens: list[list[int]] = [[] for _ in range(batch_size)]
    for row, new in zip(rows, result.new_tokens):
        tokens[row] = new

    def spread(values, dtype=np.int64):
        out = np.zeros(batch_size, dtype=dtype)
        out[rows] = values
        return out

    return attrs.evolve(
        result, requests=tuple(range(batch_size)), new_tokens=tokens, num_accepted=spread(result.num_accepted),
        num_drafted=spread(result.num_drafted), num_verified=spread(result.num_verified),
        prefilled=None if result.prefilled is None else spread(result.prefilled, bool),
    )


def draw(states: list[RequestState], shape: tuple[int, ...]) -> np.ndarray | None:
    """(B, *shape) uniforms, row b from request b's own generator; None for greedy requests."""
    draws = [state.draw(shape) for state in states]
    return None if draws[0] is None else np.stack(draws)


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


def step_tree(groups: list[Group], backend, target) -> tuple[DraftTree | None, np.ndarray]:
    """The tree and slots of a step's forward: the one group's own, or the groups' merged (host)."""
    if not groups:
        return None, np.zeros(0, dtype=np.int64)
    if len(groups) == 1:
        return groups[0].tree, groups[0].slots
    host = backend.to_numpy
    merged = merge_trees([(host(g.tree.tokens), host(g.tree.parents), host(g.tree.depth),
                           host(g.tree.ancestor_mask), host(g.tree.num_nodes)) for g in groups])
    on_target = lambda a: backend.from_numpy(a, target)  # noqa: E731
    tree = DraftTree(tokens=on_target(merged.tokens), parents=on_target(merged.parents),
                     depth=on_target(merged.depth), ancestor_mask=on_target(merged.ancestor_mask),
                     num_nodes=on_target(merged.num_nodes))
    return tree, np.concatenate([g.slots for g in groups])


def admissions(step: int, ids: list[int], tokens: list[list[int]], seconds: float) -> StepResult:
    """The StepResult of requests whose prompts were prefilled: their first tokens."""
    zeros = np.zeros(len(ids), dtype=np.int64)
    return StepResult(step=step, requests=tuple(ids), new_tokens=tokens, num_accepted=zeros, num_drafted=zeros,
                      num_verified=zeros + 1, time_prefill=seconds, prefilled=np.ones(len(ids), dtype=bool))


def join_admissions(parts: list[StepResult]) -> StepResult:
    return admissions(parts[0].step, [r for p in parts for r in p.requests], [t for p in parts for t in p.new_tokens],
                       sum(p.time_prefill for p in parts))
