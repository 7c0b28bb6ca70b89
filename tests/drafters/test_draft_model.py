"""The draft-model drafter (drafters/specdec_draftmodel), registered like a third party's.

Random target models here have untied embeddings, so their greedy text does not repeat one token
and drafts are accepted and rejected at many depths. Draft models: the target itself (every
drafted token is the target's own choice), a perturbed copy of the target (about half of the
drafted tokens accepted) and a small random model with the target's tokenizer (a drafter folder
from ``make_random_drafter``). Cross-backend comparisons run float64 on numpy and torch, float32
on torch and mlx; the models' logits are decisive (specdec.testing.models), so float32 keeps the
reference's choices.
"""

from __future__ import annotations

import itertools
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from safetensors.numpy import load_file, save_file

import specdec
from specdec.generation.api import prepare
from specdec.decode.loop import decode_steps
from specdec.reference.model import load_target
from specdec.plugins.builtin import NumpyBackend
from specdec.reference.sampling import target_probs
from specdec.reference.tree import build_prefix_tree, check_tree
from specdec.reference.verify import ExactTreeVerifier, RejectionVerifier
from specdec.testing import checks, make_random_drafter, make_random_model
from specdec.testing.enumeration import enumerate_outcomes, target_joint
from specdec.testing.requests import decoding_plan, run_schedule
from specdec.types import DraftContext, SamplingConfig
from specdec_draftmodel.drafter import DraftModelDrafter, chain_tree

PROMPTS = [[1, 2, 3, 1, 2, 3, 1, 2], [4, 5, 6], [7], [50, 60, 70, 80]]
NEW_TOKENS = 20


def installed(name: str) -> bool:
    import importlib.util

    modules = {"numpy": (), "torch": ("torch",), "mlx": ("mlx.core", "mlx_lm")}[name]
    return name in specdec.default_registry().names("backend") and all(
        importlib.util.find_spec(m) is not None for m in modules
    )


# (backend, dtype) pairs: float64 where the backend has it, float32 on every framework backend
GRID = [("numpy", None), ("torch", "float64"), ("torch", "float32"), ("mlx", "float32")]


def grid(*names: str):
    return [
        pytest.param(
            b,
            d,
            id=f"{b}-{d or 'float64'}",
            marks=pytest.mark.skipif(not installed(b), reason=f"{b} is not installed"),
        )
        for b, d in GRID
        if not names or b in names
    ]


def perturbed_copy(source: Path, folder: Path, *, scale: float, seed: int) -> Path:
    """The model at ``source`` with Gaussian noise of ``scale`` times each tensor's spread added."""
    shutil.copytree(source, folder, dirs_exist_ok=True)
    rng = np.random.default_rng(seed)
    tensors = load_file(str(source / "model.safetensors"))
    noisy = {
        k: (v + scale * v.std() * rng.standard_normal(v.shape)).astype(v.dtype)
        for k, v in tensors.items()
    }
    save_file(noisy, str(folder / "model.safetensors"), metadata={"format": "pt"})
    return folder


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    root = tmp_path_factory.mktemp("draft_model")
    target = make_random_model(
        root / "target",
        vocab_size=96,
        hidden_size=32,
        num_layers=2,
        num_heads=4,
        num_kv_heads=2,
        seed=2,
        with_tokenizer=True,
        tie_word_embeddings=False,
    )
    return dict(
        root=root,
        target=target,
        perturbed=perturbed_copy(target, root / "perturbed", scale=0.2, seed=0),
        small=make_random_drafter(
            root / "small", target, kind="draft_model", seed=5
        ),  # a drafter folder
    )


def draft_options(world, draft: str) -> dict:
    """generate() options drafting with ``draft``: "self" (the target), "perturbed" or "small"."""
    if draft == "small":
        return dict(drafter=world["small"])
    return dict(
        drafter="draft_model",
        draft_model=world["target"] if draft == "self" else world["perturbed"],
    )


# ---------------------------------------------------------------------------------------------
# The chain tree


@settings(max_examples=25)
@given(data=st.data(), batch=st.integers(1, 4), size=st.integers(1, 6))
def test_a_chain_tree_is_the_prefix_tree_of_one_beam_and_pads_like_it(data, batch, size):
    tokens = np.array(
        data.draw(
            st.lists(
                st.lists(st.integers(0, 9), min_size=size, max_size=size),
                min_size=batch,
                max_size=batch,
            )
        ),
        dtype=np.int64,
    )
    full, reference = chain_tree(tokens), build_prefix_tree(tokens[:, None, :])
    for field in ("tokens", "parents", "depth", "ancestor_mask", "num_nodes"):
        np.testing.assert_array_equal(
            getattr(full, field), getattr(reference, field), err_msg=field
        )
    lengths = np.array(data.draw(st.lists(st.integers(1, size), min_size=batch, max_size=batch)))
    ragged = chain_tree(tokens, lengths)
    check_tree(ragged)  # the DraftTree invariants: parents before children, masks of ancestors
    for b, n in enumerate(
        lengths.tolist()
    ):  # real chain nodes, then padding off the root as build_prefix_tree pads
        np.testing.assert_array_equal(
            ragged.tokens[b], np.r_[tokens[b, :n], np.zeros(size - n, dtype=np.int64)]
        )
        np.testing.assert_array_equal(
            ragged.parents[b], np.r_[-1, np.arange(n - 1), np.zeros(size - n, dtype=np.int64)]
        )
        np.testing.assert_array_equal(
            ragged.depth[b], np.r_[np.arange(n), np.ones(size - n, dtype=np.int64)]
        )
        np.testing.assert_array_equal(
            ragged.ancestor_mask[b, :n, :n], np.tril(np.ones((n, n), dtype=bool))
        )
    assert (ragged.num_nodes == lengths).all()


# ---------------------------------------------------------------------------------------------
# Lossless greedy decoding on every backend


@pytest.mark.parametrize("draft", ["self", "perturbed", "small"])
@pytest.mark.parametrize("backend, dtype", grid())
def test_greedy_output_equals_plain_decoding(world, backend, dtype, draft):
    common = dict(backend=backend, dtype=dtype, max_new_tokens=NEW_TOKENS, stop_at_eos=False)
    plain = specdec.generate(world["target"], PROMPTS, drafter="none", **common)
    reference = specdec.generate(
        world["target"],
        PROMPTS,
        drafter="none",
        backend="numpy",
        max_new_tokens=NEW_TOKENS,
        stop_at_eos=False,
    )
    assert plain.tokens == reference.tokens, (
        f"{backend} {dtype}: plain decoding differs from the reference"
    )
    result = specdec.generate(world["target"], PROMPTS, **common, **draft_options(world, draft))
    assert result.tokens == plain.tokens, (
        f"{backend} {dtype} draft={draft}: greedy tokens differ from plain"
    )
    if draft == "perturbed":  # accepted and rejected drafts both occurred
        assert 1.3 < result.stats.tokens_per_step < 4.5, result.stats


@pytest.mark.parametrize("k", [1, 3])
@pytest.mark.parametrize("backend, dtype", grid())
def test_the_target_as_its_own_draft_model_has_every_drafted_token_accepted(
    world, backend, dtype, k
):
    steps = list(
        specdec.stream(
            world["target"],
            PROMPTS,
            backend=backend,
            dtype=dtype,
            max_new_tokens=NEW_TOKENS,
            stop_at_eos=False,
            drafter="draft_model",
            draft_model=world["target"],
            draft_length=k,
        )
    )
    decode = [s for s in steps if not s.is_prefill]
    assert decode and all((s.num_accepted[s.num_verified > 0] == k).all() for s in decode), [
        s.num_accepted.tolist() for s in decode
    ]
    emitted = [sum(len(s.new_tokens[row]) for s in decode) for row in range(len(PROMPTS))]
    # after the prompt's token, K + 1 tokens per step, the last step cut at max_new_tokens
    assert len(decode) == -(-(NEW_TOKENS - 1) // (k + 1)) and emitted == [NEW_TOKENS - 1] * len(
        PROMPTS
    )


@pytest.mark.parametrize("sample", [True, False], ids=["rejection", "exact"])
def test_sampling_with_the_target_as_its_own_draft_model_accepts_every_token(world, sample):
    """Draft and target distributions are the same, so rejection sampling accepts every draw;
    the greedy chain is accepted only where the target's sample is its argmax."""
    result = specdec.generate(
        world["target"],
        PROMPTS,
        backend="numpy",
        max_new_tokens=NEW_TOKENS,
        stop_at_eos=False,
        temperature=0.8,
        seed=3,
        drafter="draft_model",
        draft_model=world["target"],
        draft_length=3,
        sample=sample,
    )
    stats = result.stats
    if sample:  # every drafted token accepted: all but the one per step that the loop adds,
        # up to each request's length (its last step, cut, keeps what the length leaves)
        assert stats.accepted_tokens == stats.new_tokens - stats.row_steps, stats
        assert stats.drafted_tokens - stats.accepted_tokens < len(PROMPTS) * 3, stats
    else:
        assert 0 < result.stats.accepted_tokens < result.stats.drafted_tokens, result.stats


# ---------------------------------------------------------------------------------------------
# Seeded sampling: the same tokens on every backend


@pytest.mark.parametrize(
    "sampling",
    [dict(temperature=0.8, seed=5), dict(temperature=1.0, top_k=6, top_p=0.9, seed=[3, 4, 5, 6])],
    ids=["t0.8", "topk-topp"],
)
@pytest.mark.parametrize(
    "draft, options",
    [("perturbed", {}), ("perturbed", dict(sample=False)), ("small", {})],
    ids=["perturbed-rejection", "perturbed-exact", "small-rejection"],
)
@pytest.mark.parametrize("backend, dtype", grid("torch", "mlx"))
def test_seeded_sampling_gives_the_same_tokens_on_every_backend(
    world, backend, dtype, draft, options, sampling
):
    common = dict(
        max_new_tokens=NEW_TOKENS,
        stop_at_eos=False,
        **sampling,
        **options,
        **draft_options(world, draft),
    )
    expected = specdec.generate(world["target"], PROMPTS, backend="numpy", **common)
    actual = specdec.generate(world["target"], PROMPTS, backend=backend, dtype=dtype, **common)
    assert actual.tokens == expected.tokens, (
        f"{backend} {dtype} {draft} {options} {sampling}: differs from numpy"
    )
    if (
        draft == "perturbed"
    ):  # accepted paths of several lengths were compared (the small random model rarely agrees)
        assert expected.stats.accepted_tokens > len(PROMPTS), expected.stats


# ---------------------------------------------------------------------------------------------
# Exactness: one step enumerated, and end to end through generate()


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """A target and a draft model over a 3-token vocabulary (different random weights)."""
    root = tmp_path_factory.mktemp("tiny")
    shape = dict(
        vocab_size=3,
        hidden_size=16,
        num_layers=1,
        num_heads=2,
        num_kv_heads=1,
        tie_word_embeddings=False,
    )
    return make_random_model(root / "target", seed=4, **shape), make_random_model(
        root / "draft", seed=9, **shape
    )


# high temperatures: the random models' logits are decisive (their next-token mass is mostly on one
# token)
SAMPLINGS = {
    "t2.5": SamplingConfig(temperature=2.5),
    "t2-k2": SamplingConfig(temperature=2.0, top_k=2),
    "t4-p0.9": SamplingConfig(temperature=4.0, top_p=0.9),
}


@pytest.mark.parametrize("prompt, root", [([0, 1, 2], 1), ([2], 0)])
@pytest.mark.parametrize("draft_length", [1, 2, 3])
@pytest.mark.parametrize("sample", [True, False], ids=["sampled-rejection", "greedy-exact"])
@pytest.mark.parametrize("sampling", list(SAMPLINGS))
def test_one_step_emits_exactly_the_targets_distribution(
    tiny, sampling, sample, draft_length, prompt, root
):
    """Every chain the drafter can draw (each with its probability: the uniforms that select it),
    every branch of the verifier (enumerated), then the target's own conditionals: the distribution
    of the next draft_length + 1 tokens equals the target's joint to 1e-10."""
    config = SAMPLINGS[sampling]
    backend = NumpyBackend()
    target = load_target(tiny[0], slots=1, capacity=16)
    drafter = DraftModelDrafter(
        backend,
        target,
        load_target(tiny[1], slots=1, capacity=16),
        draft_length=draft_length,
        sample=sample,
    )
    joint = target_joint(load_target(tiny[0], slots=1, capacity=16), config)

    context = tuple(prompt) + (root,)
    target.admit(0, prompt)
    drafter.begin(0, np.array(prompt), None)

    def propose(uniforms):
        return drafter.propose(
            DraftContext(
                root_tokens=np.array([root]),
                hidden=np.zeros((1, 1)),
                sampling=config,
                num_generated=np.array([1]),
                uniforms=np.array(uniforms, dtype=np.float64).reshape(1, 1, draft_length),
                want_draft_probs=sample,
                history=(np.array(context),),
                slots=np.array([0]),
            )
        )

    def drafts(chosen, weight):
        """(draft, probability) of every chain the drafter can draw after choosing ``chosen``
        uniforms."""
        draft = propose(chosen + [0.5] * (draft_length - len(chosen)))
        if not sample or len(chosen) == draft_length:
            yield draft, weight
            return
        q = np.asarray(draft.draft_probs)[0, 0, len(chosen)]
        cdf = np.cumsum(q) / q.sum()
        for token in np.flatnonzero(q > 0):  # the middle of the token's interval of uniforms
            u = (cdf[token] + (cdf[token - 1] if token else 0.0)) / 2
            yield from (
                (d, w)
                for d, w in drafts(chosen + [u], weight * q[token] / q.sum())
                if d.beams[0, 0, len(chosen) + 1] == token
            )

    verifier = RejectionVerifier() if sample else ExactTreeVerifier()
    got: dict[tuple[int, ...], float] = {}
    chains = 0
    for draft, weight in drafts([], 1.0):
        chains += 1
        beams = np.asarray(draft.beams)
        assert (
            draft.sampled == sample
            and beams.shape == (1, 1, draft_length + 1)
            and beams[0, 0, 0] == root
        )
        tree = build_prefix_tree(beams)
        output = target.forward_tree(tree, np.array([0]))
        for (path, bonus), w in enumerate_outcomes(
            lambda c: verifier.verify_row(tree, draft, output, config, 0, c)
        ):
            emitted = tuple(int(tree.tokens[0, u]) for u in path[1:]) + (int(bonus),)
            for tail, tw in joint(context + emitted, draft_length + 1 - len(emitted)).items():
                got[emitted + tail] = got.get(emitted + tail, 0.0) + weight * w * tw
    expected = joint(context, draft_length + 1)
    error = max(abs(got.get(k, 0.0) - expected.get(k, 0.0)) for k in set(got) | set(expected))
    assert error < 1e-10, (
        f"{sampling} sample={sample} K={draft_length}: max error {error:.3g} over {chains} chains"
    )
    assert abs(sum(got.values()) - 1.0) < 1e-10
    if sample:
        assert chains > 1, "every chain the drafter can draw was enumerated"


V, NEW, ROWS = 4, 3, 3000
Z_ALPHA = 3.0902  # the standard normal's upper 1e-3 quantile


@pytest.mark.parametrize("sample", [True, False], ids=["sampled-rejection", "greedy-exact"])
def test_emitted_tokens_have_the_target_distribution(tmp_path, sample):
    """End to end through generate(): 3000 copies of one prompt, one random stream each, decode 3
    tokens with a draft model at temperature 2.5; a fixed-seed chi-square test against the exact
    joint (cells expected below 5 pooled; the statistic stays below the 1e-3 quantile), as in
    tests/core/test_sampling_end_to_end.py."""
    shape = dict(vocab_size=V, hidden_size=16, num_layers=1, num_heads=2, num_kv_heads=1)
    model = make_random_model(tmp_path / "target", seed=4, **shape)
    draft = make_random_model(tmp_path / "draft", seed=6, **shape)
    sampling, prompt = SamplingConfig(temperature=2.5), [1, 2, 3, 1, 2]
    fresh = load_target(model, slots=1, capacity=16)
    joint = {}
    for cell in itertools.product(range(V), repeat=NEW):
        p = 1.0
        for i in range(NEW):
            p *= float(
                target_probs(np.asarray(fresh.admit(0, prompt + list(cell[:i])).logits), sampling)[
                    cell[i]
                ]
            )
            fresh.release(0)
        joint[cell] = p
    result = specdec.generate(
        model,
        [prompt] * ROWS,
        drafter="draft_model",
        draft_model=draft,
        draft_length=2,
        sample=sample,
        backend="numpy",
        max_new_tokens=NEW,
        temperature=sampling.temperature,
        seed=5,
        stop_at_eos=False,
    )
    counts: dict[tuple, int] = {}
    for row in result.tokens:
        counts[tuple(row)] = counts.get(tuple(row), 0) + 1
    big = [cell for cell, p in joint.items() if p * ROWS >= 5]
    small = [cell for cell in joint if cell not in big]
    observed = [counts.get(c, 0) for c in big] + [sum(counts.get(c, 0) for c in small)]
    expected = [joint[c] * ROWS for c in big] + [sum(joint[c] for c in small) * ROWS]
    statistic = sum((o - e) ** 2 / e for o, e in zip(observed, expected, strict=True) if e > 0)
    df = len(observed) - 1
    c = 2.0 / (9.0 * df)
    quantile = df * (1.0 - c + Z_ALPHA * c**0.5) ** 3  # Wilson-Hilferty
    assert df >= 10 and statistic < quantile, (
        f"sample={sample}: chi-square {statistic:.1f} >= {quantile:.1f} ({df} df)"
    )
    assert result.stats.accepted_tokens > ROWS // 4, result.stats


# ---------------------------------------------------------------------------------------------
# Requests over slots: determinism, the draft cache, the lifecycle


def plan_for(target, **options):
    return decoding_plan(target, "draft_model", **options)


def run(plan, schedule) -> dict[int, list[int]]:
    """``run_schedule``; afterwards no slot of the target or the draft model is held."""
    tokens = run_schedule(plan, schedule)
    drafter = plan.drafter
    assert (
        not plan.target.cache.admitted.any()
        and not drafter.draft.cache.admitted.any()
        and not drafter.open_slots
    )
    return tokens


SAMPLING_CHOICES = [
    SamplingConfig(),
    SamplingConfig(temperature=0.8),
    SamplingConfig(temperature=1.2, top_k=20),
]
requests = st.builds(
    lambda prompt, sampling, seed, new: specdec.Request(
        prompt=prompt, sampling=sampling, seed=seed, max_new_tokens=new
    ),
    st.one_of(
        st.lists(st.integers(0, 95), min_size=1, max_size=6),
        st.lists(st.integers(0, 95), min_size=1, max_size=3).map(lambda p: p * 3),
    ),
    st.sampled_from(SAMPLING_CHOICES),
    st.integers(0, 2**31),
    st.integers(1, 9),
)
schedules = st.lists(
    st.tuples(st.integers(0, 6), requests, st.one_of(st.none(), st.integers(0, 8))),
    min_size=1,
    max_size=5,
)


@pytest.mark.parametrize("sample", [True, False], ids=["sampled", "greedy-chain"])
@settings(max_examples=12, deadline=None)
@given(schedule=schedules, slots=st.integers(1, 3))
def test_a_request_decodes_the_same_whatever_shares_its_steps(world, sample, schedule, slots):
    """Greedy and seeded sampled requests arriving, finishing and cancelled at different steps: each
    one's tokens equal those it gets alone (the reference computes every row alone)."""
    options = dict(draft_model=world["perturbed"], draft_length=3, sample=sample)
    if sample:
        options["verifier"] = (
            None  # greedy requests: greedy; sampled ones: rejection (the default choice)
        )
    together = run(
        plan_for(load_target(world["target"], slots=slots, capacity=64), **options), schedule
    )
    alone_plan = plan_for(load_target(world["target"], slots=1, capacity=64), **options)
    for index, tokens in together.items():
        _, request, _ = schedule[index]
        assert tokens == run(alone_plan, [(0, request, None)])[0], (
            f"request {index} ({request}) with {slots} slot(s) differs from decoding it alone"
        )


@pytest.mark.parametrize("lookup", [False, True], ids=["alone", "with-lookup"])
def test_the_draft_cache_holds_exactly_the_committed_text(world, lookup):
    """Every chain the drafter proposes is the draft model's greedy continuation of the row's text,
    computed from scratch: its cache follows every step, whether the target accepted none, part or
    all of the chain, or (with a prompt-lookup beam beside it) tokens of another beam."""
    target = load_target(world["target"], slots=2, capacity=96)
    plan, *_ = prepare(
        target,
        [1],
        "draft_model",
        "numpy",
        max_new_tokens=8,
        temperature=0.0,
        top_k=None,
        top_p=None,
        dtype=None,
        device=None,
        registry=None,
        options=dict(draft_model=world["perturbed"], draft_length=3, sample=False, lookup=lookup),
    )
    inner = plan.drafter.inner if lookup else plan.drafter
    fresh = load_target(world["perturbed"], slots=1, capacity=96)
    propose, observe = inner.propose, inner.observe
    seen = {"proposals": 0, "off_chain": 0, "chains": None}

    def checked_propose(context):
        draft = propose(context)
        for b, text in enumerate(context.history):
            text, chain = list(text), []
            for _ in range(inner.draft_length):
                chain.append(int(np.argmax(fresh.admit(0, text + chain).logits)))
                fresh.release(0)
            assert np.asarray(draft.beams)[b, 0, 1:].tolist() == chain, (
                f"row {b}: the draft cache drifted"
            )
        seen["proposals"] += 1
        seen["chains"] = np.asarray(draft.beams)[:, 0]
        return draft

    def counted_observe(accepted):
        for b, n in enumerate(accepted.num_accepted.tolist()):
            seen["off_chain"] += (
                accepted.tokens[b, 1 : n + 1].tolist() != seen["chains"][b, 1 : n + 1].tolist()
            )
        observe(accepted)

    inner.propose, inner.observe = checked_propose, counted_observe
    looping = [[5, 9, 14, 5, 9, 14, 5, 9], [30, 31, 32, 33, 30, 31, 32, 33, 30]]
    tokens = [[] for _ in looping]
    for step in decode_steps(plan, looping):
        for row, new in enumerate(step.new_tokens):
            tokens[row].extend(new)
    plain = specdec.generate(
        world["target"], looping, drafter="none", backend="numpy", max_new_tokens=8
    )
    assert tokens == plain.tokens and seen["proposals"] > 2
    assert (seen["off_chain"] > 0) == lookup, (
        seen
    )  # the lookup beam's tokens were accepted past the chain
    assert not inner.open_slots and not inner.draft.cache.admitted.any()


def test_each_step_runs_k_draft_forwards_the_first_with_the_accepted_tokens(world):
    """Forward 1 of a step runs the tokens accepted in the previous step and the root (and commits
    them); forwards 2..K run the chain drafted so far after them."""
    k = 3
    target = load_target(world["target"], slots=1, capacity=96)
    plan, *_ = prepare(
        target,
        [1],
        "draft_model",
        "numpy",
        max_new_tokens=12,
        temperature=0.0,
        top_k=None,
        top_p=None,
        dtype=None,
        device=None,
        registry=None,
        options=dict(draft_model=world["target"], draft_length=k),
    )
    drafter, sizes = plan.drafter, []
    forward = drafter.draft.forward_tree

    def counted(tree, slots, **kw):  # the draft model's admit runs prompt chunks: no tree
        if tree is not None:
            sizes.append(tree.size)
        return forward(tree, slots, **kw)

    drafter.draft.forward_tree = counted
    steps = [s for s in decode_steps(plan, [[1, 2, 3]]) if not s.is_prefill]
    # the draft is the target: every drafted token is accepted, so forward 1 runs K tokens and the
    # root
    assert sizes == [1, 1, 2] + [k + 1, 1, 2] * (len(steps) - 1), sizes


# ---------------------------------------------------------------------------------------------
# Errors, options and the drafter folder


def test_a_draft_model_with_another_vocabulary_size_is_refused_naming_both(world, tmp_path):
    other = make_random_model(
        tmp_path / "other-vocab",
        vocab_size=80,
        hidden_size=16,
        num_layers=1,
        num_heads=2,
        num_kv_heads=1,
        seed=3,
        with_tokenizer=True,
    )
    with pytest.raises(specdec.InvalidInputError, match="tokenizers must match") as error:
        specdec.generate(
            world["target"],
            [1, 2],
            drafter="draft_model",
            draft_model=other,
            backend="numpy",
            max_new_tokens=4,
        )
    assert (
        str(other) in str(error.value) and "target" in str(error.value) and "80" in str(error.value)
    )


def test_a_draft_model_with_another_tokenizer_is_refused_naming_both(world, tmp_path):
    other = make_random_model(
        tmp_path / "other-tokenizer",
        vocab_size=96,
        hidden_size=16,
        num_layers=1,
        num_heads=2,
        num_kv_heads=1,
        seed=3,
        with_tokenizer=True,
    )
    data = json.loads((other / "tokenizer.json").read_text())
    vocab = data["model"]["vocab"]
    first, second = [w for w, i in vocab.items() if i in (5, 6)]
    vocab[first], vocab[second] = (
        vocab[second],
        vocab[first],
    )  # two tokens swap ids: same size, other tokenizer
    (other / "tokenizer.json").write_text(json.dumps(data))
    for backend in ("numpy", *(b for b in ("torch", "mlx") if installed(b))):
        with pytest.raises(specdec.InvalidInputError, match="tokenizers must match") as error:
            specdec.generate(
                world["target"],
                [1, 2],
                drafter="draft_model",
                draft_model=other,
                backend=backend,
                dtype=None if backend == "numpy" else "float32",
                max_new_tokens=4,
            )
        message = str(error.value)
        assert (
            str(other) in message
            and f"the target {world['target'].name}" in message
            and "tokenizer" in message
        )


def test_options_are_checked_before_anything_is_decoded(world):
    target = specdec.load(world["target"], backend="numpy")
    common = dict(backend="numpy", max_new_tokens=4)
    with pytest.raises(specdec.InvalidInputError, match="needs a draft model: pass draft_model="):
        specdec.generate(target, [1, 2], drafter="draft_model", **common)
    for bad in (0, -1, True, "4", 2.5):
        with pytest.raises(specdec.InvalidInputError, match="draft_length must be an integer >= 1"):
            specdec.generate(
                target,
                [1, 2],
                drafter="draft_model",
                draft_model=world["target"],
                draft_length=bad,
                **common,
            )
    with pytest.raises(specdec.InvalidInputError, match="does not take option"):
        specdec.generate(
            target,
            [1, 2],
            drafter="draft_model",
            draft_model=world["target"],
            beam_width=2,
            **common,
        )
    with pytest.raises(specdec.InvalidInputError, match="model folder .* does not exist"):
        specdec.generate(
            target,
            [1, 2],
            drafter="draft_model",
            draft_model=str(world["root"] / "nothing"),
            **common,
        )
    with pytest.raises(
        specdec.InvalidInputError, match="lookup cannot join a drafter that samples"
    ):
        specdec.generate(
            target,
            [1, 2],
            drafter="draft_model",
            draft_model=world["target"],
            lookup=True,
            **common,
        )
    assert specdec.generate(
        target,
        [1, 2],
        drafter="draft_model",
        draft_model=world["target"],
        lookup=True,
        sample=False,
        **common,
    ).tokens


def test_a_chain_beyond_the_shared_capacity_is_refused_before_any_step(world):
    target = load_target(world["target"], slots=1, capacity=16)
    with pytest.raises(
        specdec.InvalidInputError, match="trees of up to 13 nodes, more than the 8 positions"
    ):
        specdec.generate(
            target,
            [1, 2, 3, 4, 5],
            drafter="draft_model",
            draft_model=world["target"],
            draft_length=12,
            backend="numpy",
            max_new_tokens=4,
            stop_at_eos=False,
        )
    fits = specdec.generate(
        target,
        [1, 2, 3],
        drafter="draft_model",
        draft_model=world["target"],
        draft_length=4,
        backend="numpy",
        max_new_tokens=6,
        stop_at_eos=False,
    )
    assert len(fits.tokens) == 6


def test_a_drafter_folder_names_its_draft_model_and_draft_length(world, tmp_path):
    folder = world["small"]
    config = json.loads((folder / "config.json").read_text())
    assert config == {
        "model_type": "specdec_draft_model",
        "draft_model": "model",
        "draft_length": 4,
    }
    steps = [
        s
        for s in specdec.stream(
            world["target"], [1, 2, 3], drafter=folder, backend="numpy", max_new_tokens=8
        )
        if not s.is_prefill
    ]
    assert steps[0].num_verified[0] == 5, (
        "draft_length 4 from the folder: root and 4 drafted tokens"
    )
    steps = [
        s
        for s in specdec.stream(
            world["target"],
            [1, 2, 3],
            drafter=folder,
            backend="numpy",
            max_new_tokens=8,
            draft_length=2,
        )
        if not s.is_prefill
    ]
    assert steps[0].num_verified[0] == 3, "an explicit draft_length wins over the folder's"
    moved = shutil.copytree(
        folder, tmp_path / "moved"
    )  # a relative draft model moves with its folder
    assert (
        specdec.generate(
            world["target"], [1, 2, 3], drafter=moved, backend="numpy", max_new_tokens=8
        ).tokens
        == specdec.generate(
            world["target"], [1, 2, 3], drafter="none", backend="numpy", max_new_tokens=8
        ).tokens
    )
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "config.json").write_text(
        json.dumps({"model_type": "specdec_draft_model"})
    )
    with pytest.raises(specdec.InvalidInputError, match="names no draft model"):
        specdec.generate(
            world["target"], [1], drafter=tmp_path / "empty", backend="numpy", max_new_tokens=2
        )


def test_the_conformance_kit_passes_it_on_every_installed_backend(world):
    backends = ["numpy", *(b for b in ("torch", "mlx") if installed(b))]
    checks.check_drafter(world["small"], world["target"], backends=backends, max_new_tokens=12)
    checks.check_drafter(
        "draft_model",
        world["target"],
        backends=backends,
        max_new_tokens=12,
        draft_model=world["perturbed"],
        draft_length=3,
    )


def test_bench_methods_take_the_draft_model_and_length(world, tmp_path):
    from specdec.bench import load_prompt_set, parse_method, run_bench
    from specdec.bench.report import summarize

    method = parse_method(f"draft_model:draft={world['perturbed']},k=3")
    assert method.kind == "draft_model" and method.options == {
        "draft_model": str(world["perturbed"]),
        "draft_length": 3,
    }
    records = run_bench(
        world["target"],
        load_prompt_set("mt-bench", per_category=1)[:2],
        [parse_method("plain"), method],
        grid=[("numpy", None)],
        max_new_tokens=8,
        repeats=1,
        progress=False,
    )
    rows = [r for r in summarize(records) if r["category"] == "all" and r["method"] != "plain"]
    assert rows and all(r["identical"] == 1.0 and r["tokens_per_step"] > 1.0 for r in rows), rows
