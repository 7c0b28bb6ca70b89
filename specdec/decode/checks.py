"""Checks of what plugins return in a decode step, on the host copies the loop makes anyway.

Every error is a PluginOutputError that names the plugin which produced the value (``who``), so
that a bad verdict is reported where it was made, not as an IndexError in ``commit`` or as a bad
tree token one step later. The checks read only the (B, N)-sized arrays of the step; they cost
microseconds per step.
"""

from __future__ import annotations

import numpy as np

from specdec.errors import PluginOutputError


def _integers(who: str, name: str, array: np.ndarray, shape: tuple[int | None, ...]) -> None:
    if not np.issubdtype(array.dtype, np.integer):
        raise PluginOutputError(
            f"{who} returned {name} of dtype {array.dtype}; it must hold integers (int64)"
        )
    if array.ndim != len(shape) or any(
        want is not None and got != want for got, want in zip(array.shape, shape)
    ):
        wanted = "(" + ", ".join("*" if s is None else str(s) for s in shape) + ")"
        raise PluginOutputError(
            f"{who} returned {name} of shape {tuple(array.shape)}; expected {wanted}"
        )


def _in_vocabulary(who: str, name: str, tokens: np.ndarray, vocab_size: int) -> None:
    bad = (tokens < 0) | (tokens >= vocab_size)
    if bad.any():
        where = tuple(int(i) for i in np.argwhere(bad)[0])
        raise PluginOutputError(
            f"{who} returned {name}{list(where)} = {int(tokens[where])}, outside the vocabulary "
            f"[0, {vocab_size})"
        )


def check_draft(
    who: str,
    roots: np.ndarray,
    beams: np.ndarray | None,
    head_tokens: np.ndarray | None,
    vocab_size: int,
    beam_lengths: np.ndarray | None = None,
) -> None:
    """A draft's tokens: integers in the vocabulary, one row per request, beams starting at the root
    (and, with ``beam_lengths``, lengths in [1, L]; only the tokens within them are read)."""
    batch = roots.shape[0]
    _integers(who, "Draft.root_tokens", roots, (batch,))
    if beams is not None:
        _integers(who, "Draft.beams", beams, (batch, None, None))
        if beam_lengths is not None:
            _integers(who, "Draft.beam_lengths", beam_lengths, beams.shape[:2])
            if ((beam_lengths < 1) | (beam_lengths > beams.shape[2])).any():
                raise PluginOutputError(
                    f"{who} returned Draft.beam_lengths outside [1, L] = [1, {beams.shape[2]}]"
                )
            beams = np.where(np.arange(beams.shape[2]) < beam_lengths[..., None], beams, 0)
        _in_vocabulary(who, "Draft.beams", beams, vocab_size)
        if beams.shape[2] < 1 or (beams[:, :, 0] != roots[:, None]).any():
            raise PluginOutputError(
                f"{who} returned Draft.beams whose first token is not the row's root token"
            )
    if head_tokens is not None:
        _integers(who, "Draft.head_tokens", head_tokens, (batch, None, None))
        _in_vocabulary(who, "Draft.head_tokens", head_tokens, vocab_size)


def check_tree_output(
    who: str, tokens: np.ndarray, parents: np.ndarray, num_nodes: np.ndarray, vocab_size: int
) -> None:
    """A tree: integer tokens in the vocabulary, 1..N nodes per row, each parent before its
    child."""
    batch, size = tokens.shape
    _integers(who, "DraftTree.tokens", tokens, (batch, size))
    _integers(who, "DraftTree.parents", parents, (batch, size))
    _integers(who, "DraftTree.num_nodes", num_nodes, (batch,))
    if ((num_nodes < 1) | (num_nodes > size)).any():
        raise PluginOutputError(
            f"{who} returned DraftTree.num_nodes {num_nodes.tolist()} outside [1, {size}]"
        )
    live = np.arange(size)[None, :] < num_nodes[:, None]
    _in_vocabulary(who, "DraftTree.tokens", np.where(live, tokens, 0), vocab_size)
    nodes = np.arange(size)[None, :]
    ok = (parents[:, :1] == -1).all() and (
        (parents[:, 1:] >= 0) & (parents[:, 1:] < nodes[:, 1:]) | ~live[:, 1:]
    ).all()
    if not ok:
        raise PluginOutputError(
            f"{who} returned DraftTree.parents that do not link each node to an earlier one"
        )


def check_verdict(
    who: str,
    path: np.ndarray,
    num_accepted: np.ndarray,
    bonus: np.ndarray,
    parents: np.ndarray,
    num_nodes: np.ndarray,
    vocab_size: int,
) -> None:
    """A verdict: integer arrays of the right shapes, a path from the root (node 0) along parent
    links through live nodes of the tree, and a bonus token inside the vocabulary."""
    batch = parents.shape[0]
    _integers(who, "Verdict.path", path, (batch, None))
    _integers(who, "Verdict.num_accepted", num_accepted, (batch,))
    _integers(who, "Verdict.bonus_tokens", bonus, (batch,))
    depth = path.shape[1] - 1
    if depth < 0 or ((num_accepted < 0) | (num_accepted > depth)).any():
        raise PluginOutputError(
            f"{who} returned Verdict.num_accepted {num_accepted.tolist()} outside [0, "
            f"{max(depth, 0)}] (the path holds {depth + 1} nodes, the root included)"
        )
    if (path[:, 0] != 0).any():
        raise PluginOutputError(
            f"{who} returned a Verdict.path that does not start at the root (node 0)"
        )
    used = np.arange(depth + 1)[None, :] <= num_accepted[:, None]
    if (used & ((path < 0) | (path >= num_nodes[:, None]))).any():
        raise PluginOutputError(f"{who} returned a Verdict.path with a node outside the tree")
    links = np.take_along_axis(parents, np.where(used, path, 0), axis=1)[:, 1:] == path[:, :-1]
    if not (links | ~used[:, 1:]).all():
        row = int(np.argwhere(~(links | ~used[:, 1:]))[0][0])
        raise PluginOutputError(
            f"{who} returned a Verdict.path that is not a chain of parent links in row {row}: "
            f"{path[row, : num_accepted[row] + 1].tolist()}"
        )
    _in_vocabulary(who, "Verdict.bonus_tokens", bonus, vocab_size)


def check_chunk_outputs(who: str, outputs, chunks) -> None:
    """One PromptOutput per prompt chunk of the forward (they are paired with the chunks in
    order)."""
    if len(outputs) != len(chunks):
        raise PluginOutputError(
            f"{who} returned {len(outputs)} context outputs from forward_tree for {len(chunks)} "
            "prompt chunks; it must return one per chunk, in order"
        )


def check_group(plan, draft, tree, cause: Exception | None = None):
    """Host copies (beams or None, tree tokens, parents, num_nodes) of a group's draft and tree,
    after checking them; an error names the plugin that made the value (from ``cause``)."""
    host, vocab = plan.backend.to_numpy, int(plan.target.vocab_size)
    beams = checked_draft(plan, draft, cause)
    tree_arrays = host(tree.tokens), host(tree.parents), host(tree.num_nodes)
    try:
        check_tree_output(plan.source("tree_builder"), *tree_arrays, vocab)
    except PluginOutputError as error:
        raise error from cause
    return (beams, *tree_arrays)


def checked_draft(plan, draft, cause: Exception | None = None):
    """The host copy of a draft's beams (or None), after ``check_draft``; an error names the
    drafter (from ``cause``: what failed on the draft first, a tree builder's error, say)."""
    host = plan.backend.to_numpy
    beams = None if draft.beams is None else host(draft.beams)
    try:
        check_draft(
            plan.source("drafter"),
            host(draft.root_tokens),
            beams,
            None if draft.head_tokens is None else host(draft.head_tokens),
            int(plan.target.vocab_size),
            draft.beam_lengths,
        )
    except PluginOutputError as error:
        raise error from cause
    return beams
