"""``specdec train``: the command trains, saves a loadable checkpoint and resumes."""

from __future__ import annotations

import json

from specdec.cli import main as cli
from specdec.training import corpus as corpus_module
from specdec.training import loop as loop_module
from specdec_medusa.checkpoint import load_medusa_checkpoint
from specdec_redrafter.checkpoint import load_redrafter_checkpoint


def test_train_redrafter_then_resume(tiny_model, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("SPECDEC_CACHE", str(tmp_path / "cache"))
    lib = tmp_path / "lib"
    lib.mkdir()
    for i in range(30):
        (lib / f"m{i}.py").write_text(
            f"def f{i}(x):\n    y = x + {i}\n    z = y * 2\n    return z - {i}\n"
        )
    monkeypatch.setattr(
        corpus_module, "default_corpus", lambda cache: corpus_module.Corpus(stdlib=lib)
    )
    out = tmp_path / "drafter"
    args = [
        "train",
        "redrafter",
        "--model",
        str(tiny_model),
        "--out",
        str(out),
        "--steps",
        "4",
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
    ]
    assert cli.main(args) == 0
    said = capsys.readouterr()
    assert "tokens/step" in said.out
    # --quiet: no progress bars, one line per stage of the data and per evaluation
    assert "teacher train: 4 prompts in" in said.err and "teacher heldout: 2 prompts" in said.err
    assert "training: step 4, " in said.err and "held-out tokens/step" in said.err
    assert "\r" not in said.err
    config, _ = load_redrafter_checkpoint(out)
    assert (config.beam_width, config.beam_length, config.head) == (2, 3, "tied")
    assert config.target["name"] == tiny_model.name and len(config.target["fingerprint"]) == 64
    report = json.loads((out / "training_report.json").read_text())
    assert report["training"]["steps"] == 4 and report["teacher"]["train"]["positions"] > 0
    assert "% of the budget" not in said.err  # four quick steps: no heartbeat between evals
    # between evaluations a line at least every HEARTBEAT_SECONDS (here: after every step)
    monkeypatch.setattr(loop_module, "HEARTBEAT_SECONDS", 0.0)
    assert cli.main(args[:7] + ["8"] + args[8:] + ["--resume"]) == 0
    assert json.loads((out / "training_log.json").read_text())["step"] == 8
    beats = [line for line in capsys.readouterr().err.splitlines() if "% of the budget" in line]
    assert [line.split(",")[0] for line in beats] == [f"training: step {i}" for i in (5, 6, 7, 8)]

    medusa = tmp_path / "medusa"
    assert (
        cli.main(
            [
                "train",
                "medusa",
                "--model",
                str(tiny_model),
                "--out",
                str(medusa),
                "--steps",
                "2",
                "--prompts",
                "4",
                "--heldout-prompts",
                "2",
                "--max-new-tokens",
                "6",
                "--save-dtype",
                "float16",
                "--quiet",
            ]
        )
        == 0
    )
    config, weights = load_medusa_checkpoint(medusa)
    assert config.num_heads == 4 and config.head == "tied" and len(weights) == 8


def test_train_rejects_other_backends_and_missing_budget(tiny_model, tmp_path, capsys):
    base = ["train", "redrafter", "--model", str(tiny_model), "--out", str(tmp_path / "x")]
    assert cli.main(base + ["--steps", "1", "--backend", "numpy"]) == 2
    assert "torch backend only" in capsys.readouterr().err
    assert cli.main(base) == 2
    assert "--minutes N or --steps N" in capsys.readouterr().err


def test_train_eagle3_then_resume(tiny_model, tmp_path, monkeypatch, capsys):
    """``specdec train eagle3`` (registered by the drafter's spec) trains, saves a checkpoint of
    its draft vocabulary and fused layers, resumes, and refuses ``--shortlist``."""
    from specdec_eagle3.checkpoint import load_eagle3_checkpoint

    monkeypatch.setenv("SPECDEC_CACHE", str(tmp_path / "cache"))
    lib = tmp_path / "lib"
    lib.mkdir()
    for i in range(30):
        (lib / f"m{i}.py").write_text(f"def f{i}(x):\n    y = x + {i}\n    return y * 2\n")
    monkeypatch.setattr(
        corpus_module, "default_corpus", lambda cache: corpus_module.Corpus(stdlib=lib)
    )
    out = tmp_path / "eagle3"
    args = [
        "train",
        "eagle3",
        "--model",
        str(tiny_model),
        "--out",
        str(out),
        "--steps",
        "2",
        "--prompts",
        "4",
        "--heldout-prompts",
        "2",
        "--max-new-tokens",
        "6",
        "--draft-vocab",
        "32",
        "--window",
        "8",
        "--batch-size",
        "16",
        "--unroll",
        "2",
        "--quiet",
    ]
    assert cli.main(args) == 0
    assert "tokens/step" in capsys.readouterr().out
    config, weights = load_eagle3_checkpoint(out)
    assert config.draft_vocab_size == 32 and len(weights["d2t"]) == 32
    assert config.hidden_layers == (0, 0, 1)
    assert config.target["name"] == tiny_model.name and len(config.target["fingerprint"]) == 64
    report = json.loads((out / "training_report.json").read_text())
    assert report["training"]["unroll"] == 2 and report["shortlist"] == 32
    assert cli.main(args[:7] + ["4"] + args[8:] + ["--resume"]) == 0
    assert json.loads((out / "training_log.json").read_text())["step"] == 4
    capsys.readouterr()
    assert cli.main(args + ["--out", str(tmp_path / "other"), "--shortlist", "16"]) == 2
    assert "--draft-vocab" in capsys.readouterr().err


def test_a_training_run_slowed_by_other_work_says_so():
    """A run at 24 positions/s against the 564 the docs give said nothing of the other work
    that slowed it."""
    from types import SimpleNamespace

    from specdec.cli.train import busy_training_note

    note = busy_training_note(SimpleNamespace(others=0.55, quiet=False))
    assert note.startswith("note: other work shared the cores while it trained (other processes "
                           "computed on 55% of them)")  # fmt: skip
    assert busy_training_note(SimpleNamespace(others=0.02, quiet=True)) is None
    assert busy_training_note(SimpleNamespace(others=None, quiet=False)) is None  # unknown
