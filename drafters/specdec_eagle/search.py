"""The host side of the batched tree search that torch and MLX share: choose the kept nodes of
each row (``select_nodes``), extend its short leaves along their top-1 children in rounds, and
lay the tree out as beams (``tree_beams``). The backend runs the layer on the nodes a round
needs and reads every entry's top-1 token; everything else is host integers."""

from __future__ import annotations

from typing import Callable

import numpy as np

from specdec_eagle.tree import select_nodes, tree_beams

__all__ = ["extended_beams"]


def extended_beams(
    tokens: np.ndarray,
    parents: np.ndarray,
    scores: np.ndarray,
    entry_of: np.ndarray,
    *,
    depth: int,
    width: int,
    run: Callable[[np.ndarray, np.ndarray, np.ndarray], int],
    top1: Callable[[], np.ndarray],
) -> np.ndarray:
    """Beams (B, W = width, L = depth + 1) int64 of the candidates tokens, parents, scores,
    entry_of (B, C) (``entry_of``: the layer entry that ran each candidate, -1 if none).

    Short leaves are extended along their top-1 children in rounds, all rows together: a chain's
    node that has not run runs, then its top-1 child becomes the chain's next node.
    ``run(tokens, parents, levels)`` ((B, n) int64 each: the nodes' tokens, the entries of their
    parents, their levels; unused places hold the root's first child and are ignored) runs them
    and returns the entry of their first; ``top1()`` gives (B, entries) the top-1 vocabulary token
    of every entry so far."""
    rows = [
        dict(
            tokens=tokens[b].tolist(),
            parents=parents[b].tolist(),
            scores=scores[b].tolist(),
            entry=entry_of[b].tolist(),
            child={},
        )
        for b in range(tokens.shape[0])
    ]
    selected, chains = [], []
    for b, row in enumerate(rows):
        row["levels"] = [0] * len(row["tokens"])
        for i in range(1, len(row["tokens"])):
            row["levels"][i] = row["levels"][row["parents"][i]] + 1
        selected.append(
            select_nodes(row["scores"], row["parents"], row["levels"], depth=depth, budget=width)
        )
        kept = set(int(s) for s in selected[b])
        inner = {row["parents"][s] for s in kept}
        chains.append(sorted(s for s in kept if s not in inner and row["levels"][s] < depth))
    while any(chains):
        need = [
            [node for node in chain if rows[b]["entry"][node] < 0] for b, chain in enumerate(chains)
        ]
        if any(need):
            size = max(len(n) for n in need)
            run_tokens = np.zeros((len(rows), size), dtype=np.int64)
            run_parent = np.zeros((len(rows), size), dtype=np.int64)
            run_level = np.ones((len(rows), size), dtype=np.int64)
            for b, nodes in enumerate(need):
                row = rows[b]
                for j, node in enumerate(nodes):
                    run_tokens[b, j] = row["tokens"][node]
                    run_parent[b, j] = row["entry"][row["parents"][node]]
                    run_level[b, j] = row["levels"][node]
            first = run(run_tokens, run_parent, run_level)
            for b, nodes in enumerate(need):
                for j, node in enumerate(nodes):
                    rows[b]["entry"][node] = first + j
        best = top1()
        for b, chain in enumerate(chains):
            row, following = rows[b], []
            for node in chain:
                row["tokens"].append(int(best[b, row["entry"][node]]))
                row["parents"].append(node)
                row["levels"].append(row["levels"][node] + 1)
                row["scores"].append(row["scores"][node])
                row["entry"].append(-1)
                row["child"][node] = child = len(row["tokens"]) - 1
                if row["levels"][child] < depth:
                    following.append(child)
            chains[b] = following
    return np.stack(
        [
            tree_beams(
                row["tokens"],
                row["parents"],
                row["levels"],
                row["scores"],
                selected[b],
                depth=depth,
                width=width,
                extend=row["child"].__getitem__,
            )
            for b, row in enumerate(rows)
        ]
    )
