"""Exact mode of the torch target, bitwise: a row's results do not depend on what shares its
forward.

Every comparison is ``torch.equal`` (no tolerance), in bfloat16, on a random Llama with the real
SmolLM2-135M layer shapes (hidden 576, intermediate 1536, 9 query / 3 key-value heads of 64) and
8 layers: differences are rare per element (about one output in several thousand for a one-row
product), so the tests compare every layer's output of every node and need enough rows to fail.
``test_the_comparison_can_fail`` is the positive control: the same comparison with exact mode off
finds differences. Where this machine's kernels fail exact mode's self-test, the tests skip with
the kernel that failed (``specdec.tuning.exactness``), and the self-test's own test shows it
refusing a row-variant kernel.
"""

from __future__ import annotations

import os

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

torch = pytest.importorskip("torch")  # required when SPECDEC_TEST_BACKENDS names torch (conftest)

import specdec
from specdec.errors import InvalidInputError
from specdec.tuning.exactness import InvarianceCheck, configure
from specdec.testing import make_random_model
from specdec.types import DraftTree, Verdict
from specdec_torch import invariance

DEVICE = os.environ.get("SPECDEC_TORCH_DEVICE", "cpu")
VOCAB, LAYERS = 512, 8
ALL_LAYERS = tuple(range(LAYERS))


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return make_random_model(
        tmp_path_factory.mktemp("exact") / "llama",
        vocab_size=VOCAB,
        hidden_size=576,
        intermediate_size=1536,
        num_layers=LAYERS,
        num_heads=9,
        num_kv_heads=3,
        seed=11,
    )


def _load(folder, exact, slots=4):
    return specdec.load(
        folder,
        backend="torch",
        dtype="bfloat16",
        device=DEVICE,
        slots=slots,
        capacity=400,
        exact=exact,
    )


@pytest.fixture(scope="module")
def target(folder):
    loaded = _load(folder, False)
    check = loaded.check_row_invariance()
    if not check.holds:
        pytest.skip(
            f"exact mode does not hold on this machine: {check.failed} (specdec.tuning.exactness)"
        )
    loaded.exact = True
    return loaded


def tree_of(parents: list[int], tokens: list[int]) -> DraftTree:
    n = len(parents)
    ancestors = torch.zeros((1, n, n), dtype=torch.bool)
    for i in range(n):
        j = i
        while j >= 0:
            ancestors[0, i, j] = True
            j = parents[j]
    return DraftTree(
        tokens=torch.tensor([tokens]),
        parents=torch.tensor([parents]),
        depth=ancestors.sum(-1) - 1,
        ancestor_mask=ancestors,
        num_nodes=torch.tensor([n]),
    )


def stack(trees: list[DraftTree]) -> DraftTree:
    return DraftTree(
        **{
            name: torch.cat([getattr(t, name) for t in trees])
            for name in ("tokens", "parents", "depth", "ancestor_mask", "num_nodes")
        }
    )


def one_token(target, slot: int, token: int):
    """Plain decoding's forward of ``token`` in ``slot``, committed: (logits, {layer: output})."""
    tree = tree_of([-1], [token])
    out = target.forward_tree(tree, [slot], layers=ALL_LAYERS)
    result = out.logits[0, 0].clone(), {i: v[0, 0].clone() for i, v in out.layers.items()}
    target.commit(
        tree,
        Verdict(
            path=torch.tensor([[0]]), num_accepted=torch.tensor([0]), bonus_tokens=torch.tensor([0])
        ),
    )
    return result


def plain_path(target, slot: int, prompt: list[int], tokens: list[int]):
    """The one-token forwards of ``tokens`` after ``prompt`` admitted into the free ``slot``."""
    target.admit(slot, prompt)
    try:
        return [one_token(target, slot, t) for t in tokens]
    finally:
        target.release(slot)


def path_of(parents: list[int], node: int) -> list[int]:
    path = []
    while node >= 0:
        path.append(node)
        node = parents[node]
    return path[::-1]


def differences(target, prompts, trees, chunk=None) -> list[str]:
    """Every node of ``trees`` (one per row, row b over ``prompts[b]``, in slots 0..B-1; with
    ``chunk``, a prompt chunk of another request in slot B in the same forward) against plain
    decoding of its path: the nodes and layers whose bits differ."""
    for slot, prompt in enumerate(prompts):
        target.admit(slot, prompt)
    context = [] if chunk is None else [(len(prompts), np.array(chunk))]
    try:
        out = target.forward_tree(
            stack([tree_of(p, t) for p, t in trees]),
            list(range(len(prompts))),
            context=context,
            layers=ALL_LAYERS,
        )
    finally:
        for slot in range(len(prompts) + (chunk is not None)):
            if target.cache.admitted[slot]:
                target.release(slot)
    found = []
    reference_slot = len(prompts) + 1
    for row, ((parents, tokens), prompt) in enumerate(zip(trees, prompts, strict=True)):
        leaves = [i for i in range(len(parents)) if i not in parents]
        for leaf in leaves:
            nodes = path_of(parents, leaf)
            plain = plain_path(target, reference_slot, prompt, [tokens[i] for i in nodes])
            for node, (logits, layers) in zip(nodes, plain, strict=True):
                if not torch.equal(out.logits[row, node], logits):
                    found.append(f"row {row} node {node}: logits")
                found += [
                    f"row {row} node {node}: layer {i}"
                    for i in ALL_LAYERS
                    if not torch.equal(out.layers[i][row, node], layers[i])
                ]
    return found


@st.composite
def trees(draw, rows=1):
    """(prompts, [(parents, tokens)]): rows of random trees (parents before children, paths up to
    eight nodes deep, beams spread among each other) over prompts of different lengths."""
    nodes = draw(st.integers(1, 10))
    out = []
    for _ in range(rows):
        parents = [-1]
        for i in range(1, nodes):
            parent = draw(st.integers(0, i - 1))
            depth = len(path_of(parents, parent))
            parents.append(parent if depth < 8 else 0)
        tokens = draw(st.lists(st.integers(0, VOCAB - 1), min_size=nodes, max_size=nodes))
        out.append((parents, tokens))
    prompts = [
        draw(st.lists(st.integers(0, VOCAB - 1), min_size=1, max_size=120)) for _ in range(rows)
    ]
    return prompts, out


@settings(max_examples=24, deadline=None)
@given(case=trees())
def test_every_tree_node_equals_the_one_token_forward(target, case):
    prompts, rows = case
    assert differences(target, prompts, rows) == []


@settings(max_examples=12, deadline=None)
@given(case=trees(rows=2), chunk=st.lists(st.integers(0, VOCAB - 1), min_size=1, max_size=60))
def test_ragged_rows_packed_beside_a_prompt_chunk_equal_the_one_token_forward(target, case, chunk):
    prompts, rows = case
    assume(len(prompts[0]) != len(prompts[1]))
    assert differences(target, prompts, rows, chunk=chunk) == []


def test_the_comparison_can_fail(folder):
    """Positive control: with exact mode off, the same comparison finds differences (SDPA's
    blocking follows the key count; the down projection's one-row kernel rounds differently)."""
    target = _load(folder, False)
    rng = np.random.default_rng(5)
    cases = [
        (
            [int(t) for t in rng.integers(0, VOCAB, 90 + 7 * k)],
            ([-1, 0, 1, 2, 0, 4, 5, 6], [int(t) for t in rng.integers(0, VOCAB, 8)]),
        )
        for k in range(3)
    ]
    found = [d for prompt, tree in cases for d in differences(target, [prompt], [tree])]
    assert len(found) >= 3, (
        f"exact mode off gave {found}: this comparison could hardly catch a difference"
    )


@settings(max_examples=6, deadline=None)
@given(prompt=st.lists(st.integers(0, VOCAB - 1), min_size=2, max_size=200), data=st.data())
def test_a_prompt_admitted_in_chunks_writes_the_same_cache_as_at_once(target, prompt, data):
    cuts = sorted(set(data.draw(st.lists(st.integers(1, len(prompt) - 1), max_size=4))))
    target.admit(0, prompt)
    start = 0
    for end in cuts + [len(prompt)]:
        target.forward_tree(None, [1] if start else [], context=[(1, np.array(prompt[start:end]))])
        start = end
    try:
        assert torch.equal(
            target.cache.data[:, :, 0, :, : len(prompt)],
            target.cache.data[:, :, 1, :, : len(prompt)],
        )
    finally:
        target.release(0)
        target.release(1)


def test_greedy_speculation_equals_plain_decoding_in_bfloat16(folder, target):
    """specdec.generate with drafters that propose often-wrong tokens (random ReDrafter and Medusa,
    prompt lookup): token for token the plain bfloat16 output, every drafter."""
    from specdec.testing import make_random_drafter

    prompts = [[5, 9, 2, 7, 5, 9, 2], [100, 3, 3, 3, 41], list(range(30, 70))]
    plain = specdec.generate(
        target, prompts, drafter="none", backend="torch", max_new_tokens=40
    ).tokens
    drafters = {
        "lookup": "lookup",
        "redrafter": make_random_drafter(
            folder.parent / "redrafter", folder, kind="redrafter", seed=1
        ),
        "medusa": make_random_drafter(folder.parent / "medusa", folder, kind="medusa", seed=2),
    }
    for name, drafter in drafters.items():
        spec = specdec.generate(
            target, prompts, drafter=drafter, backend="torch", max_new_tokens=40
        )
        assert spec.tokens == plain, (
            f"{name}: speculative bfloat16 output differs from plain decoding"
        )


def test_the_self_test_refuses_a_row_variant_product(target, monkeypatch):
    """A product whose one-row result differs in the last bit from the same row among others
    (what a matrix-vector kernel does) fails the self-test, naming the product."""
    exact_linear = invariance.linear_rows

    def variant(x, weight, bias=None, block=None):
        out = exact_linear(x, weight, bias, block)
        return out.nextafter(out + 1) if x.shape[0] == 1 else out

    monkeypatch.setattr(invariance, "linear_rows", variant)
    check = invariance.check_target_kernels(target)
    assert not check.holds and check.failed == "q/k/v projection (960, 576)", check


def test_products_that_round_otherwise_above_some_rows_run_in_blocks(target, monkeypatch):
    """A product whose rows round otherwise in calls of more than 40 rows (what oneDNN's AMX
    kernels do on two threads above 32): the self-test finds the largest block of rows that keeps
    every product invariant (32 of 64, 32, 16, 8), and the target computes in those blocks."""
    from specdec_torch import exact
    from specdec_torch import target as torch_target

    one_call = exact._linear_rows

    def variant(x, weight, bias=None):
        out = one_call(x, weight, bias)
        return out.nextafter(out + 1) if x.reshape(-1, x.shape[-1]).shape[0] > 40 else out

    monkeypatch.setattr(exact, "_linear_rows", variant)
    check = invariance.check_target_kernels(target)
    assert check.holds and check.row_block == 32, check
    assert "q/k/v projection (960, 576) in calls of at most 32 rows" in check.checked, check
    rows = torch.randn((100, 576)).to(torch.bfloat16)
    weight = target._packed[0][0]
    whole = torch.cat([exact.linear_rows(rows[i : i + 2], weight) for i in range(0, 100, 2)])
    assert not torch.equal(exact.linear_rows(rows, weight), whole)  # the variant bites
    assert torch.equal(exact.linear_rows(rows, weight, block=32), whole)
    monkeypatch.setattr(torch_target, "check_row_invariance", lambda _: check)
    monkeypatch.setattr(target, "row_block", target.row_block)  # restored after the test
    assert target.check_row_invariance() is check and target.row_block == 32


def test_a_failed_self_test_turns_exact_mode_off_or_refuses(target, monkeypatch):
    failed = InvarianceCheck(holds=False, failed="down projection (576, 1536)")
    monkeypatch.setattr(type(target), "check_row_invariance", lambda self: failed)
    off = r"exact mode off: the down projection \(576 x 1536\) rounds a row differently"
    with pytest.warns(RuntimeWarning, match=off):
        outcome = configure(target, None, backend="torch")
    assert not outcome.on and not target.exact
    with pytest.raises(InvalidInputError, match="exact=True, but the down projection"):
        configure(target, True, backend="torch")
    assert configure(target, False).reason == "off (exact=False)"
    monkeypatch.undo()
    assert configure(target, None, backend="torch").on and target.exact


def _guard(target, **sizes):
    from specdec.plugins.registry import default_registry
    from specdec.tuning.guard import check_decoding

    backend = default_registry().get("backend", "torch").factory()
    return check_decoding(
        target, backend.to_numpy, lambda array: backend.from_numpy(array, target), **sizes
    )


def test_the_decoding_guard_holds_and_sees_exact_mode_off(target):
    """The guard (specdec.tuning.guard) on the forward decoding runs: trees of 1 to 8 nodes in 3
    rows and prompt chunks equal one token at a time; with exact mode off it finds a difference
    and names where (positive control)."""
    check = _guard(target, max_nodes=8, rows=3)
    assert check.holds, check.failed
    target.exact = False
    try:
        check = _guard(target, max_nodes=8, rows=3)
    finally:
        target.exact = True
    assert not check.holds and "other bits than one token at a time" in check.failed


def test_the_guard_refuses_a_product_that_rounds_otherwise_at_one_row_count(target, monkeypatch):
    """A product that rounds otherwise only in calls of 6 rows, a count the per-product self-test
    never tries: the self-test passes, the guard finds the 6-node tree and the first layer."""
    from specdec.tuning import guard
    from specdec_torch import target as torch_target

    exact_linear = torch_target.linear_rows

    def variant(x, weight, bias=None, block=None):
        out = exact_linear(x, weight, bias, block)
        return out.nextafter(out + 1) if x.shape[0] == 6 else out

    monkeypatch.setattr(torch_target, "linear_rows", variant)
    monkeypatch.setattr(target, "exactness", target.exactness)  # restored after the test
    assert invariance.check_target_kernels(target).holds
    check = _guard(target, max_nodes=8, rows=1)
    assert not check.holds
    assert check.failed.startswith("a 6-node chain (6 rows in one forward)"), check.failed
    assert check.failed.endswith("first at decoder layer 0's output"), check.failed
    monkeypatch.setattr(guard, "guarded", lambda *a, **k: check)
    with pytest.raises(InvalidInputError, match="exact=True, but a 6-node chain"):
        guard.guard_exact_mode(None, target, max_nodes=8, rows=1, insist=True)
    with pytest.warns(RuntimeWarning, match="exact mode off: a 6-node chain"):
        guard.guard_exact_mode(None, target, max_nodes=8, rows=1)
    assert not target.exact and not target.exactness.on
    target.exact = True


def test_the_guard_never_runs_on_a_target_a_generation_holds(target, monkeypatch):
    """A second call on a busy target must not touch the slots the first one decodes in: the
    guard is not run there, and the call is refused as busy."""
    from specdec.decode import lease
    from specdec.tuning import guard

    ran = []
    monkeypatch.setattr(guard, "guarded", lambda *a, **k: ran.append(1))
    lease.acquire(target)
    try:
        with pytest.raises(specdec.TargetBusyError):
            specdec.generate(target, [1, 2, 3], drafter="lookup", max_new_tokens=2)
    finally:
        lease.release(target)
    assert not ran
