"""EAGLE-3 on torch and mlx against the float64 NumPy reference, and lossless decoding on every
backend.

Trees are integers and must be identical; an example is used only when every ranking the
reference's tree made (``TreeDraft.margin``) was decided by more than MARGIN, so float rounding
cannot flip it (float64: 1e-7, float32: 1e-4). Draft caches agree within 1e-9 (float64) and
``checks.FLOAT32`` (float32).
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import specdec
from eagle_twins import Inputs, float32_exact
from eagle_twins import check_against_reference as check_slots
from specdec.errors import InvalidInputError
from specdec.testing import checks, make_random_drafter, make_random_model
from specdec_eagle3.checkpoint import random_eagle3_weights
from specdec_eagle3.config import Eagle3Config
from specdec_eagle3.reference import Eagle3Drafter, dynamic_tree

V, H = 48, 16
LAYERS = (0, 1, 3)
CONFIGS = [
    dict(num_heads=4, num_kv_heads=2, head_dim=4, intermediate_size=24, draft_vocab_size=V),
    dict(
        num_heads=2,
        num_kv_heads=2,
        head_dim=8,
        intermediate_size=16,
        draft_vocab_size=20,
        norm_before_residual=True,
    ),
    dict(
        num_heads=4,
        num_kv_heads=1,
        head_dim=2,
        intermediate_size=8,
        rope_theta=100.0,
        draft_vocab_size=30,
    ),
    dict(  # a published head's optional tensors: embed_tokens.weight and input_norm.weight
        num_heads=2,
        num_kv_heads=1,
        head_dim=8,
        intermediate_size=16,
        draft_vocab_size=24,
        own_embedding=True,
        norm_before_fc=True,
    ),
]
IDS = ["gqa-full-vocab", "small-vocab-normed-residual", "one-kv-head", "own-embedding-input-norm"]
TREES = [
    dict(top_k=3, depth=4, total_tokens=9),
    dict(top_k=2, depth=2, total_tokens=2),
    dict(top_k=4, depth=3, total_tokens=30),
    dict(top_k=1, depth=3, total_tokens=3),
]


def make_pair(backend: str, overrides: dict, tree: dict, seed: int, dtype: str, **options):
    """A reference EAGLE-3 and its twin on ``backend`` on the same float32-exact weights
    (``options``: int8, given to both)."""
    rng = np.random.default_rng(seed)
    config = Eagle3Config(vocab_size=V, hidden_size=H, hidden_layers=LAYERS, **overrides)
    embed = float32_exact(rng.normal(size=(V, H)))
    weights = {
        k: v if k == "d2t" else float32_exact(v)
        for k, v in random_eagle3_weights(config, rng).items()
    }
    ref = Eagle3Drafter(config, weights, embed_tokens=embed, **tree, **options)
    if backend == "torch":
        torch = pytest.importorskip("torch")
        from specdec_eagle3.torch import TorchEagle3Drafter

        to = lambda a: torch.as_tensor(np.asarray(a, dtype=dtype))  # noqa: E731
        ints = lambda a: torch.as_tensor(np.asarray(a, dtype=np.int64))  # noqa: E731
        twin = TorchEagle3Drafter(config, weights, embed_tokens=to(embed), **tree, **options)
    else:
        mx = pytest.importorskip("mlx.core")
        from specdec_eagle3.mlx import MlxEagle3Drafter

        to = lambda a: mx.array(np.asarray(a, dtype=np.float32))  # noqa: E731
        ints = lambda a: mx.array(np.asarray(a, dtype=np.int32))  # noqa: E731
        twin = MlxEagle3Drafter(config, weights, embed_tokens=to(embed), **tree, **options)
    if options.get("int8"):  # the rounding must change the weights, or the test is blind
        for name in ("fc.weight", "lm_head.weight"):
            assert not np.array_equal(ref.weights[name], weights[name])
    return ref, twin, to, ints, rng


def check_against_reference(
    backend: str,
    dtype: str,
    overrides: dict,
    tree: dict,
    seed: int,
    margin: float,
    tolerance: dict,
    **options,
):
    pair = make_pair(backend, overrides, tree, seed, dtype, **options)
    check_slots(pair, INPUTS, vocab=V, margin=margin, tolerance=tolerance)


def _tree(ref, slot, root, hidden):
    state = ref.slots[slot]
    return dynamic_tree(
        ref.config,
        ref.weights,
        ref.embed_tokens,
        state,
        root,
        state.pending,
        top_k=ref.top_k,
        depth=ref.depth,
        total_tokens=ref.total_tokens,
    )


# EAGLE-3 reads the target's fused layers (its hidden state is unused: zeros), and the slot's
# pending fused feature is compared besides its cache
INPUTS = Inputs(
    outputs=lambda rng, shape: dict(
        hidden=np.zeros((*shape, H)),
        layers={i: float32_exact(rng.normal(size=(*shape, H))) for i in LAYERS},
    ),
    root_hidden=lambda rng, rows: np.zeros((rows, H)),
    tree=_tree,
    cache=("pending",),
)


@pytest.mark.parametrize(
    "tree", TREES, ids=lambda t: "k{top_k}-d{depth}-n{total_tokens}".format(**t)
)
@pytest.mark.parametrize("overrides", CONFIGS, ids=IDS)
@given(seed=st.integers(0, 2**32 - 1))
def test_torch_float64_matches_reference(overrides, tree, seed):
    check_against_reference(
        "torch", "float64", overrides, tree, seed, 1e-7, dict(rtol=1e-9, atol=1e-9)
    )


@pytest.mark.parametrize("overrides", CONFIGS[:2], ids=IDS[:2])
@given(seed=st.integers(0, 2**32 - 1))
def test_torch_float32_matches_reference(overrides, seed):
    check_against_reference("torch", "float32", overrides, TREES[0], seed, 1e-4, checks.FLOAT32)


@pytest.mark.parametrize("overrides", [CONFIGS[0], CONFIGS[3]], ids=[IDS[0], IDS[3]])
@given(seed=st.integers(0, 2**32 - 1))
def test_torch_int8_matches_reference_int8(overrides, seed):
    """int8=True on both sides: torch's int8 kernel (float32 activations) against the reference's
    products with the same per-row rounding in float64."""
    pytest.importorskip("torch")
    from specdec_torch.int8 import int8_kernel

    if not int8_kernel():
        pytest.skip("this torch has no int8 weight-only kernel")
    check_against_reference(
        "torch", "float32", overrides, TREES[0], seed, 1e-4, checks.FLOAT32, int8=True
    )


def test_mlx_refuses_int8_weights():
    pytest.importorskip("mlx.core")
    with pytest.raises(InvalidInputError, match="int8=None or False"):
        make_pair("mlx", CONFIGS[0], TREES[0], 0, "float32", int8=True)


@pytest.mark.parametrize(
    "tree", TREES[:3], ids=lambda t: "k{top_k}-d{depth}-n{total_tokens}".format(**t)
)
@pytest.mark.parametrize("overrides", CONFIGS, ids=IDS)
@given(seed=st.integers(0, 2**32 - 1))
def test_mlx_float32_matches_reference(overrides, tree, seed):
    check_against_reference("mlx", "float32", overrides, tree, seed, 1e-4, checks.FLOAT32)


@pytest.fixture(scope="module")
def deep_model(tmp_path_factory):
    """A random llama of 6 layers, so the three fused layers are distinct (0, 2, 5)."""
    return make_random_model(
        tmp_path_factory.mktemp("deep") / "llama",
        vocab_size=96,
        hidden_size=32,
        num_layers=6,
        num_heads=4,
        num_kv_heads=2,
        seed=1,
        with_tokenizer=True,
    )


@pytest.fixture(scope="module")
def eagle3(deep_model, tmp_path_factory):
    return make_random_drafter(
        tmp_path_factory.mktemp("eagle3") / "eagle3",
        deep_model,
        kind="eagle3",
        seed=3,
        draft_vocab_size=64,
    )


FRAMEWORKS = {"torch": "torch", "mlx": "mlx.core"}


def framework(name: str) -> None:
    """Skip when backend ``name``'s framework is not installed (a failure when SPECDEC_TEST_BACKENDS
    names it); once installed, its backend must build and EAGLE-3 must be registered for it."""
    import importlib.util

    from specdec.plugins.registry import default_registry

    if importlib.util.find_spec(FRAMEWORKS[name].split(".")[0]) is None:
        pytest.skip(f"{name} is not installed")
    registry = default_registry()
    registry.get("backend", name).factory()
    registry.get("drafter", "eagle3", name)


@pytest.mark.parametrize("backend", sorted(FRAMEWORKS))
def test_greedy_is_plain_decoding_and_slots_start_afresh(deep_model, eagle3, backend):
    """The conformance kit: greedy tokens equal plain decoding on the reference and on torch and
    mlx (float32), and one slot reused equals one slot per prompt."""
    framework(backend)
    checks.check_drafter(str(eagle3), deep_model, backends=["numpy", backend], max_new_tokens=20)


@pytest.mark.parametrize(
    "options",
    [dict(tree_top_k=1, depth=5, total_tokens=5), dict(tree_top_k=5, depth=2, total_tokens=7)],
)
def test_greedy_identity_float64_and_other_trees(deep_model, eagle3, options):
    prompts = [[1, 2, 3, 1, 2, 3, 1], [9], [40, 41, 42, 43, 44, 45, 46, 47, 48, 49, 50]]
    plain = specdec.generate(
        deep_model, prompts, drafter="none", backend="numpy", max_new_tokens=18
    ).tokens
    got = specdec.generate(
        deep_model, prompts, drafter=str(eagle3), backend="numpy", max_new_tokens=18, **options
    )
    assert got.tokens == plain
    assert got.stats.verified_tokens <= got.stats.row_steps * (1 + options["total_tokens"])
    framework("torch")
    for dtype in ("float32", "float64"):
        got = specdec.generate(
            deep_model,
            prompts,
            drafter=str(eagle3),
            backend="torch",
            dtype=dtype,
            max_new_tokens=18,
            **options,
        )
        assert got.tokens == plain, f"torch {dtype} {options}"


def test_seeded_sampling_gives_the_same_tokens_on_numpy_and_torch_float64(deep_model, eagle3):
    """Exact verifier, uniforms drawn on the host: the same seed gives the same tokens."""
    framework("torch")
    prompts = [[5, 6, 7, 8], [11, 12]]
    run = dict(drafter=str(eagle3), max_new_tokens=16, temperature=0.9, top_p=0.95, seed=7)
    reference = specdec.generate(deep_model, prompts, backend="numpy", **run)
    on_torch = specdec.generate(deep_model, prompts, backend="torch", dtype="float64", **run)
    assert reference.tokens == on_torch.tokens
    assert reference.stats.tokens_per_step == on_torch.stats.tokens_per_step


def test_a_drafter_for_another_target_is_refused(model_dir, eagle3):
    """Fused layers past the target's depth are refused by name
    (the 2-layer model lacks layer 5)."""
    from specdec.errors import InvalidInputError

    with pytest.raises(
        InvalidInputError,
        match=r"fuses target layers \[0, 2, 5\] \(0-based output-of-layer ids; a speculators "
        r"config.json writes them as eagle_aux_hidden_state_layer_ids \[1, 3, 6\].*\), but the "
        r"target has 2 decoder layers \(ids 0-1\)",
    ):
        specdec.generate(
            model_dir, [[1, 2]], drafter=str(eagle3), backend="numpy", max_new_tokens=2
        )


def test_tree_options_reach_the_drafter(deep_model, eagle3):
    from specdec.generation.api import prepare

    plan, *_ = prepare(
        deep_model,
        [1],
        str(eagle3),
        "numpy",
        max_new_tokens=4,
        temperature=0.0,
        top_k=None,
        top_p=None,
        dtype=None,
        device=None,
        registry=None,
        options={"tree_top_k": 2, "depth": 5, "total_tokens": 9},
    )
    assert (plan.drafter.top_k, plan.drafter.depth, plan.drafter.total_tokens) == (2, 5, 9)
    assert plan.drafter.caps.hidden_layers == (0, 2, 5)


def test_bench_takes_the_tree_settings_as_method_options(deep_model, eagle3):
    """``specdec bench`` methods ``eagle3:drafter=...,tree_top_k=..,depth=..,total_tokens=..``: the
    options reach the drafter (its beams are depth + 1 long) and the tokens equal plain
    decoding's."""
    from specdec.bench import load_prompt_set, parse_method, run_bench
    from specdec.bench.report import summarize

    method = parse_method(f"eagle3:drafter={eagle3},tree_top_k=2,depth=3,total_tokens=5")
    assert method.kind == "eagle3" and method.options == {
        "drafter_path": str(eagle3),
        "tree_top_k": 2,
        "depth": 3,
        "total_tokens": 5,
    }
    records = run_bench(
        deep_model,
        load_prompt_set("mt-bench", per_category=1)[:2],
        [parse_method("plain"), method],
        grid=[("numpy", None)],
        max_new_tokens=8,
        repeats=1,
        progress=False,
    )
    rows = [r for r in summarize(records) if r["category"] == "all" and r["method"] != "plain"]
    assert rows and all(r["identical"] == 1.0 for r in rows), rows
