"""``specdec train`` never destroys what it did not create: --out checks, resume checks, best/last,
signals."""

from __future__ import annotations

import json
import os
import signal

import pytest

from specdec.cli import main as cli
from specdec.training import corpus as corpus_module
from specdec.training import loop as loop_module
from specdec_redrafter.checkpoint import load_redrafter_checkpoint


@pytest.fixture(scope="module")
def shared_cache(tmp_path_factory):
    """One specdec cache (corpus files, teacher data) for the module: every run reuses its teacher
    data."""
    root = tmp_path_factory.mktemp("train-safety")
    lib = root / "lib"
    lib.mkdir()
    for i in range(30):
        (lib / f"m{i}.py").write_text(
            f"def f{i}(x):\n    y = x + {i}\n    z = y * 2\n    return z - {i}\n"
        )
    return root


@pytest.fixture
def train_args(tiny_model, shared_cache, monkeypatch):
    monkeypatch.setenv("SPECDEC_CACHE", str(shared_cache / "cache"))
    lib = shared_cache / "lib"
    monkeypatch.setattr(
        corpus_module, "default_corpus", lambda cache: corpus_module.Corpus(stdlib=lib)
    )

    def args(out, *extra, steps=2):
        return [
            "train",
            "redrafter",
            "--model",
            str(tiny_model),
            "--out",
            str(out),
            "--steps",
            str(steps),
            "--prompts",
            "4",
            "--heldout-prompts",
            "2",
            "--max-new-tokens",
            "6",
            "--beam-width",
            "2",
            "--beam-length",
            "3",
            "--quiet",
            *extra,
        ]

    return args


def snapshot(folder):
    return {
        p.relative_to(folder).as_posix(): p.read_bytes()
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


def test_out_pointing_at_a_model_folder_is_refused(train_args, tiny_model, tmp_path, capsys):
    model = tmp_path / "model-copy"
    model.mkdir()
    for name in ("config.json", "model.safetensors", "tokenizer.json"):
        (model / name).write_bytes((tiny_model / name).read_bytes())
    before = snapshot(model)
    assert cli.main(train_args(model)) == 2
    err = capsys.readouterr().err
    assert "holds no training run" in err and "config.json" in err and "--overwrite" in err, err
    assert snapshot(model) == before


def test_a_second_run_without_resume_is_refused_and_resume_needs_state(
    train_args, tmp_path, capsys
):
    out = tmp_path / "run"
    assert cli.main(["train", "redrafter", *train_args(out)[2:], "--resume"]) == 2
    assert "nothing to resume" in capsys.readouterr().err
    assert not out.exists()
    assert cli.main(train_args(out)) == 0
    saved = snapshot(out)
    capsys.readouterr()
    assert cli.main(train_args(out)) == 2
    err = capsys.readouterr().err
    assert (
        "already holds a redrafter training run" in err
        and "--resume" in err
        and "--overwrite" in err
    ), err
    assert snapshot(out) == saved
    assert cli.main(["train", "medusa", *train_args(out)[2:8], "--quiet"]) == 2  # another kind
    assert "holds a redrafter training run, not a medusa one" in capsys.readouterr().err
    assert cli.main(train_args(out, "--overwrite")) == 0
    assert json.loads((out / "training_log.json").read_text())["step"] == 2


def test_resume_with_changed_settings_is_refused_unless_allowed(train_args, tmp_path, capsys):
    out = tmp_path / "run"
    assert cli.main(train_args(out)) == 0
    saved = snapshot(out)
    capsys.readouterr()
    assert cli.main(train_args(out, "--resume", "--lr", "0.05", steps=4)) == 2
    err = capsys.readouterr().err
    assert "lr: 0.001 -> 0.05" in err and "--allow-changes" in err, err
    assert snapshot(out) == saved
    assert cli.main(train_args(out, "--resume", "--lr", "0.05", "--allow-changes", steps=4)) == 0
    run = json.loads((out / "training_run.json").read_text())
    assert run["settings"]["lr"] == 0.001 and run["resumes"][-1]["changed"] == {"lr": [0.001, 0.05]}
    assert (
        cli.main(train_args(out, "--resume", "--lr", "0.05", steps=5)) == 0
    )  # as the last resume: no change


def test_best_checkpoint_is_replaced_only_by_a_score_not_worse(train_args, tmp_path, monkeypatch):
    scores = iter(
        [2.0, 1.5, 1.2, 1.2]
    )  # evaluations after steps 1 and 2, then the final (all, and the subset)

    def fake_evaluate(task, heldout, *, sequences):
        value = next(scores)
        return {"tokens_per_step": value, "mean_accepted": value - 1, "steps": 1, "histogram": [1]}

    monkeypatch.setattr(loop_module, "evaluate", fake_evaluate)
    out = tmp_path / "run"
    monkeypatch.setattr(
        loop_module.TrainSettings, "__init__", _with_eval_steps(loop_module.TrainSettings.__init__)
    )
    assert cli.main(train_args(out, steps=2)) == 0
    log = json.loads((out / "training_log.json").read_text())
    assert [row["score"] for row in log["history"]] == [2.0, 1.5, 1.2]
    assert log["best"] == {"step": 1, "score": 2.0}
    best, _ = load_redrafter_checkpoint(out)
    last, _ = load_redrafter_checkpoint(out / "last")
    assert best.beam_width == last.beam_width == 2
    assert (out / "model.safetensors").read_bytes() != (
        out / "last" / "model.safetensors"
    ).read_bytes()


def _with_eval_steps(init):
    def patched(self, *args, **kwargs):
        kwargs["eval_steps"] = 1
        init(self, *args, **kwargs)

    return patched


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_first_signal_saves_before_stopping(train_args, tmp_path, monkeypatch, capsys, signum):
    calls = []
    original = loop_module.gather_window

    def gather_then_signal(*args, **kwargs):
        calls.append(1)
        if len(calls) == 2:
            os.kill(os.getpid(), signum)
        return original(*args, **kwargs)

    monkeypatch.setattr(loop_module, "gather_window", gather_then_signal)
    out = tmp_path / "run"
    assert cli.main(train_args(out, steps=50)) == 130
    err = capsys.readouterr().err
    assert f"stopped by {signal.Signals(signum).name} at step 2" in err and "--resume" in err, err
    assert json.loads((out / "training_log.json").read_text())["step"] == 2
    load_redrafter_checkpoint(out)  # loadable at once
    load_redrafter_checkpoint(out / "last")
    assert not list(out.rglob("*.partial"))
    monkeypatch.setattr(loop_module, "gather_window", original)
    assert cli.main(train_args(out, "--resume", steps=4)) == 0
    assert json.loads((out / "training_log.json").read_text())["step"] == 4


def test_unwritable_out_is_one_line(train_args, tmp_path, capsys):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    assert cli.main(train_args(blocker / "sub")) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "cannot write to --out" in err and "Traceback" not in err, err


class _TouchesMarker:
    """Unpickling this creates a marker file: a stand-in for any command a crafted pickle runs."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        from pathlib import Path

        return (Path.touch, (Path(self.marker),))


def test_resume_of_a_crafted_pickle_state_is_refused_in_one_line(train_args, tmp_path, capsys):
    """``specdec train --resume`` on a run folder whose state file is a pickle that runs code: exit
    2, one line naming the file, and the code never runs."""
    import torch

    from specdec.training.outdir import LEGACY_STATE_FILE, STATE_FILE

    out, marker = tmp_path / "run", tmp_path / "ran-code"
    assert cli.main(train_args(out)) == 0
    (out / STATE_FILE).unlink()
    torch.save({"step": 1, "payload": _TouchesMarker(marker)}, out / LEGACY_STATE_FILE)
    capsys.readouterr()
    assert cli.main(train_args(out, "--resume", steps=4)) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]  # after the model loader's progress bar
    assert (
        err.startswith("specdec: error:") and LEGACY_STATE_FILE in err and "--overwrite" in err
    ), err
    assert "Unsupported global" in err, err
    assert not marker.exists()
