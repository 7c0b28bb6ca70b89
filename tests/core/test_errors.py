"""Bad input gets a clear error naming the problem and the fix, and leaves no state behind."""

from __future__ import annotations

import json

import pytest

import specdec
from specdec.testing import make_random_drafter, make_random_model


@pytest.fixture(scope="module")
def redrafter(model_dir, tmp_path_factory):
    return make_random_drafter(
        tmp_path_factory.mktemp("d") / "rd", model_dir, kind="redrafter", seed=0
    )


@pytest.mark.parametrize(
    "prompt, kwargs, message",
    [
        ([], {}, "prompt is empty"),
        ("", {}, "empty"),
        ([[1, 2], []], {}, "prompt 1 of the batch is empty"),
        ([1, 96], {}, "outside the vocabulary [0, 96)"),
        ([1, -1], {}, "outside the vocabulary"),
        ([1, 2.5], {}, "integer token ids"),
        ([1], {"max_new_tokens": 0}, "max_new_tokens must be an integer >= 1"),
        ([1], {"temperature": -0.5}, "temperature must be a finite number >= 0"),
        ([1], {"temperature": float("nan")}, "temperature must be a finite number >= 0"),
        ([1], {"top_p": 0.0}, "top_p must be in (0, 1]"),
        ([1], {"top_p": 1.5}, "top_p must be in (0, 1]"),
        ([1], {"top_k": 0}, "top_k must be a positive integer"),
    ],
)
def test_invalid_arguments(target, prompt, kwargs, message):
    with pytest.raises(specdec.InvalidInputError) as info:
        specdec.generate(target, prompt, drafter="none", backend="numpy", **kwargs)
    assert message in str(info.value), f"generate({prompt!r}, {kwargs}) said: {info.value}"


def test_unknown_names_list_what_is_installed(target):
    with pytest.raises(
        specdec.UnknownPluginError,
        match=r"unknown backend 'tensorflow'; installed backends: .*numpy",
    ):
        specdec.generate(target, [1], drafter="none", backend="tensorflow")
    with pytest.raises(
        specdec.UnknownPluginError,
        match=r"unknown drafter 'hydra'; installed drafters: .*medusa.*redrafter",
    ):
        specdec.generate(target, [1], drafter="hydra", backend="numpy")
    with pytest.raises(
        specdec.UnknownPluginError,
        match=r"unknown verifier 'lenient'; installed verifiers: .*exact.*greedy",
    ):
        specdec.generate(target, [1], drafter="none", backend="numpy", verifier="lenient")


def test_unknown_drafter_option(target, redrafter):
    with pytest.raises(
        specdec.InvalidInputError,
        match=r"does not take option\(s\) \['beam_wdith'\]; it takes: .*beam_width",
    ):
        specdec.generate(target, [1], drafter=redrafter, backend="numpy", beam_wdith=3)


def test_trained_drafter_needs_checkpoint(target):
    with pytest.raises(
        specdec.InvalidInputError, match="needs a checkpoint trained for this model"
    ):
        specdec.generate(target, [1], drafter="redrafter", backend="numpy")


@pytest.mark.parametrize("kind", ["redrafter", "medusa"])
@pytest.mark.parametrize("change", [{"hidden_size": 48}, {"vocab_size": 100}])
def test_drafter_for_another_model(target, tmp_path, kind, change):
    other = make_random_model(
        tmp_path / "other",
        **{
            **dict(
                vocab_size=96, hidden_size=32, num_layers=1, num_heads=4, num_kv_heads=2, seed=9
            ),
            **change,
        },
    )
    drafter = make_random_drafter(tmp_path / kind, other, kind=kind, seed=1)
    with pytest.raises(specdec.IncompatibleDrafterError, match="trained for another model"):
        specdec.generate(target, [1], drafter=drafter, backend="numpy")


def test_checkpoint_with_unknown_model_type(target, tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "eagle3"}))
    with pytest.raises(specdec.InvalidInputError, match="model_type 'eagle3'"):
        specdec.generate(target, [1], drafter=tmp_path, backend="numpy")


def test_missing_model_folder(tmp_path):
    with pytest.raises((specdec.SpecdecError, ValueError, FileNotFoundError), match="config.json"):
        specdec.generate(tmp_path / "nowhere", [1], drafter="none", backend="numpy")


def test_rejected_calls_leave_no_state(model_dir, redrafter):
    """A loaded target used by failing calls decodes exactly as a fresh one afterwards."""
    fresh = specdec.generate(
        specdec.load(model_dir, backend="numpy"),
        [[3, 4], [5]],
        drafter=redrafter,
        backend="numpy",
        max_new_tokens=6,
    ).tokens
    used = specdec.load(model_dir, backend="numpy")
    specdec.generate(used, [[9, 9, 9]], drafter="none", backend="numpy", max_new_tokens=3)
    for bad in ({"max_new_tokens": 0}, {"top_p": 2.0}, {"verifier": "nope"}):
        with pytest.raises(specdec.SpecdecError):
            specdec.generate(used, [[3, 4], [5]], drafter=redrafter, backend="numpy", **bad)
    with pytest.raises(specdec.InvalidInputError):
        specdec.generate(used, [[3, 4], [500]], drafter=redrafter, backend="numpy")
    again = specdec.generate(
        used, [[3, 4], [5]], drafter=redrafter, backend="numpy", max_new_tokens=6
    ).tokens
    assert again == fresh
