"""Exact mode of the MLX target, bitwise (``specdec_mlx.exact``): every node of a tree forward, at
every layer, equals the one-token forward of its path, over Hypothesis trees and ragged rows;
speculative greedy output equals plain decoding. Where this machine's kernels fail the self-test
the tests skip with the kernel that failed. The comparison is shown able to fail by planting a
product whose one-row result differs in the last bit
(``test_the_comparison_catches_a_row_variant_product``).
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from specdec_mlx.blas import prefer_system_blas  # imports no mlx

prefer_system_blas()  # the BLAS users' MLX runs on (the mlx extra's OpenBLAS), whatever tests ran
pytest.importorskip(
    "mlx_lm", reason="mlx is not installed"
)  # required when SPECDEC_TEST_BACKENDS names mlx

import specdec  # noqa: E402
from specdec.testing import make_random_drafter, make_random_model  # noqa: E402
from specdec.types import DraftTree, Verdict  # noqa: E402
from specdec_mlx import invariance  # noqa: E402
import specdec_mlx.target as mlx_target  # noqa: E402

VOCAB, LAYERS = 256, 4
ALL_LAYERS = tuple(range(LAYERS))


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return make_random_model(
        tmp_path_factory.mktemp("mlx-exact") / "llama",
        vocab_size=VOCAB,
        hidden_size=256,
        intermediate_size=768,
        num_layers=LAYERS,
        num_heads=4,
        num_kv_heads=2,
        seed=12,
    )


@pytest.fixture(scope="module")
def target(folder):
    loaded = specdec.load(
        folder, backend="mlx", dtype="float32", slots=3, capacity=300, exact=False
    )
    check = loaded.check_row_invariance()
    if not check.holds:
        pytest.skip(
            f"exact mode does not hold on this machine: {check.failed} (specdec.tuning.exactness)"
        )
    loaded.exact = True
    return loaded


def tree_of(parents: list[int], tokens: list[int]) -> DraftTree:
    n = len(parents)
    ancestors = np.zeros((1, n, n), dtype=bool)
    for i in range(n):
        j = i
        while j >= 0:
            ancestors[0, i, j] = True
            j = parents[j]
    return DraftTree(
        tokens=np.array([tokens]),
        parents=np.array([parents]),
        depth=ancestors.sum(-1) - 1,
        ancestor_mask=ancestors,
        num_nodes=np.array([n]),
    )


def stack(trees):
    return DraftTree(
        **{
            name: np.concatenate([getattr(t, name) for t in trees])
            for name in ("tokens", "parents", "depth", "ancestor_mask", "num_nodes")
        }
    )


def host(array) -> np.ndarray:
    return np.array(array)


def path_of(parents, node):
    path = []
    while node >= 0:
        path.append(node)
        node = parents[node]
    return path[::-1]


def plain_path(target, slot, prompt, tokens):
    target.admit(slot, prompt)
    found = []
    try:
        for token in tokens:
            tree = tree_of([-1], [token])
            out = target.forward_tree(tree, [slot], layers=ALL_LAYERS)
            found.append(
                (host(out.logits[0, 0]), {i: host(v[0, 0]) for i, v in out.layers.items()})
            )
            target.commit(
                tree,
                Verdict(
                    path=np.array([[0]]), num_accepted=np.array([0]), bonus_tokens=np.array([0])
                ),
            )
    finally:
        target.release(slot)
    return found


def differences(target, prompts, trees) -> list[str]:
    for slot, prompt in enumerate(prompts):
        target.admit(slot, prompt)
    try:
        out = target.forward_tree(
            stack([tree_of(p, t) for p, t in trees]), list(range(len(prompts))), layers=ALL_LAYERS
        )
        logits, layers = host(out.logits), {i: host(v) for i, v in out.layers.items()}
    finally:
        for slot in range(len(prompts)):
            target.release(slot)
    found = []
    for row, ((parents, tokens), prompt) in enumerate(zip(trees, prompts, strict=True)):
        for leaf in (i for i in range(len(parents)) if i not in parents):
            nodes = path_of(parents, leaf)
            for node, (plain_logits, plain_layers) in zip(
                nodes, plain_path(target, 2, prompt, [tokens[i] for i in nodes]), strict=True
            ):
                if not np.array_equal(logits[row, node], plain_logits):
                    found.append(f"row {row} node {node}: logits")
                found += [
                    f"row {row} node {node}: layer {i}"
                    for i in ALL_LAYERS
                    if not np.array_equal(layers[i][row, node], plain_layers[i])
                ]
    return found


@st.composite
def cases(draw):
    nodes = draw(st.integers(1, 9))
    trees = []
    for _ in range(2):
        parents = [-1] + [draw(st.integers(0, i - 1)) for i in range(1, nodes)]
        trees.append(
            (parents, draw(st.lists(st.integers(0, VOCAB - 1), min_size=nodes, max_size=nodes)))
        )
    prompts = [
        draw(st.lists(st.integers(0, VOCAB - 1), min_size=1, max_size=100)) for _ in range(2)
    ]
    return prompts, trees


@settings(max_examples=12, deadline=None)
@given(case=cases())
def test_every_tree_node_equals_the_one_token_forward(target, case):
    prompts, trees = case
    assert differences(target, prompts, trees) == []


def test_the_comparison_catches_a_row_variant_product(target, monkeypatch):
    """Positive control: a product whose one-row result is one ulp off (a matrix-vector kernel's
    rounding) makes the comparison fail, and the self-test refuse it."""
    exact_rows = mlx_target.rows_invariant

    def variant(fn, x, rows=2):
        out = exact_rows(fn, x, rows)
        return out * (1 + 2.0**-20) if x.shape[0] == 1 else out

    monkeypatch.setattr(
        mlx_target, "rows_invariant", variant
    )  # the forward's and the self-test's products
    assert differences(target, [[3, 4, 5], [9, 8]], [([-1, 0, 0, 2], [1, 2, 3, 4])] * 2)
    check = invariance.check_target_kernels(target)
    assert not check.holds and check.failed == "q projection", check


def test_greedy_speculation_equals_plain_decoding(folder, target):
    prompts = [[5, 9, 2, 7, 5, 9, 2], [100, 3, 3, 3, 41]]
    plain = specdec.generate(
        target, prompts, drafter="none", backend="mlx", max_new_tokens=30
    ).tokens
    redrafter = make_random_drafter(folder.parent / "redrafter", folder, kind="redrafter", seed=1)
    for drafter in ("lookup", redrafter):
        assert (
            specdec.generate(
                target, prompts, drafter=drafter, backend="mlx", max_new_tokens=30
            ).tokens
            == plain
        )


@pytest.mark.parametrize("shape", [(192, 576), (576, 576), (64, 256), (1536, 576)])
def test_few_row_products_padded_to_min_rows_give_the_bits_of_a_large_call(shape):
    """Where this process's BLAS gives a row the same bits in every large call (the reference BLAS;
    OpenBLAS's SkylakeX kernels, whose small-matrix kernels sum in another order below
    M * N * K = 100**3), a product of 1 to 8 rows computed over ``min_rows`` rows equals the same
    rows of a 160-row product, bit for bit. Where it does not (OpenBLAS 0.3.33's Haswell kernels,
    which it runs on a CPU it does not know, e.g. AMD family 26: a row's bits depend on the call's
    length, in blocks of 12 rows), no padding can match a large call; the test skips saying so."""
    import mlx.core as mx

    from specdec_mlx.exact import min_rows, rows_invariant

    rng = np.random.default_rng(3)
    weight = mx.array(rng.standard_normal(shape).astype(np.float32))
    x = mx.array(rng.standard_normal((600, shape[1])).astype(np.float32))
    whole = np.array(x[:160] @ weight.T)
    if not np.array_equal(whole, np.array(x @ weight.T)[:160]):
        pytest.skip("this BLAS gives a row other bits in a call of 160 rows than in one of 600")
    rows = min_rows([weight])
    assert rows * shape[0] * shape[1] > 100**3 >= (rows - 1) * shape[0] * shape[1] or rows == 2
    for count in range(1, 9):
        for start in (0, 5, 40):
            got = np.array(rows_invariant(lambda a: a @ weight.T, x[start : start + count], rows))
            assert np.array_equal(got, whole[start : start + count]), (count, start)
