"""EAGLE-3 NumPy reference: the layer against a hand formula, the draft vocabulary (d2t), the
request lifecycle (a cache built step by step equals one built at once), refusals, checkpoints,
and exact sampling over its dynamic tree (every branch enumerated)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from specdec.errors import InvalidInputError
from specdec.reference.model import rms_norm
from specdec.reference.tree import build_prefix_tree
from specdec.types import Accepted, DraftContext, PromptOutput
from specdec_eagle3.checkpoint import (
    d2t_from_ids,
    load_eagle3_checkpoint,
    make_random_eagle3,
    random_eagle3_weights,
    save_eagle3,
)
from specdec_eagle3.config import Eagle3Config, default_hidden_layers, draft_to_target
from specdec_eagle3.reference import (
    Eagle3Drafter,
    draft_layer,
    draft_log_probs,
    dynamic_tree,
    features,
)

V, H, N = 40, 8, 24
LAYERS = (0, 2, 3)


def tiny(seed: int, **overrides):
    """(config, weights, embed_tokens) of a random drafter from plain arrays."""
    rng = np.random.default_rng(seed)
    fields = dict(
        vocab_size=V,
        hidden_size=H,
        draft_vocab_size=N,
        hidden_layers=LAYERS,
        num_heads=4,
        num_kv_heads=2,
        head_dim=2,
        intermediate_size=12,
    )
    fields.update(overrides)
    config = Eagle3Config(**fields)
    return config, random_eagle3_weights(config, rng), rng.normal(size=(V, H))


def layer_outputs(rng, shape) -> dict:
    return {i: rng.normal(size=(*shape, H)) for i in LAYERS}


def test_draft_layer_matches_hand_formula_with_one_head():
    """H = 2, one head of size 2, one entry at position 0 (no rotation): attention to itself
    returns its value, so h = g + o(v(y)) with y = [norm(embed) ; norm(g)], then the MLP."""
    config = Eagle3Config(
        vocab_size=3,
        hidden_size=2,
        draft_vocab_size=2,
        hidden_layers=(0, 0, 0),
        num_heads=1,
        num_kv_heads=1,
        head_dim=2,
        intermediate_size=1,
        rms_norm_eps=1e-12,
    )
    rng = np.random.default_rng(0)
    weights = random_eagle3_weights(config, rng, ids=[0, 2])
    embed, g = rng.normal(size=(3, 2)), rng.normal(size=(1, 2))
    empty = np.zeros((1, 0, 2))
    out, _, _ = draft_layer(
        config,
        weights,
        embed,
        np.array([1]),
        g,
        np.array([0]),
        (empty, empty),
        np.ones((1, 0), dtype=bool),
        np.ones((1, 1), dtype=bool),
    )
    y = np.concatenate(
        [
            rms_norm(embed[1], weights["midlayer.input_layernorm.weight"], 1e-12),
            rms_norm(g[0], weights["midlayer.hidden_norm.weight"], 1e-12),
        ]
    )
    attn, mlp = "midlayer.self_attn.", "midlayer.mlp."

    def by_hand(residual):
        h = residual + weights[attn + "o_proj.weight"] @ (weights[attn + "v_proj.weight"] @ y)
        n = rms_norm(h, weights["midlayer.post_attention_layernorm.weight"], 1e-12)
        gate = weights[mlp + "gate_proj.weight"] @ n
        return h + weights[mlp + "down_proj.weight"] @ (
            gate / (1 + np.exp(-gate)) * (weights[mlp + "up_proj.weight"] @ n)
        )

    np.testing.assert_allclose(out[0], by_hand(g[0]), rtol=1e-12, atol=1e-12)
    # norm_before_residual (the speculators variant): the residual is the normed feature
    normed = Eagle3Config(**{**config.to_dict(), "norm_before_residual": True})
    out_normed, _, _ = draft_layer(
        normed,
        weights,
        embed,
        np.array([1]),
        g,
        np.array([0]),
        (empty, empty),
        np.ones((1, 0), dtype=bool),
        np.ones((1, 1), dtype=bool),
    )
    np.testing.assert_allclose(out_normed[0], by_hand(y[2:]), rtol=1e-12, atol=1e-12)
    assert not np.allclose(out_normed, out)


def test_features_fuse_the_three_layers_low_to_high():
    config, weights, _ = tiny(1)
    rng = np.random.default_rng(2)
    layers = layer_outputs(rng, (5,))
    got = features(config, weights, layers)
    expected = np.concatenate([layers[0], layers[2], layers[3]], axis=-1) @ weights["fc.weight"].T
    np.testing.assert_allclose(got, expected, rtol=1e-13)
    with pytest.raises(InvalidInputError, match=r"missing \[2\]"):
        features(config, weights, {0: layers[0], 3: layers[3]})


def test_default_layers_follow_the_engines_convention():
    """Output-of-layer (1, L//2 - 1, L - 4): the inputs of layers 2, L//2, L - 3 (vLLM's ids)."""
    assert default_hidden_layers(30) == (1, 14, 26)  # SmolLM2-135M; vLLM's (2, 15, 27)
    assert default_hidden_layers(32) == (1, 15, 28)  # Llama-3.1-8B; llama.cpp's [2, 16, 29]
    assert default_hidden_layers(2) == (0, 0, 1)


@given(seed=st.integers(0, 2**32 - 1), depth=st.integers(1, 4), top_k=st.integers(1, 4))
def test_tree_drafts_only_draft_vocabulary_tokens(seed, depth, top_k):
    """Every drafted token is a target id of the draft vocabulary, and the first level holds the
    top-k draft ids mapped through d2t."""
    config, weights, embed = tiny(seed % 1000)
    rng = np.random.default_rng(seed)
    drafter = Eagle3Drafter(
        config, weights, embed_tokens=embed, top_k=top_k, depth=depth, total_tokens=depth + 3
    )
    drafter.begin(
        0,
        rng.integers(0, V, 4),
        PromptOutput(logits=np.zeros(V), hidden=np.zeros((4, H)), layers=layer_outputs(rng, (4,))),
    )
    cache = drafter.slots[0]
    tree = dynamic_tree(
        config,
        drafter.weights,
        drafter.embed_tokens,
        cache,
        7,
        cache.pending,
        top_k=top_k,
        depth=depth,
        total_tokens=depth + 3,
    )
    ids = set(draft_to_target(weights["d2t"]).tolist())
    assert set(tree.tokens[1:].tolist()) <= ids
    first = np.argsort(
        -draft_log_probs(config, drafter.weights, _root_out(config, drafter, cache)), kind="stable"
    )
    level1 = tree.tokens[(tree.parents == 0)]
    np.testing.assert_array_equal(level1, draft_to_target(weights["d2t"])[first[:top_k]])


def _root_out(config, drafter, cache):
    out, _, _ = draft_layer(
        config,
        drafter.weights,
        drafter.embed_tokens,
        np.array([7]),
        cache.pending[None],
        np.array([cache.length]),
        (cache.keys, cache.values),
        np.ones((1, cache.length), dtype=bool),
        np.ones((1, 1), dtype=bool),
    )
    return out[0]


def test_cache_built_step_by_step_equals_one_built_at_once():
    config, weights, embed = tiny(3)
    rng = np.random.default_rng(4)
    tokens, layers = rng.integers(0, V, 9), layer_outputs(rng, (9,))
    whole = Eagle3Drafter(config, weights, embed_tokens=embed)
    whole.begin(0, tokens, PromptOutput(logits=np.zeros(V), hidden=np.zeros((9, H)), layers=layers))
    steps = Eagle3Drafter(config, weights, embed_tokens=embed)
    steps.begin(
        0,
        tokens[:4],
        PromptOutput(
            logits=np.zeros(V),
            hidden=np.zeros((4, H)),
            layers={i: a[:4] for i, a in layers.items()},
        ),
    )
    # one step commits the root tokens[4] and accepts tokens[5:9] (4 drafted)
    steps.observe(
        Accepted(
            slots=np.array([0]),
            tokens=tokens[None, 4:9],
            num_accepted=np.array([4]),
            bonus_tokens=np.array([0]),
            hidden=np.zeros((1, 5, H)),
            layers={i: a[None, 4:9] for i, a in layers.items()},
        )
    )
    a, b = whole.slots[0], steps.slots[0]
    assert a.length == b.length == 8
    np.testing.assert_allclose(b.keys, a.keys, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(b.pending, a.pending, rtol=1e-12, atol=1e-12)


def test_refusals_name_the_problem():
    config, weights, embed = tiny(5)
    with pytest.raises(ValueError, match="ascending target ids"):
        Eagle3Drafter(
            config, {**weights, "d2t": np.zeros(N, dtype=np.int64) + V}, embed_tokens=embed
        )
    with pytest.raises(ValueError, match="missing"):
        Eagle3Drafter(
            config, {k: v for k, v in weights.items() if k != "norm.weight"}, embed_tokens=embed
        )
    with pytest.raises(ValueError, match="embed_tokens has shape"):
        Eagle3Drafter(config, weights, embed_tokens=embed[:, :4])
    with pytest.raises(ValueError, match="three ascending"):
        Eagle3Config(**{**config.to_dict(), "hidden_layers": [3, 1, 2]})
    with pytest.raises(ValueError, match="exceeds"):
        Eagle3Config(**{**config.to_dict(), "draft_vocab_size": V + 1})
    drafter = Eagle3Drafter(config, weights, embed_tokens=embed)
    with pytest.raises(InvalidInputError, match="no request in slot 3"):
        drafter.propose(
            DraftContext(root_tokens=np.array([1]), hidden=np.zeros((1, H)), slots=np.array([3]))
        )


def test_checkpoint_round_trip_and_random_maker(tmp_path, model_dir):
    config, weights, _ = tiny(6)
    loaded_config, loaded = load_eagle3_checkpoint(
        save_eagle3(tmp_path / "c", config, weights, dtype=np.float64)
    )
    assert loaded_config == config and set(loaded) == set(weights)
    for name in weights:
        np.testing.assert_array_equal(loaded[name], weights[name])
    assert loaded["d2t"].dtype == np.int64
    np.testing.assert_array_equal(draft_to_target(d2t_from_ids([3, 5, 9])), [3, 5, 9])
    made, _ = load_eagle3_checkpoint(
        make_random_eagle3(tmp_path / "r", model_dir, seed=0, draft_vocab_size=50)
    )
    assert (made.hidden_size, made.draft_vocab_size, made.hidden_layers) == (32, 50, (0, 0, 1))
    with pytest.raises(ValueError, match="unknown EAGLE-3 config keys"):
        Eagle3Config.from_dict({**config.to_dict(), "beam_width": 2})


@pytest.mark.parametrize(
    "sampling",
    [dict(temperature=2.5), dict(temperature=2.0, top_k=3), dict(temperature=4.0, top_p=0.9)],
    ids=["t2.5", "t2-k3", "t4-p0.9"],
)
@pytest.mark.parametrize("prompt", [[0, 1, 2, 3], [4]])
def test_sampling_over_its_dynamic_tree_emits_exactly_the_targets_distribution(
    tmp_path, sampling, prompt
):
    """One step of EAGLE-3's tree under the exact verifier, every branch enumerated, then the
    target's own conditionals: the next depth + 1 tokens are distributed as the target's joint to
    1e-10, whatever the tree holds (a draft vocabulary smaller than the target's included)."""
    from specdec.generation.api import prepare
    from specdec.reference.model import load_target
    from specdec.reference.verify import ExactTreeVerifier
    from specdec.testing import make_random_drafter, make_random_model
    from specdec.testing.enumeration import enumerate_outcomes, target_joint
    from specdec.types import SamplingConfig

    model = make_random_model(
        tmp_path / "target",
        seed=4,
        vocab_size=5,
        hidden_size=16,
        num_layers=3,
        num_heads=2,
        num_kv_heads=1,
        tie_word_embeddings=False,
    )
    checkpoint = make_random_drafter(
        tmp_path / "eagle3", model, kind="eagle3", seed=2, draft_vocab_size=4
    )
    config = SamplingConfig(**sampling)
    depth = 2
    target = load_target(model, slots=1, capacity=16)
    plan, *_ = prepare(
        target,
        [1],
        str(checkpoint),
        "numpy",
        max_new_tokens=4,
        temperature=0.0,
        top_k=None,
        top_p=None,
        dtype=None,
        device=None,
        registry=None,
        options=dict(lookup=False, tree_top_k=2, depth=depth, total_tokens=4),
    )
    drafter, joint = plan.drafter, target_joint(load_target(model, slots=1, capacity=16), config)
    output = target.admit(0, prompt, layers=drafter.caps.hidden_layers)
    root = 1
    drafter.begin(0, np.array(prompt), output)
    draft = drafter.propose(
        DraftContext(
            root_tokens=np.array([root]),
            hidden=np.asarray(output.hidden)[-1:],
            sampling=config,
            num_generated=np.array([1]),
            slots=np.array([0]),
            history=(np.array(prompt + [root]),),
        )
    )
    tree = build_prefix_tree(np.asarray(draft.beams))
    assert int(tree.num_nodes[0]) > depth, "the dynamic tree branches"
    forward = target.forward_tree(tree, np.array([0]))
    context = tuple(prompt) + (root,)
    got: dict[tuple[int, ...], float] = {}
    verifier = ExactTreeVerifier()
    for (path, bonus), weight in enumerate_outcomes(
        lambda c: verifier.verify_row(tree, draft, forward, config, 0, c)
    ):
        emitted = tuple(int(tree.tokens[0, u]) for u in path[1:]) + (int(bonus),)
        for tail, tail_weight in joint(context + emitted, depth + 1 - len(emitted)).items():
            got[emitted + tail] = got.get(emitted + tail, 0.0) + weight * tail_weight
    expected = joint(context, depth + 1)
    error = max(abs(got.get(k, 0.0) - expected.get(k, 0.0)) for k in set(got) | set(expected))
    assert error < 1e-10 and abs(sum(got.values()) - 1.0) < 1e-10, f"max error {error:.3g}"
