"""EAGLE NumPy reference: the draft layer against hand formulas, the dynamic tree's rules (top-k
frontiers, the kept subtree, scores equal to a chain walk, beams with extended short leaves), the
request lifecycle (a cache built step by step equals one built at once), checkpoints."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from specdec.errors import InvalidInputError
from specdec.protocols import Drafter, RequestObserver
from specdec.reference.tree import build_prefix_tree
from specdec.types import Accepted, DraftContext, PromptOutput
from specdec_eagle.checkpoint import (
    load_eagle_checkpoint,
    make_random_eagle,
    random_eagle_weights,
    save_eagle,
)
from specdec_eagle.config import EagleConfig, check_weights
from specdec_eagle.reference import (
    EagleDrafter,
    SlotCache,
    draft_layer,
    draft_log_probs,
    dynamic_tree,
    fuse,
    run_entries,
    select_nodes,
    tree_beams,
)

V, H = 40, 8


def tiny(seed: int, **overrides):
    """(config, weights, embed_tokens, lm_head) of a random drafter from plain arrays."""
    rng = np.random.default_rng(seed)
    fields = dict(
        vocab_size=V, hidden_size=H, num_heads=4, num_kv_heads=2, head_dim=2, intermediate_size=12
    )
    fields.update(overrides)
    config = EagleConfig(**fields)
    embed, lm_head = rng.normal(size=(V, H)), rng.normal(0, 0.5, size=(V, H))
    return (
        config,
        random_eagle_weights(config, rng, embed_tokens=embed, lm_head=lm_head),
        embed,
        lm_head,
    )


def empty_cache(config, pending) -> SlotCache:
    empty = np.zeros((config.num_kv_heads, 0, config.head_dim))
    return SlotCache(keys=empty, values=empty.copy(), pending=pending)


def prompt_cache(config, weights, embed, rng, length: int) -> SlotCache:
    hidden = rng.normal(size=(length + 1, config.hidden_size))
    _, cache = run_entries(
        config,
        weights,
        embed,
        empty_cache(config, hidden[-1]),
        rng.integers(0, V, length),
        hidden[:-1],
    )
    return cache


def test_draft_layer_matches_hand_formula_with_one_head():
    """H = 2, one head of size 2, one entry at position 0 (no rotation): attention to itself
    returns its value, so out = x + o(v) and the MLP adds down(silu(gate n) * up n)."""
    config = EagleConfig(
        vocab_size=3,
        hidden_size=2,
        num_heads=1,
        num_kv_heads=1,
        head_dim=2,
        intermediate_size=1,
        rms_norm_eps=1e-12,
    )
    eye = np.eye(2)
    weights = {
        "fc.weight": np.array([[1.0, 0.0, 2.0, 0.0], [0.0, 1.0, 0.0, -1.0]]),
        "fc.bias": np.array([0.5, 0.0]),
        "layers.0.self_attn.q_proj.weight": eye,
        "layers.0.self_attn.k_proj.weight": eye,
        "layers.0.self_attn.v_proj.weight": np.array([[2.0, 0.0], [0.0, 3.0]]),
        "layers.0.self_attn.o_proj.weight": eye,
        "layers.0.post_attention_layernorm.weight": np.array([1.0, 2.0]),
        "layers.0.mlp.gate_proj.weight": np.array([[1.0, 1.0]]),
        "layers.0.mlp.up_proj.weight": np.array([[1.0, -1.0]]),
        "layers.0.mlp.down_proj.weight": np.array([[1.0], [0.5]]),
    }
    check_weights(config, weights)
    embed = np.array([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])
    x = fuse(config, weights, embed, np.array([2]), np.array([[0.25, 1.0]]))
    np.testing.assert_allclose(x, [[1.0 + 0.5 + 0.5, 1.0 - 1.0]])  # fc([1, 1, .25, 1]) + bias
    empty = np.zeros((1, 0, 2))
    out, k, v = draft_layer(
        config,
        weights,
        x,
        np.array([0]),
        (empty, empty),
        np.zeros((1, 0), bool),
        np.ones((1, 1), bool),
    )
    h = np.array([2.0 + 4.0, 0.0])  # x + o(v(x)) = (2, 0) + (4, 0)
    n = h / np.sqrt(np.mean(h**2)) * np.array([1.0, 2.0])
    gate = n[0] + n[1]
    mlp = gate / (1 + np.exp(-gate)) * (n[0] - n[1]) * np.array([1.0, 0.5])
    np.testing.assert_allclose(out[0], h + mlp, rtol=1e-12)
    np.testing.assert_allclose(k[:, 0], [[2.0, 0.0]])
    np.testing.assert_allclose(v[:, 0], [[4.0, 0.0]])


def test_tree_beams_worked_example():
    """The kept nodes of ``test_select_nodes_worked_example`` at budget 5: A, C, E, D' (depth 3).
    Leaves E (score -0.6) and D' (-2.5): beam 0 is root A C E; D' (level 2) continues along its
    top-1 child (token 20 + node), and copies of beam 0 fill W = 5."""
    #         root  A    B    C    D'   E    F
    tokens = [10, 11, 12, 13, 14, 15, 16]
    parents, levels = [-1, 0, 0, 1, 1, 3, 2], [0, 1, 1, 2, 2, 3, 2]
    scores = [0.0, -0.1, -2.0, -0.3, -2.5, -0.6, -2.2]

    def extend(node):
        tokens.append(20 + node)
        parents.append(node)
        levels.append(levels[node] + 1)
        scores.append(scores[node])
        return len(tokens) - 1

    beams = tree_beams(
        tokens, parents, levels, scores, np.array([1, 3, 4, 5]), depth=3, width=5, extend=extend
    )
    np.testing.assert_array_equal(
        beams, [[10, 11, 13, 15], [10, 11, 14, 24]] + [[10, 11, 13, 15]] * 3
    )
    tree = build_prefix_tree(beams[None])
    assert (
        int(tree.num_nodes[0]) == 1 + 4 + 1
    )  # root, the 4 kept nodes, 1 extension node: 5 drafted


def test_select_nodes_worked_example():
    """depth 3. Candidates in score order A (-0.1, level 1), C (-0.3, under A), E (-0.6, under C),
    B (-2.0, level 1), F (-2.2, under B), D' (-2.5, under A). Budget 5: A costs itself and two
    extension nodes (3); C and E replace A's and C's extension (0 each); B would cost 3 (skipped),
    so F has no parent; D' is a second child of A: itself and one extension node (2), 5 in all.
    Budget 6: B fits (3) and F replaces its extension (0), D' no longer fits."""
    #        root  A     B     C     D'    E     F
    scores = [0.0, -0.1, -2.0, -0.3, -2.5, -0.6, -2.2]
    parents = [-1, 0, 0, 1, 1, 3, 2]
    levels = [0, 1, 1, 2, 2, 3, 2]
    np.testing.assert_array_equal(
        select_nodes(scores, parents, levels, depth=3, budget=5), [1, 3, 4, 5]
    )
    np.testing.assert_array_equal(
        select_nodes(scores, parents, levels, depth=3, budget=6), [1, 2, 3, 5, 6]
    )
    np.testing.assert_array_equal(
        select_nodes(scores, parents, levels, depth=3, budget=3), [1, 3, 5]
    )


def chain_scores(config, weights, embed, lm_head, cache, root, feature, path_tokens):
    """Cumulative draft log-probs along a path, by running its entries as a plain chain (each
    entry's feature is the previous entry's output) on a copy of the cache."""
    out, cache = run_entries(config, weights, embed, cache, np.array([root]), feature[None])
    total, scores = 0.0, []
    for token in path_tokens:
        total += draft_log_probs(weights, lm_head, out[0])[token]
        scores.append(total)
        out, cache = run_entries(config, weights, embed, cache, np.array([token]), out)
    return scores


OPTIONS = st.tuples(st.integers(1, 4), st.integers(1, 4), st.integers(0, 16)).map(
    lambda o: (o[0], o[1], o[1] + o[2])
)  # top_k, depth, total_tokens >= depth


@given(
    seed=st.integers(0, 2**32 - 1),
    options=OPTIONS,
    length=st.integers(0, 6),
    shortlist=st.sampled_from([None, 12]),
)
def test_dynamic_tree_rules(seed, options, length, shortlist):
    top_k, depth, total = options
    config, weights, embed, lm_head = tiny(seed % 1000, shortlist_size=shortlist)
    rng = np.random.default_rng(seed)
    cache = prompt_cache(config, weights, embed, rng, length)
    root, feature = int(rng.integers(0, V)), rng.normal(size=H)
    tree = dynamic_tree(
        config,
        weights,
        embed,
        lm_head,
        cache,
        root,
        feature,
        top_k=top_k,
        depth=depth,
        total_tokens=total,
    )
    candidates = top_k + (depth - 1) * top_k * top_k
    assert len(tree.tokens) == 1 + candidates + len(tree.extension)
    # The kept set: a subtree of the root holding the best candidate; with its extensions, within
    # budget.
    kept = tree.selected.tolist()
    assert kept and kept[0] == 1 + int(np.argmax(tree.scores[1 : top_k + 1]))
    assert all(tree.parents[s] == 0 or tree.parents[s] in kept for s in kept)
    assert len(kept) + len(tree.extension) <= total
    # Scores are cumulative draft log-probs: a chain walk along each kept node's path agrees.
    for node in kept:
        path = []
        while node > 0:
            path.append(node)
            node = tree.parents[node]
        walked = chain_scores(
            config, weights, embed, lm_head, cache, root, feature, tree.tokens[path[::-1]]
        )
        np.testing.assert_allclose(walked, tree.scores[path[::-1]], rtol=1e-10, atol=1e-10)
    # Frontiers: level d's candidates are the children of the k best candidates of level d-1.
    for level in range(2, depth + 1):
        previous = [i for i in range(1, candidates + 1) if tree.depth[i] == level - 1]
        best = sorted(previous, key=lambda i: (-tree.scores[i], i))[:top_k]
        expanded = {
            int(tree.parents[i]) for i in range(1, candidates + 1) if tree.depth[i] == level
        }
        assert expanded == set(best)
    # In the draft (kept and extension nodes), a node's children are distinct drafted-vocabulary
    # tokens.
    allowed = (
        set(range(V)) if shortlist is None else set(np.asarray(weights["vocab_shortlist"]).tolist())
    )
    drafted = np.zeros(len(tree.tokens), dtype=bool)
    drafted[kept] = drafted[1 + candidates :] = True
    for node in range(len(tree.tokens)):
        children = tree.tokens[(tree.parents == node) & drafted]
        assert len(set(children.tolist())) == len(children) and set(children.tolist()) <= allowed
    # Beams: W = total_tokens rows of L = depth + 1, one distinct path per leaf.
    assert tree.beams.shape == (total, depth + 1) and (tree.beams[:, 0] == root).all()
    leaves = [s for s in kept if s not in set(tree.parents[kept].tolist())]
    assert len({tuple(b) for b in tree.beams.tolist()}) == len(leaves)
    assert len(tree.extension) == sum(depth - int(tree.depth[leaf]) for leaf in leaves)
    built = build_prefix_tree(tree.beams[None])
    assert int(built.num_nodes[0]) == 1 + len(kept) + len(tree.extension)


def test_top_one_tree_is_the_greedy_chain():
    """top_k 1: the tree is the draft's greedy chain of ``depth`` tokens."""
    config, weights, embed, lm_head = tiny(4)
    rng = np.random.default_rng(4)
    cache, root, feature = prompt_cache(config, weights, embed, rng, 3), 7, rng.normal(size=H)
    tree = dynamic_tree(
        config, weights, embed, lm_head, cache, root, feature, top_k=1, depth=3, total_tokens=3
    )
    out, walk, chain = run_entries(
        config, weights, embed, cache, np.array([root]), feature[None]
    ) + ([],)
    for _ in range(3):
        token = int(np.argmax(draft_log_probs(weights, lm_head, out[0])))
        chain.append(token)
        out, walk = run_entries(config, weights, embed, walk, np.array([token]), out)
    np.testing.assert_array_equal(tree.beams, [[root, *chain]] * 3)


def rows(drafter, slots, roots, hidden):
    return drafter.propose(
        DraftContext(root_tokens=np.array(roots), hidden=np.array(hidden), slots=np.array(slots))
    )


def test_cache_built_step_by_step_equals_one_built_at_once():
    config, weights, embed, lm_head = tiny(5)
    rng = np.random.default_rng(5)
    drafter = EagleDrafter(
        config, weights, embed_tokens=embed, lm_head=lm_head, top_k=2, depth=2, total_tokens=4
    )
    assert (
        isinstance(drafter, Drafter)
        and isinstance(drafter, RequestObserver)
        and drafter.caps.stateful
    )
    prompt, hidden = rng.integers(0, V, 4), rng.normal(size=(4, H))
    drafter.begin(3, prompt, PromptOutput(logits=np.zeros(V), hidden=hidden))
    emitted, features = [], []
    for accepted_count in (2, 0, 1):
        root = int(rng.integers(0, V))
        tokens = np.array([[root, *rng.integers(0, V, accepted_count)]])
        step_hidden = rng.normal(size=(1, accepted_count + 1, H))
        drafter.observe(
            Accepted(
                slots=np.array([3]),
                tokens=tokens,
                num_accepted=np.array([accepted_count]),
                bonus_tokens=np.array([0]),
                hidden=step_hidden,
            )
        )
        emitted += tokens[0].tolist()
        features.append(step_hidden[0])
    once = EagleDrafter(config, weights, embed_tokens=embed, lm_head=lm_head)
    once.begin(
        0,
        np.concatenate([prompt, emitted]),
        PromptOutput(logits=np.zeros(V), hidden=np.concatenate([hidden, *features])),
    )
    step, whole = drafter.slots[3], once.slots[0]
    assert step.length == whole.length == len(prompt) + len(emitted) - 1
    np.testing.assert_allclose(step.keys, whole.keys, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(step.values, whole.values, rtol=1e-12, atol=1e-12)
    np.testing.assert_array_equal(step.pending, whole.pending)
    drafter.end(3, "length")
    with pytest.raises(InvalidInputError, match="no request in slot 3"):
        rows(drafter, [3], [1], np.zeros((1, H)))


def test_rows_are_independent_of_their_batch():
    config, weights, embed, lm_head = tiny(6)
    rng = np.random.default_rng(6)
    drafter = EagleDrafter(config, weights, embed_tokens=embed, lm_head=lm_head)
    for slot, length in ((0, 3), (1, 1), (2, 6)):
        drafter.begin(
            slot,
            rng.integers(0, V, length),
            PromptOutput(logits=np.zeros(V), hidden=rng.normal(size=(length, H))),
        )
    roots, hidden = [4, 5, 6], rng.normal(size=(3, H))
    together = rows(drafter, [2, 0, 1], roots, hidden).beams
    for b, slot in enumerate([2, 0, 1]):
        np.testing.assert_array_equal(
            rows(drafter, [slot], roots[b : b + 1], hidden[b : b + 1]).beams[0], together[b]
        )


def test_propose_refuses_what_it_cannot_serve():
    config, weights, embed, lm_head = tiny(7)
    drafter = EagleDrafter(config, weights, embed_tokens=embed, lm_head=lm_head)
    drafter.begin(0, np.array([1, 2]), PromptOutput(logits=np.zeros(V), hidden=np.zeros((2, H))))
    with pytest.raises(InvalidInputError, match="slots"):
        drafter.propose(DraftContext(root_tokens=np.array([1]), hidden=np.zeros((1, H))))
    with pytest.raises(InvalidInputError, match="draft probabilities"):
        drafter.propose(
            DraftContext(
                root_tokens=np.array([1]),
                hidden=np.zeros((1, H)),
                slots=np.array([0]),
                want_draft_probs=True,
            )
        )
    with pytest.raises(ValueError, match="total_tokens=3 cannot hold"):
        EagleDrafter(config, weights, embed_tokens=embed, lm_head=lm_head, depth=4, total_tokens=3)
    with pytest.raises(ValueError, match="top_k=41 exceeds"):
        EagleDrafter(config, weights, embed_tokens=embed, lm_head=lm_head, top_k=41)
    with pytest.raises(ValueError, match="lm_head"):
        EagleDrafter(config, weights, embed_tokens=embed, lm_head=lm_head[:, :3])


def test_checkpoint_round_trip_and_random_maker(tmp_path, model_dir):
    config, weights, _, _ = tiny(8, shortlist_size=16)
    loaded_config, loaded = load_eagle_checkpoint(save_eagle(tmp_path / "ckpt", config, weights))
    assert loaded_config == config
    for name, array in weights.items():
        np.testing.assert_array_equal(
            loaded[name], np.asarray(array, dtype=np.float32).astype(loaded[name].dtype)
        )
    with pytest.raises(ValueError, match="missing"):
        save_eagle(tmp_path / "bad", config, {k: v for k, v in weights.items() if k != "fc.bias"})
    made, _ = load_eagle_checkpoint(
        make_random_eagle(tmp_path / "random", model_dir, seed=0, total_tokens=9)
    )
    assert (made.num_heads, made.num_kv_heads, made.hidden_size, made.total_tokens) == (4, 2, 32, 9)
    assert made.target["name"] == "llama"
    with pytest.raises(ValueError, match="unknown EAGLE config keys"):
        EagleConfig.from_dict({**config.to_dict(), "beam_width": 2})


@pytest.mark.parametrize(
    "sampling",
    [dict(temperature=2.5), dict(temperature=2.0, top_k=3), dict(temperature=4.0, top_p=0.9)],
    ids=["t2.5", "t2-k3", "t4-p0.9"],
)
@pytest.mark.parametrize("prompt", [[0, 1, 2, 3], [4]])
def test_sampling_over_its_dynamic_tree_emits_exactly_the_targets_distribution(
    tmp_path, sampling, prompt
):
    """One step of EAGLE's tree under the exact verifier, every branch enumerated (each with its
    probability), then the target's own conditionals: the distribution of the next depth + 1
    tokens equals the target's joint to 1e-10, whatever the dynamic tree holds."""
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
        num_layers=1,
        num_heads=2,
        num_kv_heads=1,
        tie_word_embeddings=False,
    )
    checkpoint = make_random_drafter(tmp_path / "eagle", model, kind="eagle", seed=2)
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

    output = target.admit(0, prompt)
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
