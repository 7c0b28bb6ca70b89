"""Medusa training: checkpoint names and math equal the reference, the loss trains head k on the
token k+2 after the position, and offline acceptance equals the decode loop."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import specdec
from specdec.training.evaluate import gather_window, walk_tokens_per_step
from specdec_medusa.checkpoint import load_medusa_checkpoint
from specdec_medusa.config import MedusaConfig
from specdec_medusa.reference import head_logits, init_random_weights
from specdec_medusa.train import MedusaNet, MedusaTask, train_medusa

V, H = 40, 8
VARIANTS = [
    dict(),
    dict(head="full", num_layers=2),
    dict(num_layers=0, num_heads=3, choices="chain4"),
]


def make_config(**overrides) -> MedusaConfig:
    return MedusaConfig(
        **{"vocab_size": V, "hidden_size": H, "head": "tied", "num_heads": 4, **overrides}
    )


@pytest.mark.parametrize("overrides", VARIANTS)
def test_parameters_are_the_checkpoint_weights(overrides):
    config = make_config(**overrides)
    shapes = {
        n: tuple(t.shape)
        for n, t in MedusaNet(config, target_lm_head=torch.randn(V, H)).state_dict().items()
    }
    assert shapes == config.weight_shapes()


@pytest.mark.parametrize("overrides", VARIANTS)
def test_logits_equal_the_reference_in_float64(overrides, tmp_path):
    rng = np.random.default_rng(2)
    config = make_config(**overrides)
    lm_head, weights = rng.normal(size=(V, H)), init_random_weights(config, rng)
    task = MedusaTask(config, lm_head=torch.from_numpy(lm_head))
    task.module.double().load_weights(weights)
    task.module.target_lm_head = torch.from_numpy(lm_head)
    hidden = rng.normal(size=(5, H))
    got = task.module(torch.from_numpy(hidden)).detach().numpy()
    np.testing.assert_allclose(
        got, head_logits(config, weights, lm_head, hidden), rtol=1e-10, atol=1e-10
    )
    loaded_config, loaded = load_medusa_checkpoint(task.save(tmp_path / "ckpt"))
    assert loaded_config == config and sorted(loaded) == sorted(weights)


def test_head_k_is_trained_on_the_token_k_plus_2_after_the_position(tiny_data):
    """With one-hot labels the loss of each head is the cross-entropy of x_{t+k+2}."""
    data = tiny_data["train"]
    config = make_config(vocab_size=128, hidden_size=32, num_heads=3, choices="chain4")
    task = MedusaTask(config, lm_head=torch.randn(128, 32))
    indices = torch.arange(0, 40, 3)
    window = gather_window(data, indices, task.depth)
    one_hot = torch.zeros_like(window.label_probs)
    one_hot[..., 0] = 1.0
    window = type(window)(
        hidden=window.hidden,
        tokens=window.tokens,
        valid=window.valid,
        label_ids=window.label_ids,
        label_probs=one_hot,
    )
    logits = task.module(window.hidden.float()).detach()
    expected = 0.0
    for b, i in enumerate(indices.tolist()):
        for k in range(3):
            if k + 1 <= data.remaining[i]:
                expected -= float(torch.log_softmax(logits[b, k], -1)[data.next_tokens[i + k + 1]])
    assert float(task.loss(window).detach()) == pytest.approx(expected / len(indices), rel=1e-5)


@pytest.fixture(scope="module")
def trained(tiny_model, prompt_source, tmp_path_factory):
    out = tmp_path_factory.mktemp("medusa")
    report = train_medusa(
        tiny_model,
        out,
        steps=150,
        prompts=48,
        heldout_prompts=8,
        max_new_tokens=20,
        top_k=8,
        batch_size=32,
        lr=3e-3,
        prompt_source=prompt_source,
        cache=tmp_path_factory.mktemp("cache"),
        config_overrides=dict(choices="small8"),
        progress=False,
    )
    return out, report


def test_checkpoint_names_its_target(trained, tiny_model):
    """(That training improves the drafter is tested against a control in
    test_training_improves.py.)"""
    from specdec.training.teacher import target_fingerprint

    out, report = trained
    config, _ = load_medusa_checkpoint(out)
    assert (
        config.target["fingerprint"]
        == report["target"]["fingerprint"]
        == target_fingerprint(tiny_model)
    )
    assert [row["heldout_sequences"] for row in report["history"]] == ["all"]


def test_offline_acceptance_equals_the_decode_loop(
    trained, tiny_model, tiny_target, tiny_data, prompt_source
):
    out, _ = trained
    config, weights = load_medusa_checkpoint(out)
    task = MedusaTask(config, lm_head=tiny_target.lm_head)
    task.module.load_weights(weights)
    heldout = tiny_data["heldout"]
    visited = {}

    def accept(indices):
        accepted = task.accept(heldout, indices)
        visited.update(zip(indices.tolist(), accepted.tolist(), strict=True))
        return accepted

    walk_tokens_per_step(heldout, accept)
    checked = 0
    for row, start in enumerate(heldout.starts().tolist()):
        prompt = prompt_source("heldout", row, 1)[0]
        steps = list(
            specdec.stream(tiny_model, prompt, drafter=str(out), backend="numpy", max_new_tokens=20)
        )[1:]
        position = start
        for step in steps:
            offline = visited[position]
            if heldout.remaining[position] >= config.num_heads:
                assert int(step.num_accepted[0]) == offline, (
                    f"sequence {row}, position {position - start}"
                )
                checked += 1
            position += offline + 1
    assert checked >= 10
