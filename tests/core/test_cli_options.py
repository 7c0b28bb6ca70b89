"""A drafter with options on the command line, ``--drafter NAME:key=value,...``: read by the
parser ``specdec bench --methods`` shares (``specdec.generation.options``), applied by ``specdec
generate``, and an option the drafter does not take refused in one line before anything loads."""

from __future__ import annotations

import inspect

import pytest

import specdec
from specdec.cli.main import main
from specdec.errors import InvalidInputError
from specdec.generation.options import OWN_ARGUMENTS, parse_options
from specdec.testing import make_random_drafter


@pytest.fixture(scope="module")
def redrafter(model_dir, tmp_path_factory):
    folder = tmp_path_factory.mktemp("options") / "redrafter"
    return make_random_drafter(folder, model_dir, kind="redrafter", seed=1)


def test_options_are_typed_as_generate_takes_them():
    name, options = parse_options("redrafter:w=4,l=5,lookup=false,int8=TRUE,choices=cpu16")
    assert name == "redrafter"
    assert options == {
        "beam_width": 4,
        "beam_length": 5,
        "lookup": False,
        "int8": True,
        "choices": "cpu16",
    }
    eagle = parse_options("eagle:total_tokens=8,tree_top_k=2")
    assert eagle == ("eagle", {"total_tokens": 8, "tree_top_k": 2})
    assert parse_options("lookup:k=3") == ("lookup", {"draft_length": 3})
    assert parse_options("draft_model:draft=qwen2.5-coder-0.5b") == (
        "draft_model",
        {"draft_model": "qwen2.5-coder-0.5b"},
    )
    assert parse_options("redrafter:lookup=16,") == ("redrafter", {"lookup": 16})
    assert parse_options("none") == ("none", {})


def test_a_folder_is_a_name_whole(tmp_path):
    folder = tmp_path / "run:3"
    folder.mkdir()
    assert parse_options(str(folder)) == (str(folder), {})
    assert parse_options(f"{tmp_path / 'ckpt'}:w=2") == (str(tmp_path / "ckpt"), {"beam_width": 2})


@pytest.mark.parametrize(
    "spec, says",
    [
        ("redrafter:w", "bad option 'w'; write key=value pairs"),
        ("redrafter:beam-width=4", "bad option"),
        (":w=4", "names no drafter"),
        ("redrafter:w=4,beam_width=2", "gives beam_width twice"),
        ("redrafter:temperature=0.5", "temperature is not a drafter option"),
        ("redrafter:slots=2", "slots is not a drafter option"),
    ],
)
def test_malformed_options_are_refused(spec, says):
    with pytest.raises(InvalidInputError, match=says):
        parse_options(spec)


def test_every_argument_generate_and_engine_take_by_name_is_refused_as_an_option():
    named = {
        name
        for function in (specdec.generate, specdec.Engine.__init__)
        for name, p in inspect.signature(function).parameters.items()
        if p.kind is not inspect.Parameter.VAR_KEYWORD and name != "self"
    }
    assert named <= set(OWN_ARGUMENTS), sorted(named - set(OWN_ARGUMENTS))


def test_generate_applies_the_drafters_options(model_dir, redrafter, monkeypatch, capsys):
    from specdec.generation import api

    plans = []
    steps = api.decode_steps

    def recorded(plan, *args, **kwargs):
        plans.append(plan)
        return steps(plan, *args, **kwargs)

    monkeypatch.setattr(api, "decode_steps", recorded)
    common = [
        "generate",
        "--model",
        str(model_dir),
        "--prompt-ids",
        "[1, 2, 3, 1, 2, 3]",
        "--backend",
        "numpy",
        "--max-new-tokens",
        "6",
    ]
    assert main([*common, "--drafter", f"{redrafter}:w=2,l=3,lookup=false"]) == 0
    drafter = plans[-1].drafter
    assert (drafter.beam_width, drafter.beam_length) == (2, 3)
    speculative = capsys.readouterr().out
    assert main([*common, "--drafter", "lookup:k=3"]) == 0
    assert plans[-1].drafter.draft_length == 3
    lookup = capsys.readouterr().out
    assert main([*common, "--drafter", "none"]) == 0
    assert speculative == lookup == capsys.readouterr().out  # greedy: plain decoding's tokens


def test_an_unknown_option_is_one_line_naming_those_taken_before_the_model_loads(
    model_dir, redrafter, monkeypatch, capsys
):
    from specdec.generation import loading

    def no_load(*args, **kwargs):
        raise AssertionError("the model was loaded")

    monkeypatch.setattr(loading, "load_with_choice", no_load)
    code = main(
        [
            "generate",
            "--model",
            str(model_dir),
            "--prompt",
            "hi",
            "--backend",
            "numpy",
            "--drafter",
            f"{redrafter}:beam_wdith=3",
        ]
    )
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and "Traceback" not in err, err
    taken = "it takes: beam_length, beam_width, int8, sample"
    assert "does not take option(s) ['beam_wdith']" in err and taken in err, err
    assert "lookup" in err and "verifier" in err, err  # generate's own, taken for every drafter


def test_an_option_given_twice_is_refused(model_dir, redrafter, capsys):
    code = main(
        [
            "generate",
            "--model",
            str(model_dir),
            "--prompt",
            "hi",
            "--backend",
            "numpy",
            "--drafter",
            f"{redrafter}:w=2",
            "--beam-width",
            "3",
        ]
    )
    err = capsys.readouterr().err
    assert code == 2 and "beam_width is given twice" in err and "--beam-width" in err, err


def test_a_checkpoint_written_as_bench_writes_it(model_dir, redrafter, capsys):
    """``--drafter redrafter:drafter=FOLDER`` (a bench method's way to name a checkpoint) decodes
    with the folder; a folder of another kind is refused naming both."""
    common = ["generate", "--model", str(model_dir), "--prompt-ids", "[1, 2, 3]"]
    common += ["--backend", "numpy", "--max-new-tokens", "4"]
    assert main([*common, "--drafter", f"redrafter:drafter={redrafter},w=2"]) == 0
    capsys.readouterr()
    assert main([*common, "--drafter", f"medusa:drafter={redrafter}"]) == 2
    err = capsys.readouterr().err
    assert "holds a checkpoint of redrafter, not medusa" in err and len(err.splitlines()) == 1


def test_generate_takes_speculation_as_its_own_flag(model_dir, redrafter, capsys):
    """``specdec generate --speculation never`` (as the README and ``serve`` spell it) decodes
    plainly; given also in --drafter it is refused as given twice."""
    common = ["generate", "--model", str(model_dir), "--prompt-ids", "[1, 2, 3, 1, 2, 3]"]
    common += ["--backend", "numpy", "--max-new-tokens", "6", "--drafter", "lookup"]
    assert main([*common, "--speculation", "never"]) == 0
    assert "1.00 tokens/step" in capsys.readouterr().err
    assert main([*common[:-1], "lookup:speculation=always", "--speculation", "never"]) == 2
    assert "speculation is given twice" in capsys.readouterr().err


def test_a_short_option_name_a_drafter_does_not_take_is_named_as_written(model_dir, capsys):
    """`--drafter multicopy:w=2` was refused as "does not take option(s) ['beam_width']": the
    user typed w, and the message did not say that w stands for beam_width."""
    from specdec.cli.main import main

    argv = ["generate", "--model", str(model_dir), "--prompt", "hi", "--backend", "numpy"]
    assert main([*argv, "--drafter", "lookup:w=2"]) == 2
    err = capsys.readouterr().err
    assert (
        "does not take option(s) ['beam_width'] (beam_width or its short name w); it takes:" in err
    )
