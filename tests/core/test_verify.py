"""The verifiers on hand-built trees (specdec.reference.verify, verify_lossy)."""

from __future__ import annotations

import numpy as np
import pytest

from specdec.errors import InvalidInputError
from specdec.protocols import Verifier
from specdec.reference.tree import ancestor_mask_from_parents, build_prefix_tree, depth_from_parents
from specdec.reference.verify import ExactTreeVerifier, GreedyVerifier, RejectionVerifier
from specdec.reference.verify_lossy import RedrafterPublishedVerifier, TypicalVerifier
from specdec.types import Draft, DraftTree, SamplingConfig, TargetOutput

GREEDY = SamplingConfig(temperature=0.0)
SAMPLE = SamplingConfig(temperature=1.0)
LOG0 = -np.inf


def make_tree(rows: list[tuple[list[int], list[int]]]) -> DraftTree:
    """A DraftTree from per-row (tokens, parents); shorter rows padded with token 0 under the
    root."""
    size = max(len(tokens) for tokens, _ in rows)
    tokens = np.zeros((len(rows), size), dtype=np.int64)
    parents = np.zeros((len(rows), size), dtype=np.int64)
    for b, (row_tokens, row_parents) in enumerate(rows):
        tokens[b, : len(row_tokens)] = row_tokens
        parents[b, : len(row_parents)] = row_parents
    return DraftTree(
        tokens=tokens,
        parents=parents,
        depth=depth_from_parents(parents),
        ancestor_mask=ancestor_mask_from_parents(parents),
        num_nodes=np.array([len(t) for t, _ in rows], dtype=np.int64),
    )


def make_target(logits) -> TargetOutput:
    logits = np.asarray(logits, dtype=np.float64)
    return TargetOutput(logits=logits, hidden=np.zeros(logits.shape[:2] + (1,)))


def log_of(probs) -> np.ndarray:
    """Logits whose softmax is ``probs``; zero probabilities become -inf."""
    probs = np.asarray(probs, dtype=np.float64)
    return np.where(probs > 0, np.log(np.where(probs > 0, probs, 1.0)), LOG0)


def head_draft(tree: DraftTree) -> Draft:
    """A stand-in draft for verifiers that only read the tree."""
    return Draft(
        root_tokens=tree.tokens[:, 0], head_tokens=np.zeros((tree.batch_size, 1, 1), dtype=np.int64)
    )


def one_hot_logits(argmax: list[int], vocab: int, rng) -> np.ndarray:
    """Logits (N, V) whose argmax per node is given, with random values below it."""
    logits = rng.normal(size=(len(argmax), vocab))
    logits[np.arange(len(argmax)), argmax] = logits.max() + 1.0
    return logits


def random_beam_case(seed: int, batch=2, width=3, length=4, vocab=3):
    """Random beams (many shared prefixes at V=3), their prefix tree, logits and a sampled draft."""
    rng = np.random.default_rng(seed)
    beams = rng.integers(0, vocab, size=(batch, width, length))
    beams[:, :, 0] = beams[:, :1, 0]
    tree = build_prefix_tree(beams)
    draft_probs = rng.dirichlet(np.ones(vocab), size=(batch, width, length - 1))
    draft = Draft(root_tokens=beams[:, 0, 0], beams=beams, draft_probs=draft_probs, sampled=True)
    target = make_target(rng.normal(size=(batch, tree.size, vocab)) * 2.0)
    uniforms = rng.random((batch, length, width + 1))
    return tree, draft, target, uniforms


ALL_VERIFIERS = [
    GreedyVerifier(),
    ExactTreeVerifier(),
    RejectionVerifier(),
    RedrafterPublishedVerifier(),
    TypicalVerifier(),
]


def test_every_verifier_satisfies_the_protocol_and_is_flagged():
    flags = {type(v).__name__: v.lossless for v in ALL_VERIFIERS}
    assert flags == {
        "GreedyVerifier": True,
        "ExactTreeVerifier": True,
        "RejectionVerifier": True,
        "RedrafterPublishedVerifier": False,
        "TypicalVerifier": False,
    }, f"lossless flags: {flags}"
    for verifier in ALL_VERIFIERS:
        assert isinstance(verifier, Verifier), (
            f"{type(verifier).__name__} satisfies specdec.protocols.Verifier"
        )
    assert RedrafterPublishedVerifier.needs_draft_probs and RejectionVerifier.needs_draft_probs
    assert not ExactTreeVerifier.needs_draft_probs and not TypicalVerifier.needs_draft_probs


def test_greedy_accepts_the_longest_argmax_chain():
    #        0 (root)
    #      /    \
    #  1:t2     2:t1
    #    |        |
    #  3:t3     4:t0
    #    |
    #  5:t1
    tree = make_tree([([9, 2, 1, 3, 0, 1], [-1, 0, 0, 1, 2, 3])])
    argmax = [1, 3, 0, 1, 2, 0]  # node 0 -> t1 (node 2) -> t0 (node 4) -> t2: no such child
    target = make_target(one_hot_logits(argmax, 4, np.random.default_rng(0))[None])
    verdict = GreedyVerifier().verify(tree, head_draft(tree), target, GREEDY, None)
    assert verdict.path.tolist() == [[0, 2, 4, -1]], f"GreedyVerifier path {verdict.path.tolist()}"
    assert verdict.num_accepted.tolist() == [2], (
        f"GreedyVerifier num_accepted {verdict.num_accepted.tolist()}"
    )
    assert verdict.bonus_tokens.tolist() == [2], (
        f"GreedyVerifier bonus {verdict.bonus_tokens.tolist()}"
    )
    for dtype_name in ("path", "num_accepted", "bonus_tokens"):
        assert getattr(verdict, dtype_name).dtype == np.int64, f"Verdict.{dtype_name} is int64"


def test_greedy_breaks_ties_to_the_lowest_token_id():
    tree = make_tree([([9, 2, 1], [-1, 0, 0])])
    logits = np.array([[[0.0, 5.0, 5.0, 0.0], [1.0, 0.0, 0.0, 0.0], [0.0, 0.0, 0.0, 7.0]]])
    verdict = GreedyVerifier().verify(tree, head_draft(tree), make_target(logits), GREEDY, None)
    assert verdict.path.tolist() == [[0, 2]] and verdict.bonus_tokens.tolist() == [3], (
        f"GreedyVerifier with tied root logits [0,5,5,0]: path {verdict.path.tolist()}, bonus "
        f"{verdict.bonus_tokens}"
    )


@pytest.mark.parametrize(
    "verifier", [GreedyVerifier(), ExactTreeVerifier(), TypicalVerifier()], ids=type
)
@pytest.mark.parametrize("sampling", [GREEDY, SAMPLE], ids=["greedy", "sample"])
def test_padded_nodes_are_never_accepted(verifier, sampling):
    # row 1 has 2 real nodes; its padding nodes 2, 3 carry token 0 under the root, and the
    # target puts all its mass on token 0 there.
    tree = make_tree([([5, 1, 2, 0], [-1, 0, 1, 2]), ([5, 1], [-1, 0])])
    logits = np.full((2, 4, 3), LOG0)
    logits[:, :, 0] = 0.0
    logits[0, 0] = [LOG0, 0.0, LOG0]  # row 0: t1 then t2 then t0 are all accepted
    logits[0, 1] = [LOG0, LOG0, 0.0]
    uniforms = np.random.default_rng(1).random((2, 4, 1))
    verdict = verifier.verify(tree, head_draft(tree), make_target(logits), sampling, uniforms)
    name = type(verifier).__name__
    assert verdict.path.tolist() == [[0, 1, 2, 3], [0, -1, -1, -1]], (
        f"{name} {sampling}: path {verdict.path.tolist()}"
    )
    assert verdict.num_accepted.tolist() == [3, 0], (
        f"{name} {sampling}: num_accepted {verdict.num_accepted.tolist()}"
    )
    assert verdict.bonus_tokens.tolist() == [0, 0], (
        f"{name} {sampling}: bonus {verdict.bonus_tokens.tolist()}"
    )


@pytest.mark.parametrize("verifier", [RejectionVerifier(), RedrafterPublishedVerifier()], ids=type)
def test_beam_verifiers_never_reach_padding(verifier):
    # row 1's beams coincide: 3 real nodes, padded to row 0's 5 with token-0 nodes under the root
    beams = np.array([[[4, 0, 1], [4, 1, 1]], [[4, 1, 2], [4, 1, 2]]])
    tree = build_prefix_tree(beams)
    logits = np.full((2, tree.size, 3), LOG0)
    logits[:, :, 0] = 0.0  # the target wants token 0 everywhere
    draft = Draft(
        root_tokens=beams[:, 0, 0],
        beams=beams,
        draft_probs=np.full((2, 2, 2, 3), 1 / 3),
        sampled=True,
    )
    uniforms = np.random.default_rng(2).random((2, 3, 3))
    verdict = verifier.verify(tree, draft, make_target(logits), SAMPLE, uniforms)
    name = type(verifier).__name__
    assert verdict.path[1].tolist() == [0, -1, -1] and verdict.bonus_tokens[1] == 0, (
        f"{name} row 1 (beams {beams[1].tolist()}): path {verdict.path[1].tolist()}, bonus "
        f"{verdict.bonus_tokens[1]}"
    )


def test_exact_tree_verifier_follows_the_uniforms():
    # root target [0.5, 0.25, 0.25]: u = 0.6 draws t1 (cdf [0.5, 0.75, 1]); the child is a leaf,
    # u = 0.1 then draws the bonus t0 from the child's [0.5, 0.5, 0].
    tree = make_tree([([7, 1, 2], [-1, 0, 0])])
    logits = log_of([[[0.5, 0.25, 0.25], [0.5, 0.5, 0.0], [1.0, 1.0, 1.0]]])
    uniforms = np.array([[[0.6], [0.1]]])
    verdict = ExactTreeVerifier().verify(
        tree, head_draft(tree), make_target(logits), SAMPLE, uniforms
    )
    assert verdict.path.tolist() == [[0, 1]] and verdict.bonus_tokens.tolist() == [0], (
        f"ExactTreeVerifier u=0.6 then 0.1: path {verdict.path.tolist()}, bonus "
        f"{verdict.bonus_tokens.tolist()}"
    )
    uniforms = np.array([[[0.3], [0.1]]])  # u = 0.3 draws t0, not drafted: the bonus
    verdict = ExactTreeVerifier().verify(
        tree, head_draft(tree), make_target(logits), SAMPLE, uniforms
    )
    assert verdict.path.tolist() == [[0, -1]] and verdict.bonus_tokens.tolist() == [0], (
        f"ExactTreeVerifier u=0.3: path {verdict.path.tolist()}, bonus "
        f"{verdict.bonus_tokens.tolist()}"
    )


def test_rejection_verifier_hand_example():
    # Root target [0.5, 0.5, 0]; both beams drafted from [0.2, 0.3, 0.5].
    # Beam 0 proposes t2: min(1, 0 / 0.5) = 0, rejected; residual
    # max([.5,.5,0]-[.2,.3,.5], 0)/0.5 = [.6,.4,0].
    # Beam 1 proposes t1: min(1, 0.4 / 0.3) = 1, accepted; its node is a leaf: bonus from its
    # target.
    beams = np.array([[[3, 2], [3, 1]]])
    tree = build_prefix_tree(beams)
    logits = log_of([[[0.5, 0.5, 0.0], [1.0, 1.0, 1.0], [0.0, 0.0, 1.0]]])
    draft_probs = np.array([[[[0.2, 0.3, 0.5]], [[0.2, 0.3, 0.5]]]])
    draft = Draft(root_tokens=np.array([3]), beams=beams, draft_probs=draft_probs, sampled=True)
    uniforms = np.array([[[0.99, 0.0, 0.99], [0.5, 0.5, 0.5]]])
    verdict = RejectionVerifier().verify(tree, draft, make_target(logits), SAMPLE, uniforms)
    assert verdict.path.tolist() == [[0, 2]] and verdict.bonus_tokens.tolist() == [2], (
        f"RejectionVerifier hand example: path {verdict.path.tolist()}, bonus "
        f"{verdict.bonus_tokens.tolist()}"
    )
    # Now beam 1's draft gives t1 0.8: min(1, 0.4 / 0.8) = 0.5 and u = 0.7 rejects it too; the
    # residual max([.6,.4,0] - [.1,.8,.1], 0) = [.5,0,0] leaves t0 for the bonus.
    draft_probs = np.array([[[[0.2, 0.3, 0.5]], [[0.1, 0.8, 0.1]]]])
    draft = Draft(root_tokens=np.array([3]), beams=beams, draft_probs=draft_probs, sampled=True)
    uniforms = np.array([[[0.99, 0.0, 0.7], [0.5, 0.5, 0.5]]])
    verdict = RejectionVerifier().verify(tree, draft, make_target(logits), SAMPLE, uniforms)
    assert verdict.path.tolist() == [[0, -1]] and verdict.bonus_tokens.tolist() == [0], (
        f"RejectionVerifier all rejected: path {verdict.path.tolist()}, bonus "
        f"{verdict.bonus_tokens.tolist()}"
    )


def test_redrafter_published_picks_the_longest_beam_lowest_index_on_ties():
    # Every drafted token has target/draft ratio 1 except beam 0's second, whose ratio is 0.
    beams = np.array([[[0, 1, 2], [0, 2, 1], [0, 2, 2]]])
    tree = build_prefix_tree(beams)  # nodes: 0 root, 1 t1, 2 t1-t2, 3 t2, 4 t2-t1, 5 t2-t2
    half = [LOG0, 0.0, 0.0]
    logits = np.array([[half, [0.0, LOG0, LOG0], [0, 0, 0], half, [0.0, LOG0, LOG0], [0, 0, 0]]])
    draft = Draft(
        root_tokens=np.array([0]), beams=beams, draft_probs=np.tile([0.0, 0.5, 0.5], (1, 3, 2, 1))
    )
    uniforms = np.full((1, 3, 4), 0.999)
    verdict = RedrafterPublishedVerifier().verify(
        tree, draft, make_target(logits), SAMPLE, uniforms
    )
    assert verdict.path.tolist() == [[0, 3, 4]] and verdict.bonus_tokens.tolist() == [0], (
        f"RedrafterPublishedVerifier: path {verdict.path.tolist()} (want beam 1: [0, 3, 4]), bonus "
        f"{verdict.bonus_tokens}"
    )


def test_typical_accepts_the_first_child_above_the_threshold():
    # root target [0.7, 0.2, 0.1]: entropy 0.80 nats, threshold
    # min(0.09, 0.3 * e^-0.80 = 0.135) = 0.09; child t2 (p = 0.1) comes first in node order and
    # passes, although t0 is likelier.
    tree = make_tree([([5, 2, 0], [-1, 0, 0])])
    logits = log_of([[[0.7, 0.2, 0.1], [0.0, 1.0, 0.0], [1.0, 1.0, 1.0]]])
    verdict = TypicalVerifier().verify(
        tree, head_draft(tree), make_target(logits), SAMPLE, np.zeros((1, 2, 1))
    )
    assert verdict.path.tolist() == [[0, 1]] and verdict.bonus_tokens.tolist() == [1], (
        f"TypicalVerifier: path {verdict.path.tolist()}, bonus {verdict.bonus_tokens.tolist()}"
    )
    verdict = TypicalVerifier(epsilon=0.15).verify(
        tree, head_draft(tree), make_target(logits), SAMPLE, np.zeros((1, 2, 1))
    )
    assert verdict.path.tolist() == [[0, 2]], (
        f"TypicalVerifier(epsilon=0.15) skips t2 (0.1 < 0.135): {verdict.path}"
    )


@pytest.mark.parametrize("seed", range(6))
def test_redrafter_greedy_rule_equals_greedy_verifier(seed):
    """ReDrafter's greedy rule: the beam with the longest prefix matching the argmax (lowest index
    on ties), then the argmax after it, gives the same path and bonus as the tree walk."""
    tree, draft, target, _ = random_beam_case(seed, batch=3, width=4, length=4)
    verdict = GreedyVerifier().verify(tree, draft, target, GREEDY, None)
    for b in range(3):
        nodes, beams = tree.beam_to_node[b], draft.beams[b]
        argmax = np.argmax(target.logits[b], axis=-1)  # (N,)
        matches = beams[:, 1:] == argmax[nodes[:, :-1]]  # (W, L-1)
        lengths = np.cumprod(matches, axis=1).sum(axis=1)  # (W,)
        best = int(np.argmax(lengths))
        expected_path = nodes[best, : lengths[best] + 1].tolist()
        expected_bonus = int(argmax[nodes[best, lengths[best]]])
        got = verdict.path[b, : verdict.num_accepted[b] + 1].tolist()
        assert got == expected_path and verdict.bonus_tokens[b] == expected_bonus, (
            f"seed {seed} row {b} beams {beams.tolist()}: GreedyVerifier "
            f"{got}/{verdict.bonus_tokens[b]}, ReDrafter rule {expected_path}/{expected_bonus}"
        )


@pytest.mark.parametrize("seed", range(6))
def test_temperature_zero_makes_every_verifier_greedy(seed):
    tree, draft, target, uniforms = random_beam_case(seed)
    expected = GreedyVerifier().verify(tree, draft, target, GREEDY, None)
    for verifier in ALL_VERIFIERS:
        for u in (None, uniforms):
            got = verifier.verify(tree, draft, target, GREEDY, u)
            name = (
                f"{type(verifier).__name__} seed {seed} uniforms {'None' if u is None else 'given'}"
            )
            assert np.array_equal(got.path, expected.path), (
                f"{name}: path {got.path.tolist()} != {expected.path.tolist()}"
            )
            assert np.array_equal(got.bonus_tokens, expected.bonus_tokens), (
                f"{name}: bonus differs from greedy"
            )
            assert np.array_equal(got.num_accepted, expected.num_accepted), (
                f"{name}: num_accepted differs from greedy"
            )


@pytest.mark.parametrize("verifier", ALL_VERIFIERS, ids=type)
def test_rows_are_verified_independently(verifier):
    tree, draft, target, uniforms = random_beam_case(7, batch=3)
    verdict = verifier.verify(tree, draft, target, SAMPLE, uniforms)
    for b in range(3):
        row = slice(b, b + 1)
        row_tree = DraftTree(
            tokens=tree.tokens[row],
            parents=tree.parents[row],
            depth=tree.depth[row],
            ancestor_mask=tree.ancestor_mask[row],
            num_nodes=tree.num_nodes[row],
            beam_to_node=tree.beam_to_node[row],
        )
        row_draft = Draft(
            root_tokens=draft.root_tokens[row],
            beams=draft.beams[row],
            draft_probs=draft.draft_probs[row],
            sampled=True,
        )
        alone = verifier.verify(
            row_tree, row_draft, make_target(target.logits[row]), SAMPLE, uniforms[row]
        )
        n = int(verdict.num_accepted[b])
        name = type(verifier).__name__
        assert alone.num_accepted[0] == n and alone.bonus_tokens[0] == verdict.bonus_tokens[b], (
            f"{name} row {b} alone vs batched"
        )
        assert alone.path[0, : n + 1].tolist() == verdict.path[b, : n + 1].tolist(), (
            f"{name} row {b} path alone vs batched"
        )
        assert np.all(verdict.path[b, n + 1 :] == -1), (
            f"{name} row {b}: path past num_accepted is -1"
        )
        assert verdict.path.shape == (3, 4), (
            f"{name}: path shape (B, D+1) = (3, 4), got {verdict.path.shape}"
        )


def test_beam_to_node_is_found_when_the_tree_lacks_it():
    tree, draft, target, uniforms = random_beam_case(8)
    bare = DraftTree(
        tokens=tree.tokens,
        parents=tree.parents,
        depth=tree.depth,
        ancestor_mask=tree.ancestor_mask,
        num_nodes=tree.num_nodes,
    )
    for verifier in (RejectionVerifier(), RedrafterPublishedVerifier()):
        a = verifier.verify(tree, draft, target, SAMPLE, uniforms)
        c = verifier.verify(bare, draft, target, SAMPLE, uniforms)
        assert np.array_equal(a.path, c.path) and np.array_equal(a.bonus_tokens, c.bonus_tokens), (
            f"{type(verifier).__name__}: same verdict with and without tree.beam_to_node"
        )


def test_clear_errors():
    tree, draft, target, uniforms = random_beam_case(9)
    deterministic = Draft(
        root_tokens=draft.root_tokens, beams=draft.beams, draft_probs=draft.draft_probs
    )
    no_probs = Draft(root_tokens=draft.root_tokens, beams=draft.beams)
    cases = [
        (RejectionVerifier(), deterministic, target, uniforms, "sampled"),
        (RejectionVerifier(), no_probs, target, uniforms, "draft_probs"),
        (RedrafterPublishedVerifier(), no_probs, target, uniforms, "draft_probs"),
        (ExactTreeVerifier(), draft, target, None, "temperature > 0"),
        (ExactTreeVerifier(), draft, target, uniforms[:, :2], "uniforms must have shape"),
        (RejectionVerifier(), draft, target, uniforms[:, :, :2], "uniforms must have shape"),
        (GreedyVerifier(), draft, make_target(target.logits[:, :2]), None, "target.logits"),
    ]
    for verifier, case_draft, case_target, case_uniforms, message in cases:
        with pytest.raises(InvalidInputError, match=message):
            verifier.verify(tree, case_draft, case_target, SAMPLE, case_uniforms)
