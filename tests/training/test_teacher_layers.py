"""Teacher data with decoder layers' outputs (opt-in): they are the target's own residual stream at
every kept position, prompt positions included, and they share the cache with data without them."""

from __future__ import annotations

import pytest
import torch

from specdec.training.run import build_teacher_data
from specdec.training.teacher import greedy_teacher
from specdec.training.records import TeacherData


def full_forward_layers(model, ids: list[int]) -> tuple:
    """(output of decoder layer 0 (n, H), hidden after the final norm (n, H)), one full forward."""
    with torch.no_grad():
        out = model.model(input_ids=torch.tensor([ids]), output_hidden_states=True)
    return out.hidden_states[1][0], out.last_hidden_state[0]


def test_layers_are_the_residual_stream_of_a_full_forward(tiny_target, prompt_source):
    """Layer 0's output equals transformers' hidden_states[1]; the last layer's (1, of 2) after the
    final norm equals the stored final-norm feature, at prompt and continuation positions."""
    prompts = prompt_source("train", 30, 3)
    data = greedy_teacher(
        tiny_target.model,
        prompts,
        max_new_tokens=6,
        top_k=4,
        hidden_dtype=torch.float32,
        prompt_from=1,
        layers=(0, 1),
        batch_size=2,
    )
    assert data.layer_ids == (0, 1)
    assert data.layers.shape == (data.num_positions, 2, data.hidden.shape[1])
    norm = tiny_target.model.model.norm
    for row, prompt in enumerate(prompts):
        rows = data.sequence == row
        ids = prompt[:2] + data.next_tokens[rows].tolist()[:-1]  # the text the kept positions read
        layer0, final = full_forward_layers(tiny_target.model, ids)
        torch.testing.assert_close(data.layers[rows, 0], layer0[1:], atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(data.hidden[rows], final[1:], atol=1e-4, rtol=1e-4)
        with torch.no_grad():
            torch.testing.assert_close(
                norm(data.layers[rows, 1]), data.hidden[rows], atol=1e-4, rtol=1e-4
            )


def test_layer_outputs_select_in_order_and_name_what_is_missing(tiny_target, prompt_source):
    prompts = prompt_source("heldout", 0, 2)
    data = greedy_teacher(
        tiny_target.model,
        prompts,
        max_new_tokens=4,
        top_k=4,
        hidden_dtype=torch.float32,
        layers=(0, 1),
    )
    picked = data.layer_outputs((1, 0, 0), torch.tensor([2, 0]))
    assert torch.equal(picked[:, 0], data.layers[[2, 0], 1])
    assert torch.equal(picked[:, 2], data.layers[[2, 0], 0])
    with pytest.raises(ValueError, match=r"not \[5\]"):
        data.layer_outputs((0, 5))
    plain = greedy_teacher(
        tiny_target.model, prompts, max_new_tokens=4, top_k=4, hidden_dtype=torch.float32
    )
    assert plain.layers is None
    assert torch.equal(plain.next_tokens, data.next_tokens)
    assert torch.equal(plain.hidden, data.hidden)


def test_a_shard_without_layers_is_decoded_again_then_serves_both(
    tiny_target, tmp_path, prompt_source
):
    kwargs = dict(
        prompts=6,
        heldout_prompts=0,
        max_new_tokens=5,
        top_k=4,
        seed=0,
        cache=tmp_path,
        prompt_source=prompt_source,
        progress=False,
        hidden_dtype="float32",
    )
    plain, stats, _ = build_teacher_data(tiny_target, **kwargs)
    assert stats["train"]["shards_made"] == 1 and plain["train"].layers is None
    (file,) = (tmp_path / "teacher").glob("teacher-*.safetensors")
    assert TeacherData.stored_layers(file) == ()
    with_layers, stats, _ = build_teacher_data(tiny_target, layers=(1,), **kwargs)
    assert stats["train"]["shards_made"] == 1, "a shard lacking a layer asked for is decoded again"
    assert list((tmp_path / "teacher").glob("teacher-*.safetensors")) == [file]
    assert TeacherData.stored_layers(file) == (1,)
    again, stats, _ = build_teacher_data(tiny_target, layers=(1,), **kwargs)
    alone, stats_alone, _ = build_teacher_data(tiny_target, **kwargs)
    assert stats["train"]["shards_reused"] == stats_alone["train"]["shards_reused"] == 1
    assert alone["train"].layers is None
    assert torch.equal(again["train"].layers, with_layers["train"].layers)
    for name in ("hidden", "next_tokens", "label_ids", "label_probs", "remaining", "sequence"):
        assert torch.equal(getattr(alone["train"], name), getattr(plain["train"], name)), name
    both, stats, _ = build_teacher_data(tiny_target, layers=(0,), **kwargs)
    assert stats["train"]["shards_made"] == 1 and TeacherData.stored_layers(file) == (0, 1), (
        "a shard decoded again keeps the layers it held"
    )
    assert both["train"].layer_ids == (0,) and both["train"].layers.shape[1] == 1
