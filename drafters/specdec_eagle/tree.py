"""The shape of EAGLE-2's dynamic tree, on the host (every backend's, EAGLE's and EAGLE-3's):
the tree settings, which searched candidates the verified tree keeps (``select_nodes``), the
beams through them with short leaves extended (``tree_beams``, ``finish_tree``) and the record
of one row's tree (``TreeDraft``). ``specdec_eagle.reference.dynamic_tree`` searches a tree
with them; ``specdec_eagle.search`` is the batched host side the torch and MLX drafters share.
"""

from __future__ import annotations

import attrs
import numpy as np

from specdec.errors import InvalidInputError
from specdec_eagle.config import EagleConfig

__all__ = [
    "TreeDraft",
    "check_tree_options",
    "finish_tree",
    "select_nodes",
    "top_indices",
    "tree_beams",
    "tree_options",
]


def top_indices(values: np.ndarray, count: int, gaps: list | None = None) -> np.ndarray:
    """The ``count`` best indices of ``values``, best first, equal values to the lower index.
    ``gaps`` collects the smallest difference between consecutive values among the best
    count + 1 (how close the ranking came to another order; -inf pairs are exact)."""
    order = np.argsort(-values, kind="stable")
    if gaps is not None:
        best = values[order[: count + 1]]
        finite = best[np.isfinite(best)]
        if len(finite) > 1:
            gaps.append(float(np.min(finite[:-1] - finite[1:])))
    return order[:count]


@attrs.frozen(kw_only=True)
class TreeDraft:
    """One row's dynamic tree.

    Nodes: 0 the root, 1 .. C the candidates, then the extension nodes: ``tokens``, ``parents``
    (the root's -1), ``depth`` (level, the root's 0) and ``scores`` (cumulative draft log-probs;
    extension nodes' continue their parents'); ``selected``: the kept candidates, ascending
    (parents before children);
    ``beams`` (W, L): one root-to-leaf path per leaf, best leaf first, short ones extended,
    padded to W rows with copies of beam 0; ``extension`` (E,): tokens of the nodes added past
    short leaves (``tree_beams``); ``margin``: the smallest score gap of any ranking the tree
    made (top-k children, frontiers, the kept set, leaf order, extensions), for tests that
    compare backends away from near-ties.
    """

    tokens: np.ndarray
    parents: np.ndarray
    depth: np.ndarray
    scores: np.ndarray
    selected: np.ndarray
    beams: np.ndarray
    extension: np.ndarray
    margin: float


def check_tree_options(config: EagleConfig, top_k: int, depth: int, total_tokens: int) -> None:
    """top_k <= the drafted vocabulary, depth >= 1, depth <= total_tokens
    (a ValueError otherwise)."""
    for name, value in (("top_k", top_k), ("depth", depth), ("total_tokens", total_tokens)):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
            raise ValueError(f"EAGLE's {name} must be a positive integer, got {value!r}")
    if top_k > config.draft_vocab_size:
        raise ValueError(
            f"EAGLE's top_k={top_k} exceeds the {config.draft_vocab_size} tokens it drafts from"
        )
    if total_tokens < depth:
        raise ValueError(
            f"EAGLE's total_tokens={total_tokens} cannot hold one path of depth={depth} drafted "
            "tokens; give total_tokens >= depth"
        )


def select_nodes(
    scores, parents, levels, *, depth: int, budget: int, gaps: list | None = None
) -> np.ndarray:
    """The kept candidates (ascending) of a tree whose beams all reach level ``depth``: candidates
    in score order (best first, ties to the earlier node) are kept while the drafted nodes the
    target will verify stay within ``budget``. Every leaf is extended to level ``depth`` along its
    top-1 children (``tree_beams``), so a kept node costs: nothing when its parent was a kept
    leaf (it takes the place of the parent's first extension node), else itself and the
    extension below it, 1 + depth - level. A candidate whose parent is not kept is skipped.

    scores, parents, levels: per node (0 the root), candidates 1 .. C. ``gaps`` collects the
    smallest difference between consecutive candidate scores (the order decides)."""
    candidates = np.asarray(scores[1:], dtype=np.float64)
    order = np.argsort(-candidates, kind="stable") + 1
    if gaps is not None and len(order) > 1:
        ranked = candidates[order - 1]
        gaps.append(float(np.min(ranked[:-1] - ranked[1:])))
    kept, children, size = [], {0: 0}, 0
    for node in order.tolist():
        parent = parents[node]
        if parent not in children:  # its parent was not kept
            continue
        cost = 0 if parent != 0 and children[parent] == 0 else 1 + depth - levels[node]
        if size + cost > budget:
            continue
        kept.append(node)
        children[parent] += 1
        children[node] = 0
        size += cost
    return np.array(sorted(kept), dtype=np.int64)


def finish_tree(tokens, parents, levels, scores, ran, run, add, depth, total_tokens, gaps):
    """A searched tree's ``TreeDraft`` (EAGLE's and EAGLE-3's): the best candidates kept while the
    verified tree (extensions included) fits ``total_tokens``, and the beams through them, short
    ones extended by their top-1 child (``run``: a node's draft log-probs, cached in ``ran``;
    ``add``: a new node; ``gaps``: the score margins seen, for the near-tie check)."""
    candidates = len(tokens)
    selected = select_nodes(scores, parents, levels, depth=depth, budget=total_tokens, gaps=gaps)

    def extend(node: int) -> int:
        """Add ``node``'s top-1 child (running the node first if it has not run)."""
        log_probs = ran[node][3] if node in ran else run(node)
        token = int(top_indices(log_probs, 1, gaps)[0])
        return add(token, node, scores[node] + log_probs[token])

    beams = tree_beams(
        tokens, parents, levels, scores, selected, depth=depth, width=total_tokens, extend=extend
    )
    kept = set(selected.tolist())
    leaf_scores = np.sort([scores[s] for s in kept if s not in {parents[t] for t in kept}])
    if len(leaf_scores) > 1:
        gaps.append(float(np.min(np.diff(leaf_scores))))
    return TreeDraft(
        tokens=np.array(tokens, dtype=np.int64),
        parents=np.array(parents, dtype=np.int64),
        depth=np.array(levels, dtype=np.int64),
        scores=np.array(scores),
        selected=selected,
        beams=beams,
        extension=np.array(tokens[candidates:], dtype=np.int64),
        margin=min(gaps, default=np.inf),
    )


def tree_beams(
    tokens, parents, levels, scores, selected, *, depth: int, width: int, extend
) -> np.ndarray:
    """Beams (W, L = depth + 1) of the kept nodes: one per leaf (a kept node that is no kept
    node's parent), ordered by leaf score (best first, ties to the earlier node), then copies of
    beam 0 up to W = ``width`` rows. A leaf above level ``depth`` is extended along its own
    top-1 children: ``extend(node)`` -> the index of that child (appended to the node lists
    ``tokens``, ``parents``, ``levels``, ``scores`` when new), so those extra nodes are verified
    too."""
    kept = set(int(s) for s in selected)
    inner = {parents[s] for s in kept}
    leaves = sorted((s for s in kept if s not in inner), key=lambda s: (-scores[s], s))
    beams = []
    for leaf in leaves:
        path, node = [], leaf
        while node >= 0:
            path.append(node)
            node = parents[node]
        path = path[::-1]
        while levels[path[-1]] < depth:  # extend along the top-1 child
            path.append(extend(path[-1]))
        beams.append([tokens[p] for p in path])
    beams += [beams[0]] * (width - len(beams))
    return np.array(beams, dtype=np.int64)


def tree_options(
    config, top_k, depth, total_tokens, *, check=check_tree_options
) -> tuple[int, int, int]:
    """The tree's (top_k, depth, total_tokens): the given ones, else the config's; checked by
    ``check`` (EAGLE's; EAGLE-3 passes its own). A ValueError over settings the caller gave
    becomes an InvalidInputError naming them; over the config's own it stays (the checkpoint's)."""
    chosen = tuple(
        int(getattr(config, name)) if value is None else value
        for name, value in (("top_k", top_k), ("depth", depth), ("total_tokens", total_tokens))
    )
    try:
        check(config, *chosen)
    except ValueError as exc:
        if (top_k, depth, total_tokens) == (None, None, None):
            raise  # the checkpoint's own settings: its config is at fault
        given = ", ".join(
            f"{name}={value}"
            for name, value in (
                ("tree_top_k", top_k),
                ("depth", depth),
                ("total_tokens", total_tokens),
            )
            if value is not None
        )
        raise InvalidInputError(f"{exc} (tree settings given: {given})") from exc
    return chosen
