"""Each bad argument is a clear SpecdecError up front, naming the argument or the file."""

from __future__ import annotations

import shutil

import pytest

import specdec
from specdec.decode.requests import Request, RequestState


@pytest.mark.parametrize(
    "prompt, message",
    [
        (b"hello", "the prompt is bytes: decode it to a str"),
        (3.5, "the prompt must be a string, a list of token ids.*got float"),
        ({"role": "user"}, "the prompt must be a string.*got dict"),
        ([[1, 2], b"ab"], "prompt 1 of the batch is bytes"),
        ([[1, 2], 7.0], "prompt 1 of the batch must be"),
        ([], "the prompt is empty"),
    ],
)
def test_prompt_of_the_wrong_kind(target, prompt, message):
    with pytest.raises(specdec.InvalidInputError, match=message):
        specdec.generate(target, prompt, drafter="none", backend="numpy", max_new_tokens=2)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"temperature": None}, "temperature must be a number >= 0 .*got None"),
        ({"temperature": "hot"}, "temperature must be a number"),
        ({"temperature": 1.0, "top_p": "x"}, "top_p must be a number"),
        ({"temperature": 1.0, "seed": -3}, "seed must be an integer >= 0"),
        ({"temperature": 1.0, "seed": [1, 2]}, "seed lists 2 seeds for a batch of 1"),
        ({"temperature": 1.0, "seed": "7"}, "seed must be an integer"),
    ],
)
def test_sampling_arguments(target, kwargs, message):
    with pytest.raises(specdec.InvalidInputError, match=message):
        specdec.generate(
            target, [1, 2], drafter="none", backend="numpy", max_new_tokens=2, **kwargs
        )


def test_budget_and_prompt_beyond_the_context_are_refused_up_front(target):
    with pytest.raises(
        specdec.InvalidInputError,
        match="max_new_tokens=10000000000 .* context of 4096 tokens: ask for at most 4094",
    ):
        specdec.generate(target, [1, 2], drafter="none", backend="numpy", max_new_tokens=10**10)
    with pytest.raises(
        specdec.InvalidInputError,
        match="the prompt has 4096 tokens; the model's context holds 4096",
    ):
        specdec.generate(target, [1] * 4096, drafter="none", backend="numpy", max_new_tokens=1)


def test_request_history_holds_prompt_and_kept_tokens():
    state = RequestState(Request(prompt=[1, 2, 3], max_new_tokens=5, stop_token_ids=[9]), slot=0)
    assert (
        state.emit([4, 5]) == [4, 5] and list(state.history) == [1, 2, 3, 4, 5] and state.root == 5
    )
    assert state.emit([6, 9, 7]) == [6, 9] and state.done  # through the stop token, not past it
    assert state.emit([8]) == [] and list(state.history) == [1, 2, 3, 4, 5, 6, 9]
    capped = RequestState(Request(prompt=[1], max_new_tokens=2), slot=0)
    assert capped.emit([4, 5, 6]) == [4, 5] and capped.done


def test_missing_drafter_path_is_named(target, tmp_path):
    with pytest.raises(
        specdec.InvalidInputError, match=f"drafter checkpoint folder {tmp_path / 'nope'} does not"
    ):
        specdec.generate(target, [1, 2], drafter=str(tmp_path / "nope"), backend="numpy")


def test_corrupt_files_are_named(model_dir, tmp_path):
    from specdec.testing import make_random_drafter

    model = tmp_path / "model"
    shutil.copytree(model_dir, model)
    (model / "config.json").write_text("{not json")
    with pytest.raises(
        specdec.CorruptFileError, match=f"{model / 'config.json'} is not valid JSON"
    ):
        specdec.load(model, backend="numpy")
    shutil.copy(model_dir / "config.json", model / "config.json")
    weights = model / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-10])
    with pytest.raises(
        specdec.CorruptFileError, match=f"weights file {weights} is damaged.*truncated"
    ):
        specdec.generate(model, [1, 2], drafter="none", backend="numpy")
    drafter = make_random_drafter(tmp_path / "rd", model_dir, kind="redrafter", seed=1)
    (drafter / "config.json").write_text("[1, 2")
    with pytest.raises(
        specdec.CorruptFileError,
        match=f"drafter config {drafter / 'config.json'} is not valid JSON",
    ):
        specdec.generate(model_dir, [1, 2], drafter=drafter, backend="numpy")
