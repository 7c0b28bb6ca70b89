"""Teacher-data windows, acceptance counting and the offline replay of greedy speculative
decoding."""

from __future__ import annotations

import numpy as np
import torch

from specdec.types import Draft
from specdec.training.evaluate import (
    beam_acceptance,
    gather_window,
    tree_acceptance,
    walk_tokens_per_step,
)
from specdec.training.records import TeacherData
from specdec_medusa.choices import PRESETS
from specdec_medusa.tree import StaticTreeBuilder


def hand_made(lengths=(6, 4)) -> TeacherData:
    """Sequences whose position j of sequence s has next token 100*s + j + 1 and label
    1000 + that."""
    tokens, remaining, sequence = [], [], []
    for s, n in enumerate(lengths):
        tokens += [100 * s + j + 1 for j in range(n)]
        remaining += list(range(n - 1, -1, -1))
        sequence += [s] * n
    tokens = torch.tensor(tokens)
    return TeacherData(
        hidden=torch.arange(len(tokens), dtype=torch.float32)[:, None].repeat(1, 2),
        next_tokens=tokens,
        label_ids=torch.stack([tokens + 1000, tokens], dim=1),
        label_probs=torch.tensor([[0.75, 0.25]] * len(tokens)).half(),
        remaining=torch.tensor(remaining),
        sequence=torch.tensor(sequence),
    )


def test_window_indexing():
    data = hand_made()
    window = gather_window(data, torch.tensor([0, 4, 6]), depth=3)
    # position 0 of sequence 0: root x_1 = 1, then x_2.. = 2, 3, 4 (labels score them: 1002 ..)
    assert window.tokens[0].tolist() == [1, 2, 3, 4] and window.valid[0].tolist() == [True] * 3
    assert window.label_ids[0, :, 0].tolist() == [1002, 1003, 1004]
    # position 4 of sequence 0 has one position left: step 1 valid, steps 2-3 not
    assert window.tokens[1, :2].tolist() == [5, 6] and window.valid[1].tolist() == [
        True,
        False,
        False,
    ]
    # position 6 starts sequence 1
    assert window.tokens[2].tolist() == [101, 102, 103, 104] and window.hidden[2, 0] == 6


def test_walk_with_constant_acceptance():
    data = hand_made((10,))
    result = walk_tokens_per_step(data, lambda idx: torch.full_like(idx, 2))
    # positions 0 -> 3 -> 6 -> 9 (end): three steps of 3 tokens
    assert result["steps"] == 3 and result["tokens"] == 9 and result["tokens_per_step"] == 3.0
    plain = walk_tokens_per_step(data, lambda idx: torch.zeros_like(idx))
    assert plain["tokens_per_step"] == 1.0 and plain["steps"] == 9
    greedy_all = walk_tokens_per_step(data, lambda idx: torch.full_like(idx, 50))
    assert greedy_all["steps"] == 1 and greedy_all["tokens"] == 9, (
        "acceptance is capped by the data left"
    )


def test_walk_visits_each_sequence_separately():
    data = hand_made((5, 3))
    visited = []

    def accept(idx):
        visited.extend(idx.tolist())
        return torch.ones_like(idx)

    result = walk_tokens_per_step(data, accept)
    assert sorted(visited) == [0, 2, 5], "sequence 0: 0 -> 2 -> 4 (end); sequence 1: 5 -> 7 (end)"
    assert result["tokens"] == 4 + 2 and result["steps"] == 3


def test_beam_acceptance_takes_the_best_beam():
    truth = torch.tensor([[5, 6, 7]])
    valid = torch.tensor([[True, True, True]])
    beams = torch.tensor([[[1, 5, 9, 7], [1, 5, 6, 8], [1, 4, 6, 7]]])
    assert beam_acceptance(beams, truth, valid).tolist() == [2]
    assert beam_acceptance(beams, truth, torch.tensor([[True, False, False]])).tolist() == [1]


def test_tree_acceptance_matches_an_ancestor_walk():
    rng = np.random.default_rng(0)
    builder = StaticTreeBuilder(PRESETS["cpu16"])
    for _ in range(50):
        head_tokens = torch.as_tensor(
            rng.permuted(np.tile(np.arange(6), (3, 4, 1)), axis=2)[:, :, :4]
        )  # (3, 4, 4)
        truth = torch.as_tensor(rng.integers(0, 6, size=(3, 4)))
        valid = torch.as_tensor(rng.random((3, 4)) < 0.9)
        tree = builder.build(
            Draft(root_tokens=np.zeros(3, dtype=np.int64), head_tokens=head_tokens.numpy())
        )
        expected = []
        for b in range(3):
            best = 0
            for node in range(1, tree.size):
                path = np.nonzero(tree.ancestor_mask[b, node])[0][
                    1:
                ]  # ancestors below the root, and the node
                ok = all(
                    tree.tokens[b, n] == truth[b, tree.depth[b, n] - 1]
                    and valid[b, tree.depth[b, n] - 1]
                    for n in path
                )
                best = max(best, int(tree.depth[b, node])) if ok else best
            expected.append(best)
        assert tree_acceptance(head_tokens, builder.choices, truth, valid).tolist() == expected
