"""ReDrafter training: checkpoint names and math equal the reference, acceptance equals the decode
loop, training improves tokens per step, and an interrupted run resumes to the same weights."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

import specdec
from specdec.errors import TrainingOutputError
from specdec.training import loop
from specdec.training.loop import TrainSettings, soft_cross_entropy, train
from specdec.training.outdir import LEGACY_STATE_FILE
from specdec.training.state import load_state, save_state
from specdec_redrafter.checkpoint import load_redrafter_checkpoint, random_redrafter_weights
from specdec_redrafter.config import RedrafterConfig
from specdec_redrafter.reference import drafter_logits, rnn_step
from specdec_redrafter.train import RedrafterNet, RedrafterTask, default_config, train_redrafter

V, H = 40, 8
VARIANTS = [
    dict(),
    dict(rnn_variant="trtllm", num_draft_layers=1),
    dict(rnn_variant="paper", head="full"),
    dict(rnn=False, exit_dim=12, num_draft_layers=2),
    dict(head="full", exit_dim=10, num_draft_layers=0),
]


def make_config(**overrides) -> RedrafterConfig:
    return RedrafterConfig(**{"vocab_size": V, "hidden_size": H, "head": "tied", **overrides})


@pytest.mark.parametrize("overrides", VARIANTS)
def test_parameters_are_the_checkpoint_weights(overrides):
    config = make_config(**overrides)
    net = RedrafterNet(config, embed_tokens=torch.randn(V, H), target_lm_head=torch.randn(V, H))
    shapes = {name: tuple(t.shape) for name, t in net.state_dict().items()}
    assert shapes == config.weight_shapes()


@pytest.mark.parametrize("overrides", VARIANTS)
def test_teacher_forced_logits_equal_the_reference_in_float64(overrides, tmp_path):
    rng = np.random.default_rng(1)
    config = make_config(**overrides)
    embed, lm_head = rng.normal(size=(V, H)), rng.normal(size=(V, H))
    weights = random_redrafter_weights(config, rng)
    net = RedrafterNet(
        config, embed_tokens=torch.from_numpy(embed), target_lm_head=torch.from_numpy(lm_head)
    ).double()
    net.load_weights(weights)
    hidden, tokens = rng.normal(size=(3, H)), rng.integers(0, V, size=(3, 4))
    got = net(torch.from_numpy(hidden), torch.from_numpy(tokens)).detach().numpy()  # (3, 4, V)
    state = None
    for k in range(4):
        state = rnn_step(config, weights, state, embed[tokens[:, k]], first=k == 0)
        expected = drafter_logits(config, weights, hidden, state, lm_head=lm_head)
        np.testing.assert_allclose(
            got[:, k], expected, rtol=1e-10, atol=1e-10, err_msg=f"step {k + 1}, {overrides}"
        )
    # the saved checkpoint is a reference checkpoint with the same weights (float32 on disk)
    task = RedrafterTask(
        config, embed_tokens=torch.from_numpy(embed), lm_head=torch.from_numpy(lm_head)
    )
    task.module.load_weights(weights)
    loaded_config, loaded = load_redrafter_checkpoint(task.save(tmp_path / "ckpt"))
    assert loaded_config == config
    for name, array in weights.items():
        np.testing.assert_array_equal(loaded[name], array.astype(np.float32).astype(np.float64))


def test_initial_drafter_reads_the_target_distribution():
    """Blocks start at zero and the head reads h: the untrained drafter gives the target's
    logits."""
    embed = torch.randn(V, H)
    net = RedrafterNet(
        make_config(),
        embed_tokens=embed,
        target_lm_head=embed,
        generator=torch.Generator().manual_seed(0),
    )
    hidden = torch.randn(2, H)
    logits = net(hidden, torch.tensor([[1, 2], [3, 4]]))
    torch.testing.assert_close(logits[:, 0], hidden @ embed.T, atol=0.2, rtol=0.05)


@pytest.mark.parametrize("head", ["tied", "full"])
def test_a_checkpoint_with_fewer_blocks_starts_a_deeper_net_where_it_stopped(head):
    """``--init`` from a net of 1 block into one of 3: the extra blocks start at zero (the
    identity), so the deeper net's logits are the checkpoint's."""
    rng = np.random.default_rng(2)
    embed, lm_head = (
        torch.from_numpy(rng.normal(size=(V, H))),
        torch.from_numpy(rng.normal(size=(V, H))),
    )
    small, deep = (
        make_config(head=head, num_draft_layers=1),
        make_config(head=head, num_draft_layers=3),
    )
    weights = random_redrafter_weights(small, rng)
    before = RedrafterNet(small, embed_tokens=embed, target_lm_head=lm_head).double()
    before.load_weights(weights)
    after = RedrafterNet(deep, embed_tokens=embed, target_lm_head=lm_head).double()
    after.load_weights(weights)
    hidden, tokens = (
        torch.from_numpy(rng.normal(size=(3, H))),
        torch.from_numpy(rng.integers(0, V, size=(3, 4))),
    )
    torch.testing.assert_close(after(hidden, tokens), before(hidden, tokens), rtol=0, atol=0)
    assert not after.lm_head[2].linear.weight.detach().any()
    with pytest.raises(ValueError, match="ReDrafter"):  # more blocks than the net: refused
        before.load_weights(random_redrafter_weights(deep, rng))


def test_soft_cross_entropy_is_kl_plus_entropy():
    logits = torch.randn(2, 3, 7)
    ids = torch.tensor([[[0, 1], [2, 3], [4, 5]], [[6, 0], [1, 2], [3, 4]]])
    probs = torch.tensor(
        [[[0.5, 0.3], [0.8, 0.1], [0.4, 0.4]], [[0.6, 0.2], [0.3, 0.3], [0.9, 0.05]]]
    )
    valid = torch.tensor([[True, True, False], [True, True, True]])
    expected = 0.0
    for b in range(2):
        for d in range(3):
            if valid[b, d]:
                p = probs[b, d] / probs[b, d].sum()
                expected -= float((p * torch.log_softmax(logits[b, d], -1)[ids[b, d]]).sum())
    assert float(soft_cross_entropy(logits, ids, probs, valid)) == pytest.approx(
        expected / 2, rel=1e-6
    )


def test_sampled_softmax_with_every_token_is_exact():
    features, weight = torch.randn(3, 2, 6), torch.randn(50, 6)
    ids = torch.randint(0, 50, (3, 2, 4))
    probs, valid = torch.rand(3, 2, 4), torch.ones(3, 2, dtype=torch.bool)
    full = soft_cross_entropy(features @ weight.T, ids, probs, valid)
    sampled = loop.sampled_soft_cross_entropy(
        features,
        weight,
        ids,
        probs,
        valid,
        negatives=50,
        generator=torch.Generator().manual_seed(0),
    )
    torch.testing.assert_close(sampled, full)
    fewer = loop.sampled_soft_cross_entropy(
        features, weight, ids, probs, valid, negatives=5, generator=torch.Generator().manual_seed(0)
    )
    assert torch.isfinite(fewer) and float(fewer) != float(full)


@pytest.fixture(scope="module")
def trained(tiny_model, prompt_source, tmp_path_factory):
    out = tmp_path_factory.mktemp("redrafter")
    report = train_redrafter(
        tiny_model,
        out,
        steps=150,
        prompts=48,
        heldout_prompts=8,
        max_new_tokens=20,
        top_k=8,
        beam_width=3,
        beam_length=4,
        batch_size=32,
        lr=3e-3,
        prompt_source=prompt_source,
        cache=tmp_path_factory.mktemp("cache"),
        eval_steps=75,
        shortlist=64,
        progress=False,
    )
    return out, report


def test_training_history_has_every_evaluation(trained):
    """Evaluations every ``eval_steps`` on ``eval_sequences`` sequences, then a final one on all
    (that training improves the drafter is tested against a control in
    test_training_improves.py)."""
    _, report = trained
    history = report["history"]
    assert [row["step"] for row in history] == [75, 150, 150]
    assert [row["heldout_sequences"] for row in history] == [32, 32, "all"]


def test_trained_drafter_carries_its_shortlist(trained):
    out, report = trained
    config, weights = load_redrafter_checkpoint(out)
    assert config.shortlist_size == 64 and weights["vocab_shortlist"].shape == (64,)
    assert report["shortlist"] == 64 and 0.0 < report["heldout_coverage"] <= 1.0


def test_the_evaluation_task_drafts_from_the_checkpoints_shortlist(trained, tiny_target, tiny_data):
    """``specdec train``'s held-out evaluation of a saved checkpoint (``evaluate_drafter``) loads
    its shortlist as inference does, and scores what a task built by hand from the checkpoint
    scores."""
    from specdec.plugins.registry import default_registry

    out, _ = trained
    task = default_registry().drafter_spec("redrafter").evaluation_task(out, tiny_target, {})
    config, weights = load_redrafter_checkpoint(out)
    assert (
        task.shortlist is not None
        and task.shortlist.tolist() == weights["vocab_shortlist"].tolist()
    )
    by_hand = RedrafterTask(
        config,
        embed_tokens=tiny_target.embed_tokens,
        lm_head=tiny_target.lm_head,
        shortlist=weights.pop("vocab_shortlist"),
    )
    by_hand.module.load_weights(weights)
    heldout = tiny_data["heldout"]
    scores = [
        loop.walk_tokens_per_step(heldout, lambda idx, t=t: t.accept(heldout, idx))
        for t in (task, by_hand)
    ]
    assert scores[0] == scores[1] and scores[0]["tokens_per_step"] >= 1.0


def test_offline_acceptance_equals_the_decode_loop(
    trained, tiny_model, tiny_target, tiny_data, prompt_source
):
    """Replaying decoding over the teacher data counts what ``specdec.stream`` accepts step by
    step."""
    out, _ = trained
    config, weights = load_redrafter_checkpoint(out)
    shortlist = weights.pop("vocab_shortlist")
    task = RedrafterTask(
        config,
        embed_tokens=tiny_target.embed_tokens,
        lm_head=tiny_target.lm_head,
        shortlist=shortlist,
    )
    task.module.load_weights(weights)
    heldout = tiny_data["heldout"]
    visited = {}

    def accept(indices):
        accepted = task.accept(heldout, indices)
        visited.update(zip(indices.tolist(), accepted.tolist(), strict=True))
        return accepted

    loop.walk_tokens_per_step(heldout, accept)
    checked = 0
    for row, start in enumerate(heldout.starts().tolist()):
        prompt = prompt_source("heldout", row, 1)[0]
        steps = list(
            specdec.stream(
                tiny_model,
                prompt,
                drafter=str(out),
                backend="numpy",
                max_new_tokens=20,
                lookup=False,
            )
        )[1:]  # the drafter alone, as the replay counts it
        position = start
        for step in steps:
            offline = visited[position]
            if (
                heldout.remaining[position] >= config.beam_length - 1
            ):  # the whole window is in the data
                assert int(step.num_accepted[0]) == offline, (
                    f"sequence {row}, position {position - start}"
                )
                checked += 1
            position += offline + 1
    assert checked >= 10


def test_interrupted_training_resumes_to_the_same_weights(
    tiny_target, tiny_data, tmp_path, monkeypatch
):
    config = default_config(vocab_size=128, hidden_size=32, target={}, beam_width=2, beam_length=3)
    settings = TrainSettings(steps=12, batch_size=8, eval_steps=6, eval_sequences=2, seed=5)

    def run(folder, **kwargs):
        task = RedrafterTask(
            config, embed_tokens=tiny_target.embed_tokens, lm_head=tiny_target.lm_head, seed=2
        )
        train(
            task,
            tiny_data["train"],
            tiny_data["heldout"],
            settings,
            folder,
            progress=False,
            **kwargs,
        )
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


class _RunsCode:
    """Unpickling this calls ``Path.touch`` on a marker file: a stand-in for any command."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (Path.touch, (Path(self.marker),))


def test_resume_never_unpickles_a_crafted_state_file(tiny_target, tiny_data, tmp_path):
    """A run folder whose (older-format) ``trainer_state.pt`` is a pickle that runs code: --resume
    refuses it with a one-line error naming the file, and the code never runs."""
    config = default_config(vocab_size=128, hidden_size=32, target={}, beam_width=2, beam_length=3)
    settings = TrainSettings(steps=2, batch_size=4, eval_steps=2, eval_sequences=1, seed=5)
    out, marker = tmp_path / "run", tmp_path / "ran-code"
    task = RedrafterTask(
        config, embed_tokens=tiny_target.embed_tokens, lm_head=tiny_target.lm_head, seed=2
    )
    train(task, tiny_data["train"], tiny_data["heldout"], settings, out, progress=False)
    (out / loop.STATE_FILE).unlink()
    torch.save({"step": 1, "payload": _RunsCode(marker)}, out / LEGACY_STATE_FILE)
    with pytest.raises(TrainingOutputError, match="trainer_state.pt was not loaded.*can run code"):
        train(
            task,
            tiny_data["train"],
            tiny_data["heldout"],
            settings,
            out,
            progress=False,
            resume=True,
        )
    assert not marker.exists()
    (out / LEGACY_STATE_FILE).write_bytes(b"not a state")  # the current file damaged: refused too
    (out / LEGACY_STATE_FILE).rename(out / loop.STATE_FILE)
    with pytest.raises(TrainingOutputError, match="is not a trainer state"):
        train(
            task,
            tiny_data["train"],
            tiny_data["heldout"],
            settings,
            out,
            progress=False,
            resume=True,
        )


def test_trainer_state_round_trips_every_value_kind(tmp_path):
    module = torch.nn.Linear(3, 2)
    optimizer = torch.optim.AdamW(module.parameters())
    module(torch.ones(1, 3)).sum().backward()
    optimizer.step()
    state = {
        "module": module.state_dict(),
        "optimizer": optimizer.state_dict(),
        "rng": np.random.default_rng(7).bit_generator.state,
        "history": [{"loss": float("nan")}],
        "best": None,
        "settings": {"eval_minutes": (1, 2)},
    }
    save_state(tmp_path / "state.safetensors", state)
    loaded = load_state(tmp_path / "state.safetensors")
    rng = np.random.default_rng(0)
    rng.bit_generator.state = loaded["rng"]
    assert rng.integers(0, 1 << 30) == np.random.default_rng(7).integers(0, 1 << 30)
    assert loaded["settings"] == {"eval_minutes": (1, 2)} and loaded["best"] is None
    assert np.isnan(loaded["history"][0]["loss"])
    restored = torch.optim.AdamW(torch.nn.Linear(3, 2).parameters())
    restored.load_state_dict(loaded["optimizer"])
    for key in ("exp_avg", "exp_avg_sq", "step"):
        assert torch.equal(
            restored.state_dict()["state"][0][key], optimizer.state_dict()["state"][0][key]
        )
    for name, value in module.state_dict().items():
        assert torch.equal(loaded["module"][name], value)


def test_float16_training_checkpoint_keeps_shortlist_ids_exact(tmp_path):
    """Training checkpoints cast weights to float16 to ship; token ids (here above float16's
    exact-integer range of 2048) must stay integers."""
    vocab, hidden = 5000, 8
    config = default_config(vocab_size=vocab, hidden_size=hidden, target={"name": "tiny"})
    ids = np.array([0, 2049, 2051, 4093, 4999])
    table = torch.randn(vocab, hidden, generator=torch.Generator().manual_seed(0))
    task = RedrafterTask(config, embed_tokens=table, lm_head=table, shortlist=ids)
    task.save(tmp_path, dtype=np.float16)
    loaded_config, weights = load_redrafter_checkpoint(tmp_path)
    assert loaded_config.shortlist_size == 5 and weights["vocab_shortlist"].dtype == np.int64
    assert weights["vocab_shortlist"].tolist() == ids.tolist()


def test_resuming_a_finished_run_rewrites_its_files(trained, tiny_model, prompt_source, tmp_path):
    """No steps left to train: the checkpoint is written again (here in float16), history kept."""
    import shutil

    from safetensors.numpy import load_file

    out, report = trained
    copy = tmp_path / "copy"
    shutil.copytree(out, copy)
    again = train_redrafter(
        tiny_model,
        copy,
        steps=150,
        prompts=48,
        heldout_prompts=8,
        max_new_tokens=20,
        top_k=8,
        beam_width=3,
        beam_length=4,
        batch_size=32,
        lr=3e-3,
        prompt_source=prompt_source,
        cache=tmp_path / "cache",
        eval_steps=75,
        shortlist=64,
        resume=True,
        save_dtype="float16",
        progress=False,
    )
    assert again["history"] == report["history"] and again["training"]["steps"] == 150
    weights = load_file(str(copy / "model.safetensors"))
    assert (
        weights["head_proj.weight"].dtype == np.float16
        and weights["vocab_shortlist"].dtype == np.int64
    )


def test_a_run_can_start_from_a_checkpoint(trained, tiny_model, prompt_source, tmp_path):
    """--init: the run starts from the checkpoint's weights and shortlist (at learning rate 0 it
    saves them back unchanged), or with a shortlist chosen from its own data when asked
    (``--shortlist``); a checkpoint of another kind is refused."""
    from safetensors.numpy import load_file

    from specdec.errors import InvalidInputError
    from specdec.testing import make_random_drafter

    out, _ = trained
    common = dict(
        prompts=48,
        heldout_prompts=8,
        max_new_tokens=20,
        top_k=8,
        beam_width=3,
        beam_length=4,
        batch_size=32,
        prompt_source=prompt_source,
        cache=tmp_path / "cache",
        progress=False,
        shortlist=16,
    )
    report = train_redrafter(tiny_model, tmp_path / "warm", steps=2, lr=0.0, init=out, **common)
    before, after = (
        load_file(str(out / "model.safetensors")),
        load_file(str(tmp_path / "warm" / "model.safetensors")),
    )
    assert report["shortlist"] == 64, (
        "the shortlist comes from the checkpoint, not from --shortlist"
    )
    assert sorted(before) == sorted(after)
    for name in before:
        np.testing.assert_array_equal(after[name], before[name], err_msg=name)
    fresh = train_redrafter(
        tiny_model,
        tmp_path / "relisted",
        steps=2,
        lr=0.0,
        init=out,
        keep_init_shortlist=False,
        **common,
    )
    relisted = load_file(str(tmp_path / "relisted" / "model.safetensors"))
    assert fresh["shortlist"] == 16 and relisted["vocab_shortlist"].shape == (16,), (
        "a new shortlist of the asked size"
    )
    for name in before:
        if name != "vocab_shortlist":
            np.testing.assert_array_equal(relisted[name], before[name], err_msg=name)
    medusa = make_random_drafter(tmp_path / "medusa", tiny_model, kind="medusa", seed=1)
    with pytest.raises(InvalidInputError, match="holds a 'specdec_medusa' checkpoint"):
        train_redrafter(tiny_model, tmp_path / "wrong", steps=2, init=medusa, **common)
