"""ReDrafter NumPy reference: recurrence variants, heads, beam search, sampled chains,
checkpoints."""

from __future__ import annotations

import functools
import itertools
import json
import math

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from safetensors.numpy import save_file

from specdec.models.checkpoints import check_compatible
from specdec.errors import IncompatibleDrafterError
from specdec.protocols import Drafter
from specdec.reference.sampling import sample_from, target_probs
from specdec.types import DraftContext, SamplingConfig
from specdec_redrafter.checkpoint import (
    load_redrafter_checkpoint,
    make_random_redrafter,
    random_redrafter_weights,
    save_redrafter,
)
from specdec_redrafter.config import RedrafterConfig, check_weights
from specdec_redrafter.reference import (
    RedrafterDrafter,
    beam_search,
    draft_log_probs,
    drafter_logits,
    rnn_step,
)

VARIANTS = [
    dict(rnn_variant="apple"),
    dict(rnn_variant="trtllm"),
    dict(rnn_variant="paper"),
    dict(rnn=False),
]


def tiny(seed: int, *, vocab_size=5, hidden_size=3, **overrides):
    """A random drafter from plain arrays: (config, weights, embed_tokens, lm_head)."""
    rng = np.random.default_rng(seed)
    config = RedrafterConfig(vocab_size=vocab_size, hidden_size=hidden_size, **overrides)
    weights = random_redrafter_weights(config, rng)
    embed_tokens = rng.normal(size=(vocab_size, hidden_size))
    lm_head = rng.normal(size=(vocab_size, hidden_size))
    return config, weights, embed_tokens, lm_head


def walk(config, weights, embed_tokens, lm_head, hidden, beam):
    """Per-position drafter log-probs along one beam (L,) -> (L-1, V), one token at a time."""
    state, rows = np.zeros(config.hidden_size), []
    for t in range(1, len(beam)):
        state = rnn_step(config, weights, state, embed_tokens[beam[t - 1]], first=t == 1)
        logits = drafter_logits(config, weights, hidden, state, lm_head=lm_head)
        rows.append(logits - np.log(np.sum(np.exp(logits - logits.max()))) - logits.max())
    return np.array(rows)


def search(config, weights, embed_tokens, lm_head, hidden, roots, width, length):
    return beam_search(
        config,
        weights,
        hidden,
        np.array(roots),
        embed_tokens=embed_tokens,
        lm_head=lm_head,
        beam_width=width,
        beam_length=length,
    )


def sigmoid(x):
    return 1.0 / (1.0 + math.exp(-x))


@pytest.mark.parametrize("variant", ["apple", "trtllm", "paper", "sum"])
def test_rnn_variants_match_hand_formulas(variant):
    rnn = dict(rnn=False) if variant == "sum" else dict(rnn_variant=variant)
    config = RedrafterConfig(vocab_size=4, hidden_size=2, **rnn)
    weights = {
        "rnn_w.weight": np.array([[1.0, 2.0], [0.0, -1.0]]),
        "rnn_u.weight": np.array([[0.5, 0.0], [1.0, 1.0]]),
        "rnn_u.bias": np.array([0.1, -0.2]),
    }
    e1, e2 = np.array([1.0, -1.0]), np.array([0.0, 2.0])
    silu = lambda x: x * sigmoid(x)  # noqa: E731
    # W e1 = (-1, 1), W e2 = (4, -2); U s = (0.5 s0, s0 + s1).
    if variant == "apple":
        s1 = [silu(-1 + 0.1), silu(1 - 0.2)]
        s2 = [silu(4 + 0.5 * s1[0] + 0.1), silu(-2 + s1[0] + s1[1] - 0.2)]
    elif variant == "trtllm":
        s1 = [-1.0, 1.0]
        s2 = [4 + 0.5 * s1[0] + 0.1, -2 + s1[0] + s1[1] - 0.2]
    elif variant == "paper":
        s1 = [1.0, -1.0]
        s2 = [silu(4 + 0.5 * s1[0] + 0.1), silu(-2 + s1[0] + s1[1] - 0.2)]
    else:
        s1, s2 = [1.0, -1.0], [1.0, 1.0]
    got1 = rnn_step(
        config, weights, np.full(2, 9.0), e1, first=True
    )  # the state is ignored at t = 1
    got2 = rnn_step(config, weights, got1, e2, first=False)
    np.testing.assert_allclose(got1, s1, rtol=0, atol=1e-15, err_msg=f"rnn_step({variant}) s_1")
    np.testing.assert_allclose(got2, s2, rtol=0, atol=1e-15, err_msg=f"rnn_step({variant}) s_2")


def test_drafter_logits_hand_formula_with_input_proj():
    config = RedrafterConfig(vocab_size=2, hidden_size=1, exit_dim=1, num_draft_layers=1, rnn=False)
    weights = {
        "input_proj.weight": np.array([[2.0, -1.0]]),
        "input_proj.bias": np.array([0.5]),
        "lm_head.0.linear.weight": np.array([[3.0]]),
        "lm_head.0.linear.bias": np.array([-1.0]),
        "lm_head.1.weight": np.array([[1.0], [-2.0]]),
    }
    h, s = 1.0, 0.25
    x = 2.0 * h - 1.0 * s + 0.5  # input_proj([h ; s])
    x = x + (3.0 * x - 1.0) * sigmoid(3.0 * x - 1.0)  # residual SiLU block
    got = drafter_logits(config, weights, np.array([h]), np.array([s]))
    np.testing.assert_allclose(
        got, [x, -2.0 * x], rtol=1e-15, err_msg="drafter_logits(exit_dim=1, one block)"
    )


@pytest.mark.parametrize("overrides", VARIANTS)
def test_tied_head_equals_full_head_with_the_product_matrix(overrides):
    config, weights, embed_tokens, lm_head = tiny(3, head="tied", **overrides)
    full_config = RedrafterConfig(vocab_size=5, hidden_size=3, head="full", **overrides)
    full = {k: v for k, v in weights.items() if k != "head_proj.weight"}
    full["lm_head.1.weight"] = lm_head @ weights["head_proj.weight"]  # (V, H) @ (H, E)
    hidden, state = (
        np.random.default_rng(0).normal(size=(2, 3)),
        np.random.default_rng(1).normal(size=(2, 3)),
    )
    np.testing.assert_allclose(
        drafter_logits(config, weights, hidden, state, lm_head=lm_head),
        drafter_logits(full_config, full, hidden, state),
        rtol=1e-12,
        err_msg=f"tied vs full head, {overrides}",
    )
    with pytest.raises(ValueError, match="needs the target's lm_head"):
        drafter_logits(config, weights, hidden, state)


@settings(derandomize=True, deadline=None, max_examples=12)
@given(
    seed=st.integers(0, 10_000),
    variant=st.sampled_from(VARIANTS),
    head=st.sampled_from(["full", "tied"]),
)
def test_beam_width_one_is_the_greedy_chain(seed, variant, head):
    config, weights, embed_tokens, lm_head = tiny(seed, head=head, **variant)
    hidden = np.random.default_rng(seed + 1).normal(size=(1, 3))
    chain = [2]
    for _ in range(4):
        log_probs = walk(config, weights, embed_tokens, lm_head, hidden[0], chain + [0])[-1]
        top2 = np.sort(log_probs)[-2:]
        assume(top2[1] - top2[0] > 1e-6)
        chain.append(int(np.argmax(log_probs)))
    result = search(config, weights, embed_tokens, lm_head, hidden, [2], 1, 5)
    assert result.beams[0, 0].tolist() == chain, (
        f"beam_search(W=1, seed={seed}, {variant}, {head}) != greedy chain"
    )


@settings(derandomize=True, deadline=None, max_examples=10)
@given(seed=st.integers(0, 10_000), variant=st.sampled_from(VARIANTS))
def test_beams_are_sorted_by_recomputed_joint_log_prob(seed, variant):
    config, weights, embed_tokens, lm_head = tiny(seed, **variant)
    hidden = np.random.default_rng(seed + 1).normal(size=(2, 3))
    roots = np.array([1, 4])
    result = search(config, weights, embed_tokens, lm_head, hidden, roots, 4, 4)
    assert result.beams.shape == (2, 4, 4) and result.log_probs.shape == (2, 4, 3, 5)
    for b in range(2):
        assert np.all(result.beams[b, :, 0] == roots[b]), (
            "beam_search: beams must start with the root"
        )
        assert len({tuple(beam) for beam in result.beams[b].tolist()}) == 4, (
            f"beam_search(seed={seed}) duplicate beams"
        )
        assert np.all(np.diff(result.scores[b]) <= 0), (
            f"beam_search(seed={seed}, {variant}) scores not descending"
        )
        for i in range(4):
            beam = result.beams[b, i]
            log_probs = walk(config, weights, embed_tokens, lm_head, hidden[b], beam)  # (L-1, V)
            score = sum(log_probs[k, beam[k + 1]] for k in range(3))
            where = f"beam_search(seed={seed}, {variant}) b={b} i={i}"
            np.testing.assert_allclose(
                result.scores[b, i], score, rtol=1e-12, err_msg=f"{where}: score"
            )
            np.testing.assert_allclose(
                result.log_probs[b, i],
                log_probs,
                rtol=1e-12,
                atol=1e-12,
                err_msg=f"{where}: log_probs",
            )


@settings(derandomize=True, deadline=None, max_examples=12)
@given(
    seed=st.integers(0, 10_000),
    shape=st.sampled_from([(3, 3, 9), (2, 4, 8), (3, 2, 3), (4, 2, 2), (2, 3, 3), (3, 3, 4)]),
)
def test_wide_beam_search_is_brute_force_top_w(seed, shape):
    """W >= V**(L-1) keeps every sequence; W >= V**(L-2) already keeps every prefix until the last
    step."""
    vocab, length, width = shape
    assert width >= vocab ** (length - 2)
    config, weights, embed_tokens, lm_head = tiny(seed, vocab_size=vocab)
    hidden = np.random.default_rng(seed + 1).normal(size=(1, 3))
    scored = []
    for drafted in itertools.product(range(vocab), repeat=length - 1):
        beam = [0, *drafted]
        log_probs = walk(config, weights, embed_tokens, lm_head, hidden[0], beam)
        scored.append((sum(log_probs[k, beam[k + 1]] for k in range(length - 1)), beam))
    scores = sorted(s for s, _ in scored)
    assume(min(np.diff(scores)) > 1e-9)
    scored.sort(key=lambda item: -item[0])
    result = search(config, weights, embed_tokens, None, hidden, [0], width, length)
    expected = [beam for _, beam in scored[:width]]
    assert result.beams[0].tolist() == expected, (
        f"beam_search(seed={seed}, V, L, W = {shape}) != brute-force top-W"
    )
    np.testing.assert_allclose(
        result.scores[0], [s for s, _ in scored[:width]], rtol=1e-12, err_msg="brute-force scores"
    )


def test_draft_top_k_warp_keeps_k_tokens():
    log_probs = draft_log_probs(np.array([[1.0, 3.0, 3.0, 0.5]]), top_k=2)
    assert np.isfinite(log_probs).tolist() == [[False, True, True, False]], (
        "draft_log_probs(top_k=2)"
    )
    np.testing.assert_allclose(
        np.exp(log_probs).sum(), 1.0, err_msg="draft_log_probs(top_k=2) normalised"
    )
    config, weights, embed_tokens, lm_head = tiny(5, draft_top_k=2)
    result = search(config, weights, embed_tokens, None, np.ones((1, 3)), [0], 2, 3)
    assert np.all(np.isfinite(result.log_probs).sum(axis=-1) == 2), (
        "beam_search(draft_top_k=2) history"
    )
    assert np.all(np.isfinite(result.scores)), "beam_search(draft_top_k=2) beams use kept tokens"


def test_drafter_propose_beam_search_and_draft_probs():
    config, weights, embed_tokens, lm_head = tiny(7, head="tied")
    drafter = RedrafterDrafter(
        config, weights, embed_tokens=embed_tokens, lm_head=lm_head, beam_width=3, beam_length=3
    )
    assert isinstance(drafter, Drafter)
    assert drafter.caps.sample_shape is None, "a beam-search drafter needs no uniforms"
    hidden = np.random.default_rng(2).normal(size=(2, 3))
    context = DraftContext(root_tokens=np.array([0, 3]), hidden=hidden, want_draft_probs=True)
    draft = drafter.propose(context)
    expected = search(config, weights, embed_tokens, lm_head, hidden, [0, 3], 3, 3)
    assert draft.beams.tolist() == expected.beams.tolist(), "RedrafterDrafter.propose beams"
    assert draft.beams.dtype == np.int64, "RedrafterDrafter.propose beams dtype"
    assert draft.draft_probs.shape == (2, 3, 2, 5) and not draft.sampled
    np.testing.assert_allclose(
        draft.draft_probs, np.exp(expected.log_probs), err_msg="propose draft_probs"
    )
    np.testing.assert_allclose(
        draft.draft_probs.sum(axis=-1), 1.0, err_msg="propose draft_probs normalised"
    )
    no_probs = drafter.propose(DraftContext(root_tokens=np.array([0, 3]), hidden=hidden))
    assert no_probs.draft_probs is None, "propose without want_draft_probs"
    with pytest.raises(ValueError, match="context.hidden has shape"):
        drafter.propose(DraftContext(root_tokens=np.array([0]), hidden=hidden))


def test_sampled_chains_draw_sample_from_the_processed_distribution():
    config, weights, embed_tokens, lm_head = tiny(11, rnn_variant="paper")
    drafter = RedrafterDrafter(
        config,
        weights,
        embed_tokens=embed_tokens,
        lm_head=lm_head,
        beam_width=3,
        beam_length=4,
        sample=True,
    )
    sampling = SamplingConfig(temperature=0.7, top_k=4, top_p=0.9)
    rng = np.random.default_rng(3)
    hidden, uniforms = rng.normal(size=(2, 3)), rng.random((2, 3, 4))
    draft = drafter.propose(
        DraftContext(
            root_tokens=np.array([1, 2]), hidden=hidden, sampling=sampling, uniforms=uniforms
        )
    )
    assert draft.sampled and draft.draft_probs.shape == (2, 3, 3, 5), (
        "sampled propose flags and shapes"
    )
    assert drafter.caps.sample_shape == (3, 4), (
        "RedrafterDrafter.caps.sample_shape is (W, L) when sampling"
    )
    for b, i in itertools.product(range(2), range(3)):
        state, chain = np.zeros(3), [int([1, 2][b])]
        for k in range(1, 4):
            state = rnn_step(config, weights, state, embed_tokens[chain[-1]], first=k == 1)
            probs = target_probs(drafter_logits(config, weights, hidden[b], state), sampling)
            np.testing.assert_allclose(
                draft.draft_probs[b, i, k - 1],
                probs,
                rtol=1e-12,
                err_msg=f"sampled draft_probs b={b} i={i} k={k}",
            )
            chain.append(int(sample_from(probs, uniforms[b, i, k])))
        assert draft.beams[b, i].tolist() == chain, (
            f"sampled chain b={b} i={i} with uniforms {uniforms[b, i]}"
        )
    greedy = drafter.propose(DraftContext(root_tokens=np.array([1, 2]), hidden=hidden))
    expected = search(config, weights, embed_tokens, lm_head, hidden, [1, 2], 3, 4)
    assert not greedy.sampled, "sample=True with a greedy context must not sample"
    assert greedy.beams.tolist() == expected.beams.tolist(), (
        "sample=True falls back to beam search when greedy"
    )
    with pytest.raises(ValueError, match="needs context.uniforms"):
        drafter.propose(
            DraftContext(root_tokens=np.array([1, 2]), hidden=hidden, sampling=sampling)
        )


def test_drafter_construction_errors():
    config, weights, embed_tokens, lm_head = tiny(1, head="tied")
    with pytest.raises(ValueError, match="exceeds the 5\\*\\*1 distinct drafts"):
        RedrafterDrafter(
            config, weights, embed_tokens=embed_tokens, lm_head=lm_head, beam_width=6, beam_length=2
        )
    # W > V is fine as long as W <= V**(L-1).
    RedrafterDrafter(
        config, weights, embed_tokens=embed_tokens, lm_head=lm_head, beam_width=6, beam_length=3
    )
    with pytest.raises(ValueError, match="needs the target's lm_head"):
        RedrafterDrafter(config, weights, embed_tokens=embed_tokens)
    with pytest.raises(ValueError, match="embed_tokens has shape"):
        RedrafterDrafter(config, weights, embed_tokens=embed_tokens.T, lm_head=lm_head)
    with pytest.raises(ValueError, match="missing \\['head_proj.weight'\\]"):
        check_weights(config, {k: v for k, v in weights.items() if k != "head_proj.weight"})


def test_config_validation_and_json_round_trip():
    config = RedrafterConfig(
        vocab_size=10, hidden_size=4, exit_dim=6, head="tied", draft_top_k=3, target={"name": "m"}
    )
    assert config.to_dict()["model_type"] == "specdec_redrafter"
    assert RedrafterConfig.from_dict(json.loads(json.dumps(config.to_dict()))) == config, (
        "RedrafterConfig JSON round trip"
    )
    assert RedrafterConfig(vocab_size=10, hidden_size=4).exit_dim == 8, "exit_dim defaults to 2H"
    assert "input_proj.weight" in config.weight_shapes(), "exit_dim != 2H needs input_proj"
    assert (
        "input_proj.weight" not in RedrafterConfig(vocab_size=10, hidden_size=4).weight_shapes()
    ), "no input_proj at 2H"
    for bad, message in [
        (dict(rnn_variant="gru"), "rnn_variant must be one of"),
        (dict(head="shared"), "head must be one of"),
        (dict(beam_length=1), "beam_length must be an integer >= 2"),
        (dict(model_type="medusa"), "not a ReDrafter config"),
    ]:
        with pytest.raises(ValueError, match=message):
            RedrafterConfig(vocab_size=10, hidden_size=4, **bad)
    with pytest.raises(ValueError, match="unknown ReDrafter config keys \\['beams'\\]"):
        RedrafterConfig.from_dict({"vocab_size": 10, "hidden_size": 4, "beams": 3})


def test_checkpoint_round_trip(tmp_path):
    target = {"name": "tiny", "vocab_size": 5, "hidden_size": 3}
    config, weights, _, _ = tiny(2, exit_dim=4, num_draft_layers=2, head="tied", target=target)
    folder = save_redrafter(tmp_path / "drafter", config, weights)
    assert (folder / "config.json").is_file() and (folder / "model.safetensors").is_file()
    loaded_config, loaded = load_redrafter_checkpoint(folder)
    assert loaded_config == config, "load_redrafter_checkpoint config"
    assert set(loaded) == set(weights), "load_redrafter_checkpoint names"
    for name, array in weights.items():
        assert loaded[name].dtype == np.float64
        np.testing.assert_array_equal(
            loaded[name],
            array.astype(np.float32),
            err_msg=f"round trip of {name} (float32 on disk)",
        )
    with pytest.raises(ValueError, match="not a ReDrafter checkpoint: config.json is missing"):
        load_redrafter_checkpoint(tmp_path)


def test_check_compatible_names_both_models():
    config = RedrafterConfig(
        vocab_size=5, hidden_size=3, target={"name": "tiny", "fingerprint": "abc"}
    )
    check = functools.partial(check_compatible, drafter="ReDrafter")
    check(
        config, vocab_size=5, hidden_size=3, fingerprint="abc", name="renamed"
    )  # fingerprint decides
    both = (
        r"ReDrafter drafter was trained for another model: 'tiny' \(vocab_size 5, hidden_size 3\), "
        r"but the target is 'big' \(vocab_size 7"
    )
    with pytest.raises(IncompatibleDrafterError, match=both):
        check(config, vocab_size=7, hidden_size=3, name="big")
    with pytest.raises(IncompatibleDrafterError, match="fingerprint 'abc', the target's is 'xyz'"):
        check(config, vocab_size=5, hidden_size=3, fingerprint="xyz")
    check(config, vocab_size=5, hidden_size=3, name="other")  # a name alone only labels the model


def test_make_random_redrafter_has_decisive_logits(tmp_path):
    model = tmp_path / "tiny-llama"
    model.mkdir()
    (model / "config.json").write_text(
        json.dumps({"hidden_size": 16, "vocab_size": 64, "initializer_range": 0.02})
    )
    rng = np.random.default_rng(0)
    embed = rng.normal(0.0, 0.5, size=(64, 16)).astype(np.float32)
    save_file({"model.embed_tokens.weight": embed}, str(model / "model.safetensors"))
    folder = make_random_redrafter(tmp_path / "drafter", model, seed=4)
    config, weights = load_redrafter_checkpoint(folder)
    assert (
        config.head == "tied" and config.target["name"] == "tiny-llama" and config.hidden_size == 16
    )
    check_compatible(config, drafter="ReDrafter", vocab_size=64, hidden_size=16, name="tiny-llama")
    drafter = RedrafterDrafter(
        config, weights, embed_tokens=embed, lm_head=embed, beam_width=2, beam_length=3
    )
    hidden = rng.normal(size=(32, 16))
    state = rnn_step(
        config, drafter.weights, None, drafter.embed_tokens[rng.integers(0, 64, 32)], first=True
    )
    std = (
        drafter_logits(config, drafter.weights, hidden, state, lm_head=drafter.lm_head)
        .std(axis=-1)
        .mean()
    )
    assert 2.0 <= std <= 5.0, f"make_random_redrafter logits std {std:.2f} outside [2, 5]"
