"""EAGLE training: the trainable network is the checkpoint and the reference's math (one step and
unrolled steps, float64), a short run through the training pipeline improves held-out tokens per
step and saves a checkpoint that decodes losslessly."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="training needs the 'train' extra (torch)")
pytest.importorskip("transformers", reason="training needs the 'train' extra (transformers)")

import specdec  # noqa: E402
from specdec_eagle.checkpoint import load_eagle_checkpoint, random_eagle_weights  # noqa: E402
from specdec_eagle.config import EagleConfig  # noqa: E402
from specdec_eagle.reference import SlotCache, run_entries  # noqa: E402
from specdec_eagle.torch import EagleNet  # noqa: E402
from specdec_eagle.train import EagleTask, train_eagle  # noqa: E402

V, H, VOCAB = 40, 8, 64


def config(**overrides) -> EagleConfig:
    return EagleConfig(
        **{
            "vocab_size": V,
            "hidden_size": H,
            "num_heads": 4,
            "num_kv_heads": 2,
            "head_dim": 2,
            "intermediate_size": 12,
            **overrides,
        }
    )


def test_parameters_are_the_checkpoint_weights():
    cfg = config(shortlist_size=10)
    net = EagleNet(cfg, embed_tokens=torch.randn(V, H), lm_head=torch.randn(V, H))
    shapes = {name: tuple(t.shape) for name, t in net.state_dict().items()}
    assert shapes == {k: v for k, v in cfg.weight_shapes().items() if k != "vocab_shortlist"}


def test_windows_and_unrolled_steps_equal_the_reference_in_float64():
    """Step 1 over a window equals the reference's cache entries; step 2 at window position j
    equals a tree node: the entry (x_{j+2}, step-1 output at j) after the true entries 0..j."""
    rng = np.random.default_rng(0)
    cfg = config()
    embed, lm_head = (
        rng.normal(size=(V, H)).astype(np.float32).astype(np.float64) for _ in range(2)
    )  # the task keeps
    weights = random_eagle_weights(
        cfg, rng, embed_tokens=embed, lm_head=lm_head
    )  # float32 copies of the target's
    task = EagleTask(
        cfg, embed_tokens=torch.from_numpy(embed), lm_head=torch.from_numpy(lm_head), window=6
    )
    task.module.double().load_weights(weights)
    tokens, features = rng.integers(0, V, 7), rng.normal(size=(6, H))
    out1, k1, v1 = task.forward_windows(
        torch.from_numpy(tokens[:6])[None], torch.from_numpy(features)[None]
    )
    empty = np.zeros((cfg.num_kv_heads, 0, cfg.head_dim))
    expected, cache = run_entries(
        cfg, weights, embed, SlotCache(keys=empty, values=empty, pending=None), tokens[:6], features
    )
    np.testing.assert_allclose(out1[0].detach().numpy(), expected, rtol=1e-10, atol=1e-10)
    np.testing.assert_allclose(k1[0].detach().numpy(), cache.keys, rtol=1e-10, atol=1e-10)
    out2, _, _ = task.forward_windows(torch.from_numpy(tokens[1:7])[None], out1, ([k1], [v1]))
    for j in range(6):
        prefix = SlotCache(
            keys=cache.keys[:, : j + 1], values=cache.values[:, : j + 1], pending=None
        )
        node, _ = run_entries(
            cfg, weights, embed, prefix, tokens[j + 1 : j + 2], expected[j : j + 1]
        )
        np.testing.assert_allclose(
            out2[0, j].detach().numpy(), node[0], rtol=1e-10, atol=1e-10, err_msg=f"j={j}"
        )


def token_prompts(split: str, start: int, count: int) -> list[list[int]]:
    """Deterministic random token-id prompts of 3..11 tokens, independent per (split, index)."""
    prompts = []
    for i in range(start, start + count):
        rng = np.random.default_rng([11, 0 if split == "train" else 1, i])
        prompts.append([int(t) for t in rng.integers(4, VOCAB, size=int(rng.integers(3, 12)))])
    return prompts


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    """A random 1-layer llama (vocab 64, untied head) whose greedy text rarely repeats a token."""
    from specdec.testing import make_random_model

    return make_random_model(
        tmp_path_factory.mktemp("eagle-train") / "llama",
        vocab_size=VOCAB,
        hidden_size=32,
        num_layers=1,
        num_heads=4,
        num_kv_heads=2,
        seed=3,
        eos_token_id=3,
        tie_word_embeddings=False,
        with_tokenizer=True,
    )


@pytest.fixture(scope="module")
def runs(model, tmp_path_factory):
    """A short training run (unrolled over 2 steps, with a shortlist) and a 1-step control."""
    cache = tmp_path_factory.mktemp("cache")
    common = dict(
        prompts=48,
        heldout_prompts=8,
        max_new_tokens=20,
        top_k_labels=8,
        batch_size=128,
        window=16,
        lr=3e-3,
        prompt_source=token_prompts,
        cache=cache,
        progress=False,
        top_k=3,
        depth=3,
        total_tokens=8,
        teacher_dtype="float32",
        hidden_dtype="float32",
    )
    out = tmp_path_factory.mktemp("trained")
    trained = train_eagle(model, out, steps=200, eval_steps=100, shortlist=48, unroll=2, **common)
    control = train_eagle(model, tmp_path_factory.mktemp("control"), steps=1, **common)
    return trained, control, out


def test_training_improves_held_out_tokens_per_step(runs):
    trained, control, _ = runs
    assert [row["step"] for row in trained["history"]] == [100, 200, 200]
    assert (
        trained["history"][-1]["tokens_per_step"] > control["history"][-1]["tokens_per_step"] + 0.2
    )
    assert trained["shortlist"] == 48 and trained["training"]["unroll"] == 2


def test_trained_checkpoint_loads_and_decodes_losslessly(model, runs):
    trained_dir = runs[2]
    config_, weights = load_eagle_checkpoint(trained_dir)
    assert config_.shortlist_size == 48 and len(weights["vocab_shortlist"]) == 48
    assert (config_.top_k, config_.depth, config_.total_tokens) == (3, 3, 8)
    prompts = token_prompts("heldout", 0, 3)
    plain = specdec.generate(
        model, prompts, drafter="none", backend="torch", dtype="float32", max_new_tokens=16
    )
    drafted = specdec.generate(
        model,
        prompts,
        drafter=str(trained_dir),
        backend="torch",
        dtype="float32",
        max_new_tokens=16,
    )
    assert drafted.tokens == plain.tokens
    assert drafted.stats.tokens_per_step > 1.0


def test_held_out_acceptance_is_what_the_drafter_proposes():
    """``EagleTask.accept`` at position t equals what a TorchEagleDrafter that began on the
    sequence up to t proposes: the longest beam prefix equal to the continuation. The data's
    continuation after each tested position copies two tokens of the drafter's beam 0."""
    from specdec.training.records import TeacherData
    from specdec.types import DraftContext, PromptOutput
    from specdec_eagle.torch import TorchEagleDrafter

    rng = np.random.default_rng(1)
    cfg = config(top_k=3, depth=3, total_tokens=6)
    embed, lm_head = torch.randn(V, H), torch.randn(V, H) * 0.5
    task = EagleTask(cfg, embed_tokens=embed, lm_head=lm_head, seed=1)
    lengths = [14, 9]
    sequence = torch.tensor([s for s, n in enumerate(lengths) for _ in range(n)])
    remaining = torch.tensor([n - 1 - i for n in lengths for i in range(n)])
    tokens = torch.from_numpy(rng.integers(0, V, sum(lengths)))
    data = TeacherData(
        hidden=torch.randn(sum(lengths), H),
        next_tokens=tokens,
        label_ids=torch.zeros(sum(lengths), 2, dtype=torch.long),
        label_probs=torch.ones(sum(lengths), 2),
        remaining=remaining,
        sequence=sequence,
    )
    indices = [0, 5, 10, 14, 19]

    def beams_at(index):
        start = 0 if index < lengths[0] else lengths[0]
        drafter = TorchEagleDrafter(cfg, task.weights(), embed_tokens=embed, lm_head=lm_head)
        prompt = np.concatenate([[0], tokens[start:index].numpy()])
        drafter.begin(
            0, prompt, PromptOutput(logits=torch.zeros(V), hidden=data.hidden[start : index + 1])
        )
        return (
            drafter.propose(
                DraftContext(
                    root_tokens=tokens[index : index + 1],
                    hidden=data.hidden[index][None],
                    slots=np.array([0]),
                )
            )
            .beams[0]
            .numpy()
        )

    for index in indices:  # beams at t read tokens up to t only: later copies do not change them
        tokens[index + 1 : index + 3] = torch.from_numpy(beams_at(index)[0, 1:3])
    got = task.accept(data, torch.tensor(indices))
    for index, accepted in zip(indices, got.tolist(), strict=True):
        truth = tokens[index + 1 : index + 1 + int(remaining[index])].numpy()
        best = 0
        for beam in beams_at(index):
            matched = 0
            while matched < min(len(beam) - 1, len(truth)) and beam[matched + 1] == truth[matched]:
                matched += 1
            best = max(best, matched)
        assert accepted == best >= min(2, len(truth)), f"position {index}"
