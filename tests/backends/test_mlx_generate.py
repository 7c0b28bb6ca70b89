"""End to end on the mlx backend: greedy parity with mlx-lm's own generation, the same tokens
as the numpy reference for the same folder, checkpoint, prompts and seed, and a drafter that
knows the answer being accepted in full.

Near-ties: the random models have decisive logits (standard deviation ~4); greedy tests first
check that mlx-lm's chosen token beats the runner-up by more than 1e-3 at every position.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

pytest.importorskip(
    "mlx_lm", reason="mlx is not installed"
)  # required when SPECDEC_TEST_BACKENDS names mlx (conftest)

import mlx.core as mx  # noqa: E402

import specdec  # noqa: E402
from specdec.testing import OracleDrafter, make_random_drafter, make_random_model  # noqa: E402
from specdec_mlx.backend import MlxBackend  # noqa: E402

PROMPTS = [[1, 2, 3], [4], [5, 6, 7, 8, 9, 10, 11]]
NEW_TOKENS = 16


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """Per architecture: the model folder, a ReDrafter and a Medusa checkpoint for it."""
    root = tmp_path_factory.mktemp("mlx_generate")
    out = {}
    for arch, seed in (("llama", 11), ("qwen2", 12)):
        model = make_random_model(
            root / arch,
            vocab_size=96,
            hidden_size=32,
            num_layers=2,
            num_heads=4,
            num_kv_heads=2,
            seed=seed,
            architecture=arch,
            tie_word_embeddings=arch == "llama",
        )
        out[arch] = dict(
            model=model,
            redrafter=make_random_drafter(
                root / f"{arch}-redrafter",
                model,
                kind="redrafter",
                seed=1,
                beam_width=3,
                beam_length=4,
            ),
            medusa=make_random_drafter(
                root / f"{arch}-medusa", model, kind="medusa", seed=1, choices="small8"
            ),
        )
    return out


def mlx_lm_greedy(folder: Path, prompts, count: int) -> list[list[int]]:
    """Plain greedy decoding by mlx-lm itself, one row at a time, with a margin check."""
    from mlx_lm.generate import generate_step
    from mlx_lm.utils import load_model

    model, _ = load_model(Path(folder))
    rows = []
    for prompt in prompts:
        steps = list(
            generate_step(
                mx.array(prompt), model, max_tokens=count, sampler=lambda x: mx.argmax(x, axis=-1)
            )
        )
        tokens = [int(token) for token, _ in steps]
        for position, (_, log_probs) in enumerate(steps):
            top2 = np.sort(np.array(log_probs.astype(mx.float32)).ravel())[-2:]
            assert top2[1] - top2[0] > 1e-3, (
                f"test precondition: near-tie at position {position} of prompt {prompt}"
            )
        rows.append(tokens)
    return rows


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_greedy_parity_with_mlx_lm(world, arch):
    """Every drafter, ragged batch, rows compared one by one with mlx-lm's generate_step."""
    expected = mlx_lm_greedy(world[arch]["model"], PROMPTS, NEW_TOKENS)
    target = specdec.load(world[arch]["model"], backend="mlx")
    for drafter in ("none", world[arch]["redrafter"], world[arch]["medusa"]):
        result = specdec.generate(
            target,
            PROMPTS,
            drafter=drafter,
            backend="mlx",
            max_new_tokens=NEW_TOKENS,
            stop_at_eos=False,
        )
        for row, (got, want) in enumerate(zip(result.tokens, expected, strict=True)):
            assert got == want, (
                f"generate(backend='mlx', {arch}, drafter={drafter}) row {row}: {got} != mlx-lm "
                f"{want}"
            )


@pytest.mark.parametrize("corruption", [0.0, 0.4])
def test_oracle_drafter_is_accepted_as_far_as_it_is_right(world, corruption):
    """A drafter proposing the target's own continuation: corruption 0 accepts every drafted
    token (tokens per step = L); with corruption the output is still plain greedy decoding."""
    folder = world["llama"]["model"]
    expected = mlx_lm_greedy(folder, PROMPTS, NEW_TOKENS + 8)
    backend = MlxBackend()
    target = backend.load_target(folder, slots=len(PROMPTS))
    length = 4
    oracle = OracleDrafter(
        expected,
        prompts=PROMPTS,
        vocab_size=target.vocab_size,
        backend=backend,
        target=target,
        beam_width=2,
        beam_length=length,
        corruption=corruption,
        rng=np.random.default_rng(3),
    )
    result = specdec.generate(
        target, PROMPTS, drafter=oracle, backend="mlx", max_new_tokens=NEW_TOKENS, stop_at_eos=False
    )
    assert result.tokens == [row[:NEW_TOKENS] for row in expected], (
        f"oracle drafter (corruption {corruption})"
    )
    if corruption == 0.0:
        steps = result.stats.steps - 1  # the prefill emits the first token, then L tokens per step
        assert steps == -(-(NEW_TOKENS - 1) // length), (
            f"a perfect drafter took {steps} steps for {NEW_TOKENS} tokens"
        )
        # every token beyond each step's own one was drafted and accepted (the last step's cut
        # to the length: accepted tokens count what the request kept)
        assert result.stats.accepted_tokens == len(PROMPTS) * (NEW_TOKENS - 1 - steps), (
            "every drafted token is accepted"
        )
    else:
        assert result.stats.accepted_tokens > 0, "some drafted tokens must be accepted"


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
@pytest.mark.parametrize("drafter_name", ["none", "redrafter", "medusa"])
@pytest.mark.parametrize(
    "sampling",
    [
        dict(),
        dict(temperature=0.8, seed=5),
        dict(temperature=1.0, top_k=6, top_p=0.9, seed=[3, 4, 5]),
    ],
    ids=["greedy", "t0.8", "topk-topp"],
)
def test_same_tokens_as_numpy(world, arch, drafter_name, sampling):
    drafter = "none" if drafter_name == "none" else world[arch][drafter_name]
    options = dict(drafter=drafter, max_new_tokens=NEW_TOKENS, stop_at_eos=False, **sampling)
    expected = specdec.generate(world[arch]["model"], PROMPTS, backend="numpy", **options).tokens
    actual = specdec.generate(
        world[arch]["model"], PROMPTS, backend="mlx", dtype="float32", **options
    ).tokens
    assert actual == expected, (
        f"generate({arch}, drafter={drafter_name}, {sampling}): mlx {actual} != numpy {expected}"
    )


LOOPING_PROMPTS = [[1, 2, 3, 1, 2, 3, 1, 2], [4], [5, 6, 5, 6, 5]]


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
@pytest.mark.parametrize(
    "sampling", [dict(), dict(temperature=0.8, seed=5)], ids=["greedy", "t0.8"]
)
def test_lookup_gives_the_same_tokens_as_numpy(world, arch, sampling):
    """Prompt lookup alone and beside ReDrafter (the host-side n-gram drafts, joined to mlx
    beams)."""
    for drafter, extra in (
        ("lookup", dict(draft_length=3, min_ngram=1)),
        (world[arch]["redrafter"], dict(lookup=True)),
    ):
        options = dict(
            drafter=drafter, max_new_tokens=NEW_TOKENS, stop_at_eos=False, **sampling, **extra
        )
        expected = specdec.generate(
            world[arch]["model"], LOOPING_PROMPTS, backend="numpy", **options
        )
        actual = specdec.generate(
            world[arch]["model"], LOOPING_PROMPTS, backend="mlx", dtype="float32", **options
        )
        assert actual.tokens == expected.tokens, (
            f"generate({arch}, {drafter}, {extra}, {sampling}): mlx != numpy"
        )
        assert actual.stats.drafted_tokens == expected.stats.drafted_tokens


@pytest.mark.parametrize("drafter_name", ["redrafter", "medusa"])
def test_same_tokens_as_torch_when_installed(world, drafter_name):
    """The third backend, when torch is importable: the same tokens as mlx in float32."""
    pytest.importorskip("torch")
    if "torch" not in specdec.default_registry().names("backend"):
        pytest.skip("the torch backend plugin is not installed")
    options = dict(
        drafter=world["llama"][drafter_name],
        max_new_tokens=NEW_TOKENS,
        stop_at_eos=False,
        dtype="float32",
        temperature=0.8,
        seed=9,
    )
    expected = specdec.generate(
        world["llama"]["model"], PROMPTS, backend="torch", device="cpu", **options
    ).tokens
    actual = specdec.generate(world["llama"]["model"], PROMPTS, backend="mlx", **options).tokens
    assert actual == expected, (
        f"generate(drafter={drafter_name}, t=0.8): mlx {actual} != torch {expected}"
    )


@pytest.mark.parametrize(
    "verifier,drafter_options",
    [
        (None, dict(sample=True)),
        ("exact", dict(sample=True)),
        ("rejection", dict(sample=True)),
        ("redrafter_published", {}),
        ("typical", {}),
    ],
)
def test_same_tokens_as_numpy_with_each_verifier(world, verifier, drafter_options):
    """None: the default choice (rejection sampling for sampled proposals) on both backends."""
    chosen = {} if verifier is None else dict(verifier=verifier)
    options = dict(
        drafter=world["llama"]["redrafter"],
        max_new_tokens=NEW_TOKENS,
        stop_at_eos=False,
        temperature=0.9,
        seed=7,
        **chosen,
        **drafter_options,
    )
    expected = specdec.generate(world["llama"]["model"], PROMPTS, backend="numpy", **options).tokens
    actual = specdec.generate(world["llama"]["model"], PROMPTS, backend="mlx", **options).tokens
    assert actual == expected, (
        f"generate(verifier={verifier}, {drafter_options}): mlx {actual} != numpy {expected}"
    )


@pytest.mark.parametrize("verifier", ["exact", "typical"])
def test_same_tokens_as_numpy_when_drafts_are_accepted(world, verifier):
    """An oracle drafter (the greedy continuation, 30% corrupted) under low-temperature sampling:
    accepted paths of many lengths, identical on both backends."""
    folder = world["qwen2"]["model"]
    truth = mlx_lm_greedy(folder, PROMPTS, NEW_TOKENS + 8)
    results = {}
    for name in ("numpy", "mlx"):
        backend = specdec.default_registry().get("backend", name).factory()
        target = backend.load_target(
            folder, dtype=None if name == "numpy" else "float32", device=None, slots=len(PROMPTS)
        )
        oracle = OracleDrafter(
            truth,
            prompts=PROMPTS,
            vocab_size=target.vocab_size,
            backend=backend,
            target=target,
            beam_width=3,
            beam_length=4,
            corruption=0.3,
            rng=np.random.default_rng(5),
        )
        results[name] = specdec.generate(
            target,
            PROMPTS,
            drafter=oracle,
            backend=name,
            max_new_tokens=NEW_TOKENS,
            stop_at_eos=False,
            temperature=0.3,
            seed=21,
            verifier=verifier,
        )
    assert results["mlx"].tokens == results["numpy"].tokens, (
        f"oracle drafts, {verifier}: mlx != numpy"
    )
    assert results["mlx"].stats.accepted_tokens > 3 * len(PROMPTS), (
        f"{verifier}: drafts must be accepted"
    )


def test_static_size_trees_give_the_same_tokens(world):
    """Padding every prefix tree to 1 + W (L - 1) nodes (no host read of the tree size) changes
    nothing."""
    from specdec_mlx.tree import PrefixTreeBuilder

    options = dict(
        drafter=world["llama"]["redrafter"],
        max_new_tokens=NEW_TOKENS,
        stop_at_eos=False,
        temperature=0.9,
        seed=11,
    )
    expected = specdec.generate(world["llama"]["model"], PROMPTS, backend="numpy", **options).tokens
    actual = specdec.generate(
        world["llama"]["model"],
        PROMPTS,
        backend="mlx",
        tree_builder=PrefixTreeBuilder(static_size=True),
        **options,
    ).tokens
    assert actual == expected, f"static_size prefix trees: mlx {actual} != numpy {expected}"


def test_a_row_decodes_the_same_alone_and_in_a_batch(world):
    options = dict(
        drafter=world["qwen2"]["redrafter"],
        backend="mlx",
        max_new_tokens=NEW_TOKENS,
        stop_at_eos=False,
        temperature=1.0,
    )
    batch = specdec.generate(world["qwen2"]["model"], PROMPTS, seed=[7, 8, 9], **options).tokens
    alone = specdec.generate(world["qwen2"]["model"], PROMPTS[2], seed=[9], **options).tokens
    assert alone == batch[2], f"row 2 alone {alone} != in batch {batch[2]}"
