"""Teacher data: the target's greedy continuations, hidden states and soft labels, and their
cache."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from specdec.reference.model import load_target
from specdec.testing import greedy_continuations
from specdec.testing.batch import Batch
from specdec.training.run import build_teacher_data
from specdec.training.teacher import greedy_teacher, target_fingerprint
from specdec.training.records import TeacherData


def test_fingerprint_matches_the_reference(tiny_model):
    assert target_fingerprint(tiny_model) == load_target(tiny_model).fingerprint


def test_continuations_are_plain_greedy_decoding(tiny_model, tiny_target, prompt_source):
    prompts = prompt_source("train", 0, 6)
    data = greedy_teacher(
        tiny_target.model,
        prompts,
        max_new_tokens=16,
        top_k=4,
        eos_token_ids=(3,),
        batch_size=4,
        hidden_dtype=torch.float32,
    )
    reference = greedy_continuations(load_target(tiny_model), prompts, 16)
    for row, expected in enumerate(reference):
        got = data.next_tokens[data.sequence == row].tolist()
        assert got == expected[: len(got)], (
            f"greedy_teacher row {row}: {got} != reference {expected}"
        )
        assert len(got) == 16 or got[-1] == 3, (
            f"row {row} stopped early without emitting eos: {got}"
        )


def test_hidden_states_match_the_reference_and_a_full_forward(
    tiny_model, tiny_target, prompt_source
):
    prompts = prompt_source("heldout", 0, 3)
    data = greedy_teacher(
        tiny_target.model,
        prompts,
        max_new_tokens=10,
        top_k=4,
        batch_size=3,
        hidden_dtype=torch.float32,
    )
    reference = Batch(load_target(tiny_model, slots=len(prompts))).prefill(prompts)
    first = data.starts()
    np.testing.assert_allclose(
        data.hidden[first].double().numpy(),
        reference.hidden[:, 0],
        atol=1e-4,
        rtol=1e-4,
        err_msg="greedy_teacher: hidden at the last prompt position differs from the reference",
    )
    for row, prompt in enumerate(prompts):
        rows = data.sequence == row
        continuation = data.next_tokens[rows].tolist()
        ids = torch.tensor([prompt + continuation[:-1]])
        with torch.no_grad():
            full = tiny_target.model.model(input_ids=ids).last_hidden_state[0, len(prompt) - 1 :]
        torch.testing.assert_close(data.hidden[rows], full, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("slots, budget", [(5, 1024), (3, 1024), (3, 1)])
def test_batching_does_not_change_the_data(tiny_target, prompt_source, monkeypatch, slots, budget):
    """Fewer slots than prompts (rows admitted as others end) and one prompt per forward at most
    (a budget of 1 token) give each prompt the data it gets decoded alone."""
    from specdec.training import teacher

    prompts = prompt_source("train", 10, 5)
    monkeypatch.setattr(teacher, "PREFILL_BUDGET", budget)
    batched = greedy_teacher(
        tiny_target.model,
        prompts,
        max_new_tokens=12,
        top_k=4,
        batch_size=slots,
        eos_token_ids=(3,),
        hidden_dtype=torch.float32,
    )
    assert batched.num_sequences == len(prompts)
    for row, prompt in enumerate(prompts):
        single = greedy_teacher(
            tiny_target.model,
            [prompt],
            max_new_tokens=12,
            top_k=4,
            eos_token_ids=(3,),
            hidden_dtype=torch.float32,
        )
        rows = batched.sequence == row
        assert batched.next_tokens[rows].tolist() == single.next_tokens.tolist(), (
            f"row {row} (in-flight batching)"
        )
        torch.testing.assert_close(batched.hidden[rows], single.hidden, atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(
            batched.label_probs[rows], single.label_probs, atol=1e-3, rtol=1e-3
        )
        assert torch.equal(batched.label_ids[rows, 0], single.label_ids[:, 0])


def test_soft_labels_and_bookkeeping(tiny_data):
    data = tiny_data["train"]
    assert torch.equal(data.label_ids[:, 0], data.next_tokens), (
        "the top soft label is the greedy token"
    )
    probs = data.label_probs.float()
    assert bool((probs[:, :-1] >= probs[:, 1:]).all()) and bool((probs.sum(-1) <= 1.001).all())
    starts = data.starts()
    assert starts.numel() == data.num_sequences == 48
    ends = torch.cat([starts[1:], torch.tensor([data.num_positions])]) - 1
    assert bool((data.remaining[ends] == 0).all()) and bool(
        (data.remaining[starts] == ends - starts).all()
    )


def test_cache_is_reused_and_identical(tiny_target, tmp_path, prompt_source):
    kwargs = dict(
        prompts=8,
        heldout_prompts=4,
        max_new_tokens=6,
        top_k=4,
        seed=0,
        cache=tmp_path,
        prompt_source=prompt_source,
        progress=False,
    )
    first, stats, _ = build_teacher_data(tiny_target, **kwargs)
    again, stats_again, _ = build_teacher_data(tiny_target, **kwargs)
    assert stats["train"]["shards_made"] == 1 and stats_again["train"]["shards_reused"] == 1
    assert stats_again["train"]["shards_made"] == 0
    for split in ("train", "heldout"):
        for name in ("hidden", "next_tokens", "label_ids", "label_probs", "remaining", "sequence"):
            assert torch.equal(getattr(first[split], name), getattr(again[split], name)), (
                f"{split}.{name}"
            )
    other, stats_other, _ = build_teacher_data(tiny_target, **{**kwargs, "top_k": 5})
    assert stats_other["train"]["shards_made"] == 1, "different settings must not reuse the cache"
    assert other["train"].label_ids.shape[1] == 5


def test_concat_renumbers_sequences(tiny_data):
    data = tiny_data["heldout"]
    joined = TeacherData.concat([data, data])
    assert joined.num_sequences == 2 * data.num_sequences
    assert joined.num_positions == 2 * data.num_positions


@pytest.mark.parametrize("split", ["train", "heldout"])
def test_token_prompts_are_deterministic(split, prompt_source):
    assert prompt_source(split, 0, 4)[2:] == prompt_source(split, 2, 2)


def test_prompt_positions_run_into_the_continuation(tiny_target, prompt_source):
    prompts = prompt_source("train", 20, 3)
    plain = greedy_teacher(
        tiny_target.model, prompts, max_new_tokens=5, top_k=4, hidden_dtype=torch.float32
    )
    data = greedy_teacher(
        tiny_target.model,
        prompts,
        max_new_tokens=5,
        top_k=4,
        hidden_dtype=torch.float32,
        prompt_from=1,
    )
    for row, prompt in enumerate(prompts):
        rows, plain_rows = data.sequence == row, plain.sequence == row
        continuation = plain.next_tokens[plain_rows].tolist()
        assert data.next_tokens[rows].tolist() == prompt[2:] + continuation, f"row {row}"
        ids = torch.tensor([prompt + continuation[:-1]])
        with torch.no_grad():
            full = tiny_target.model.model(input_ids=ids).last_hidden_state[0, 1:]
        torch.testing.assert_close(data.hidden[rows], full, atol=1e-4, rtol=1e-4)
        assert data.remaining[rows].tolist() == list(range(len(full) - 1, -1, -1))


def test_prompt_text_data_joins_the_training_split(tiny_target, tmp_path, prompt_source):
    kwargs = dict(
        prompts=4,
        heldout_prompts=2,
        max_new_tokens=6,
        top_k=4,
        seed=0,
        cache=tmp_path,
        prompt_source=prompt_source,
        progress=False,
    )
    plain, _, _ = build_teacher_data(tiny_target, **kwargs)
    more, stats, _ = build_teacher_data(
        tiny_target, prompt_text_prompts=4, prompt_text_new_tokens=2, **kwargs
    )
    assert stats["train"]["shards_reused"] == 1 and stats["prompt_text"]["shards_made"] == 1
    extra = more["train"].num_positions - plain["train"].num_positions
    assert extra == stats["prompt_text"]["positions"] > 4 * 2, (
        "prompt positions come on top of the new tokens"
    )
    assert more["heldout"].num_positions == plain["heldout"].num_positions
