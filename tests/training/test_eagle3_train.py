"""EAGLE-3 training: the unrolled steps are the reference's tree nodes (float64) under a mask
checked by hand, the draft vocabulary maps labels as the inference code reads them, the loss
falls, a short run improves held-out tokens per step, saves a checkpoint that decodes
losslessly, and an interrupted run resumes to the same weights."""

from __future__ import annotations

import attrs
import numpy as np
import pytest
import torch

import specdec
from specdec.training import loop
from specdec.training.loop import TrainSettings, train
from specdec.training.run import build_teacher_data
from specdec.training.state import load_state
from specdec.training.records import TeacherData
from specdec_eagle3.checkpoint import d2t_from_ids, load_eagle3_checkpoint, random_eagle3_weights
from specdec_eagle3.config import Eagle3Config, draft_to_target
from specdec_eagle3.reference import features, run_entries
from specdec_eagle3.task import Eagle3Task, map_labels, target_to_draft, unrolled_mask
from specdec_eagle3.train import train_eagle3
from specdec_eagle.reference import SlotCache

V, H, VOCAB = 40, 8, 64


def config(**overrides) -> Eagle3Config:
    return Eagle3Config(
        **{
            "vocab_size": V,
            "hidden_size": H,
            "draft_vocab_size": 24,
            "hidden_layers": (0, 1, 2),
            "num_heads": 4,
            "num_kv_heads": 2,
            "head_dim": 2,
            "intermediate_size": 12,
            **overrides,
        }
    )


def test_unrolled_mask_worked_example():
    """The module docstring's example: step 2 over a window of 3; step 0 is causal."""
    expected = [
        [1, 0, 0, 1, 0, 0, 1, 0, 0],
        [1, 1, 0, 0, 1, 0, 0, 1, 0],
        [1, 1, 1, 0, 0, 1, 0, 0, 1],
    ]
    assert unrolled_mask(3, 2).int().tolist() == expected
    assert unrolled_mask(3, 0).int().tolist() == [[1, 0, 0], [1, 1, 0], [1, 1, 1]]


def test_unrolled_steps_are_the_reference_tree_nodes_in_float64():
    """Step 0 over a window equals the reference's cache entries; step j at window index i equals
    a tree node of level j: the reference run over the true entries 0..i, then the chain of
    entries (x_{i+1+s}, previous output) for s = 1..j, each one position later."""
    rng = np.random.default_rng(0)
    cfg = config()
    embed = rng.normal(size=(V, H)).astype(np.float32).astype(np.float64)  # the task keeps float32
    weights = random_eagle3_weights(cfg, rng)
    ids = draft_to_target(weights["d2t"])
    task = Eagle3Task(cfg, embed_tokens=torch.from_numpy(embed), ids=ids, window=6)
    task.module.double().load_weights(weights)
    tokens, layers = rng.integers(0, V, 8), {i: rng.normal(size=(6, H)) for i in range(3)}
    g = features(cfg, weights, layers)
    fused = task.module.features([torch.from_numpy(layers[i]) for i in range(3)])
    np.testing.assert_allclose(fused.detach().numpy(), g, rtol=1e-12, atol=1e-12)
    empty = np.zeros((cfg.num_kv_heads, 0, cfg.head_dim))
    start = SlotCache(keys=empty, values=empty, pending=None)
    expected, cache = run_entries(cfg, weights, embed, start, tokens[:6], g)
    out, keys, values = task.step(torch.from_numpy(tokens[:6])[None], torch.from_numpy(g)[None])
    np.testing.assert_allclose(out[0].detach().numpy(), expected, rtol=1e-10, atol=1e-10)
    past, outs = ([keys], [values]), [out]
    for step in (1, 2):
        window_tokens = torch.from_numpy(tokens[step : step + 6])[None]
        out, keys, values = task.step(window_tokens, outs[-1], past)
        past[0].append(keys)
        past[1].append(values)
        outs.append(out)
    for i in range(6):
        node = SlotCache(keys=cache.keys[:, : i + 1], values=cache.values[:, : i + 1], pending=None)
        feature = expected[i : i + 1]
        for step in (1, 2):
            token = tokens[i + step : i + step + 1]
            feature, node = run_entries(cfg, weights, embed, node, token, feature)
            np.testing.assert_allclose(
                outs[step][0, i].detach().numpy(),
                feature[0],
                rtol=1e-10,
                atol=1e-10,
                err_msg=f"step {step}, window index {i}",
            )


def test_draft_vocabulary_maps_labels_and_masks_positions():
    """Draft vocabulary [3, 5, 9] of 12 target ids: d2t [3, 4, 7] (the inference code's offsets),
    t2d the draft id of each member, -1 elsewhere; labels outside it get probability 0; a step
    whose target argmax is outside it is masked."""
    ids = np.array([3, 5, 9])
    assert d2t_from_ids(ids).tolist() == [3, 4, 7]
    assert draft_to_target([3, 4, 7]).tolist() == [3, 5, 9]
    t2d = target_to_draft(ids, 12)
    assert t2d.tolist() == [-1, -1, -1, 0, -1, 1, -1, -1, -1, 2, -1, -1]
    local, probs = map_labels(torch.tensor([[9, 4, 3]]), torch.tensor([[0.5, 0.3, 0.2]]), t2d)
    assert local.tolist() == [[2, 0, 0]] and probs[0].tolist() == pytest.approx([0.5, 0.0, 0.2])

    cfg = config(vocab_size=12, draft_vocab_size=3)
    task = Eagle3Task(cfg, embed_tokens=torch.randn(12, H), ids=ids, window=4)
    next_tokens = torch.tensor([5, 3, 4, 9, 9])  # one sequence; x_{p+1} = next_tokens[p]
    data = TeacherData(
        hidden=torch.zeros(5, H),
        next_tokens=next_tokens,
        label_ids=next_tokens[:, None],
        label_probs=torch.ones(5, 1),
        remaining=torch.arange(4, -1, -1),
        sequence=torch.zeros(5, dtype=torch.long),
    )
    where, tokens, label_ids, _, mask = task.windows(data, torch.tensor([0]))
    # step 0 at p predicts x_{p+2} = next_tokens[p+1]: 3, 4 (outside), 9, 9
    assert tokens.tolist() == [[5, 3, 4, 9]] and where.tolist() == [[0, 1, 2, 3]]
    assert mask.tolist() == [[True, False, True, True]]
    assert label_ids[0, [0, 2], 0].tolist() == [0, 2]
    _, tokens, _, _, mask = task.windows(data, torch.tensor([0]), offset=1)
    assert tokens.tolist() == [[3, 4, 9, 9]] and mask.tolist() == [[False, True, True, False]]


def token_prompts(split: str, start: int, count: int) -> list[list[int]]:
    """Deterministic random token-id prompts of 3..11 tokens, independent per (split, index)."""
    prompts = []
    for i in range(start, start + count):
        rng = np.random.default_rng([11, 0 if split == "train" else 1, i])
        prompts.append([int(t) for t in rng.integers(4, VOCAB, size=int(rng.integers(3, 12)))])
    return prompts


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    """A random 3-layer llama (vocab 64, untied head, so greedy text rarely repeats a token):
    EAGLE-3 fuses its three layers' outputs."""
    from specdec.testing import make_random_model

    return make_random_model(
        tmp_path_factory.mktemp("eagle3-train") / "llama",
        vocab_size=VOCAB,
        hidden_size=32,
        num_layers=3,
        num_heads=4,
        num_kv_heads=2,
        seed=3,
        eos_token_id=3,
        tie_word_embeddings=False,
        with_tokenizer=True,
    )


COMMON = dict(
    prompts=48,
    heldout_prompts=8,
    max_new_tokens=20,
    top_k_labels=8,
    batch_size=128,
    window=16,
    lr=3e-3,
    prompt_source=token_prompts,
    progress=False,
    top_k=3,
    depth=3,
    total_tokens=8,
    teacher_dtype="float32",
    hidden_dtype="float32",
    draft_vocab=48,
)


@pytest.fixture(scope="module")
def runs(model, tmp_path_factory):
    """A short run (200 steps, unrolled over 2 steps) and the same run at learning rate 0."""
    cache = tmp_path_factory.mktemp("cache")
    out = tmp_path_factory.mktemp("trained")
    run = dict(
        steps=200, eval_steps=100, eval_minutes=(), unroll=2, cache=cache
    )  # evaluations by step only
    trained = train_eagle3(model, out, **run, **COMMON)
    control = train_eagle3(
        model, tmp_path_factory.mktemp("control"), **run, **{**COMMON, "lr": 0.0}
    )
    return trained, control, out, cache


@pytest.fixture(scope="module")
def data(model, runs):
    """The runs' teacher data (from their cache), with the three layers."""
    from specdec.training.teacher import load_teacher_target

    target = load_teacher_target(model, dtype="float32")
    datasets, _, _ = build_teacher_data(
        target,
        prompts=48,
        heldout_prompts=8,
        max_new_tokens=20,
        top_k=8,
        seed=0,
        cache=runs[3],
        prompt_source=token_prompts,
        hidden_dtype="float32",
        progress=False,
        layers=(0, 1, 2),
    )
    return target, datasets


def test_training_improves_held_out_tokens_per_step(runs):
    """Against the same run at learning rate 0 (the initialisation, which reads the high layer
    through the target's own head: 1.23 tokens per step here), training adds what it taught."""
    trained, control, _, _ = runs
    assert [row["step"] for row in trained["history"]] == [100, 200, 200]
    gain = trained["history"][-1]["tokens_per_step"] - control["history"][-1]["tokens_per_step"]
    assert gain > 0.3, (trained["history"], control["history"])
    assert trained["history"][-1]["loss"] < 0.7 * control["history"][-1]["loss"]
    assert trained["shortlist"] == 48 and trained["training"]["unroll"] == 2


def test_the_draft_vocabulary_holds_the_most_frequent_target_tokens(runs, data):
    _, datasets = data
    config_, weights = load_eagle3_checkpoint(runs[2])
    ids = draft_to_target(weights["d2t"])
    assert config_.draft_vocab_size == len(ids) == 48 and np.all(np.diff(ids) > 0)
    counts = np.bincount(datasets["train"].next_tokens.numpy(), minlength=VOCAB)
    assert set(np.argsort(-counts, kind="stable")[:20].tolist()) <= set(ids.tolist())


def test_trained_checkpoint_loads_and_decodes_losslessly(model, runs):
    config_, _ = load_eagle3_checkpoint(runs[2])
    assert config_.hidden_layers == (0, 1, 2)
    assert (config_.top_k, config_.depth, config_.total_tokens) == (3, 3, 8)
    prompts = token_prompts("heldout", 0, 3)
    for backend, dtype in (("torch", "float32"), ("numpy", None)):
        options = dict(backend=backend, dtype=dtype, max_new_tokens=16)
        plain = specdec.generate(model, prompts, drafter="none", **options)
        drafted = specdec.generate(model, prompts, drafter=str(runs[2]), **options)
        assert drafted.tokens == plain.tokens, backend
        assert drafted.stats.tokens_per_step > 1.0, backend


def test_the_evaluation_task_scores_the_saved_weights_as_training_did(runs, data):
    """The spec's ``evaluation_task`` (``evaluate_drafter``) on the run's last weights gives the
    run's final held-out figure, and names the layers its teacher data need."""
    from specdec.plugins.registry import default_registry
    from specdec.training.outdir import LAST_DIR

    target, datasets = data
    task = default_registry().drafter_spec("eagle3").evaluation_task(runs[2] / LAST_DIR, target, {})
    assert task.teacher_layers == (0, 1, 2)
    heldout = datasets["heldout"]
    with torch.no_grad():
        score = loop.walk_tokens_per_step(heldout, lambda idx: task.accept(heldout, idx))
    assert round(score["tokens_per_step"], 4) == runs[0]["history"][-1]["tokens_per_step"]


def test_the_loss_falls_over_a_few_steps(data):
    """Twenty AdamW steps on the same windows of real teacher data (three unrolled steps)."""
    target, datasets = data
    train_data = datasets["train"]
    cfg = config(vocab_size=VOCAB, hidden_size=32, draft_vocab_size=VOCAB, head_dim=8)
    task = Eagle3Task(
        cfg,
        embed_tokens=target.embed_tokens,
        ids=np.arange(VOCAB),
        window=16,
        unroll=3,
        data=train_data,
    )
    starts = torch.from_numpy(np.random.default_rng(0).integers(0, train_data.num_positions, 8))
    optimizer = torch.optim.AdamW(task.module.parameters(), lr=3e-3)
    losses = []
    for _ in range(20):
        loss = task.unrolled_loss(train_data, starts)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(float(loss.detach()))
    assert losses[-1] < 0.8 * losses[0], losses


def test_held_out_acceptance_is_what_the_drafter_proposes(data):
    """``Eagle3Task.accept`` at position t equals what a TorchEagle3Drafter that began on the
    sequence up to t proposes: the longest beam prefix equal to the continuation. The data's
    continuation after each tested position copies two tokens of the drafter's beam 0."""
    from specdec.types import DraftContext, PromptOutput
    from specdec_eagle3.torch import TorchEagle3Drafter

    target, _ = data
    rng = np.random.default_rng(1)
    cfg = config(
        vocab_size=VOCAB,
        hidden_size=32,
        draft_vocab_size=30,
        head_dim=8,
        top_k=3,
        depth=3,
        total_tokens=6,
    )
    ids = np.sort(rng.choice(VOCAB, 30, replace=False))
    task = Eagle3Task(cfg, embed_tokens=target.embed_tokens, ids=ids)
    task.module.load_weights(random_eagle3_weights(cfg, rng, ids=ids))
    lengths = [14, 9]
    total = sum(lengths)
    sequence = torch.tensor([s for s, n in enumerate(lengths) for _ in range(n)])
    remaining = torch.tensor([n - 1 - i for n in lengths for i in range(n)])
    tokens = torch.from_numpy(rng.integers(0, VOCAB, total))
    layers = torch.randn(total, 3, 32)
    heldout = TeacherData(
        hidden=torch.zeros(total, 32),
        next_tokens=tokens,
        label_ids=torch.zeros(total, 2, dtype=torch.long),
        label_probs=torch.ones(total, 2),
        remaining=remaining,
        sequence=sequence,
        layers=layers,
        layer_ids=(0, 1, 2),
    )
    indices = [0, 5, 10, 14, 19]

    def beams_at(index):
        start = 0 if index < lengths[0] else lengths[0]
        drafter = TorchEagle3Drafter(cfg, task.weights(), embed_tokens=target.embed_tokens.float())
        prompt = np.concatenate([[0], tokens[start:index].numpy()])
        output = PromptOutput(
            logits=torch.zeros(VOCAB),
            hidden=torch.zeros(index + 1 - start, 32),
            layers={i: layers[start : index + 1, i] for i in range(3)},
        )
        drafter.begin(0, prompt, output)
        context = DraftContext(
            root_tokens=tokens[index : index + 1], hidden=torch.zeros(1, 32), slots=np.array([0])
        )
        return drafter.propose(context).beams[0].numpy()

    for index in indices:  # beams at t read tokens up to t only: later copies do not change them
        tokens[index + 1 : index + 3] = torch.from_numpy(beams_at(index)[0, 1:3])
    with torch.no_grad():
        got = task.accept(heldout, torch.tensor(indices))
    for index, accepted in zip(indices, got.tolist(), strict=True):
        truth = tokens[index + 1 : index + 1 + int(remaining[index])].numpy()
        best = 0
        for beam in beams_at(index):
            matched = 0
            while matched < min(len(beam) - 1, len(truth)) and beam[matched + 1] == truth[matched]:
                matched += 1
            best = max(best, matched)
        assert accepted == best >= min(2, len(truth)), f"position {index}"


def test_interrupted_training_resumes_to_the_same_weights(data, tmp_path, monkeypatch):
    target, datasets = data
    cfg = config(
        vocab_size=VOCAB,
        hidden_size=32,
        draft_vocab_size=VOCAB,
        head_dim=8,
        top_k=2,
        depth=2,
        total_tokens=3,
    )
    settings = TrainSettings(steps=12, batch_size=32, eval_steps=6, eval_sequences=2, seed=5)
    positions = torch.arange(datasets["train"].num_positions)[:, None]
    index_view = attrs.evolve(datasets["train"], hidden=positions)

    def run(folder, **kwargs):
        task = Eagle3Task(
            cfg,
            embed_tokens=target.embed_tokens,
            ids=np.arange(VOCAB),
            window=8,
            unroll=2,
            data=datasets["train"],
        )
        start = random_eagle3_weights(cfg, np.random.default_rng(2), ids=np.arange(VOCAB))
        task.module.load_weights(start)
        train(task, index_view, datasets["heldout"], settings, folder, progress=False, **kwargs)
        return task.module.weights()

    straight = run(tmp_path / "straight")
    write_json = loop.write_json_atomic

    def crash(path, value):
        if path.name == loop.LOG_FILE:  # dies right after the first checkpoint (step 6)
            raise KeyboardInterrupt
        write_json(path, value)

    monkeypatch.setattr(loop, "write_json_atomic", crash)
    with pytest.raises(KeyboardInterrupt):
        run(tmp_path / "resumed")
    monkeypatch.undo()
    assert load_state(tmp_path / "resumed" / loop.STATE_FILE)["step"] == 6
    resumed = run(tmp_path / "resumed", resume=True)
    for name in straight:
        np.testing.assert_array_equal(resumed[name], straight[name], err_msg=name)
