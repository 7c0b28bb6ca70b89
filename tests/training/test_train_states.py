"""``specdec train --resume`` on a crafted or damaged trainer state is refused in one line that
names the state file (and says --overwrite starts again), whatever the file holds: JSON nested too
deeply, tags of the wrong shape, counters of the wrong type, tensors that do not fit the drafter,
a legacy pickle of something else than a state."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from specdec.cli import main as cli
from specdec.training import corpus as corpus_module
from specdec.training.outdir import LEGACY_STATE_FILE, STATE_FILE


@pytest.fixture(scope="module")
def trained(tiny_model, tmp_path_factory):
    """(a run folder after one training step, the arguments that resume it, the cache)."""
    root = tmp_path_factory.mktemp("train-states")
    lib = root / "lib"
    lib.mkdir()
    for i in range(30):
        (lib / f"m{i}.py").write_text(f"def f{i}(x):\n    return x * 2 - {i}\n")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("SPECDEC_CACHE", str(root / "cache"))
        patch.setattr(
            corpus_module, "default_corpus", lambda cache: corpus_module.Corpus(stdlib=lib)
        )
        out = root / "run"
        args = [
            "train",
            "redrafter",
            "--model",
            str(tiny_model),
            "--out",
            str(out),
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
        assert cli.main([*args, "--steps", "1"]) == 0
    return out, args, root, lib


def _nest(folder):
    with safe_open(str(folder / STATE_FILE), framework="pt") as handle:
        metadata = handle.metadata()
    return metadata, json.loads(metadata["state"]), load_file(str(folder / STATE_FILE))


def _entries(changes):
    """A state whose top-level entries in ``changes`` are replaced (JSON as saved)."""

    def craft(folder):
        metadata, nest, tensors = _nest(folder)
        nest["$dict"] = [[key, changes.get(key, value)] for key, value in nest["$dict"]]
        return {**metadata, "state": json.dumps(nest)}, tensors

    return craft


def _json(text):
    def craft(folder):
        metadata, _, tensors = _nest(folder)
        return {**metadata, "state": text}, tensors

    return craft


def _wrong_shapes(folder):
    metadata, _, tensors = _nest(folder)
    return metadata, {
        name: torch.zeros(3, 5) if name.startswith("/module/") else tensor
        for name, tensor in tensors.items()
    }


CRAFTED = {
    "JSON nested too deeply": _json("[" * 100_000 + "]" * 100_000),
    "tags nested too deeply": _json('{"$tuple": [' * 5_000 + "]}" * 5_000),
    "a list, not a state": _json("[1, 2]"),
    "a list where a key belongs": _json('{"$dict": [[[1], 2]]}'),
    "a tensor tag naming a list": _json('{"$tensor": [1]}'),
    "a float tag holding a list": _json('{"$float": [1]}'),
    "a dict tag holding a number": _json('{"$dict": 5}'),
    "step as text": _entries({"step": "x"}),
    "step as a float": _entries({"step": 1.5}),
    "history a number": _entries({"history": 5}),
    "best a number": _entries({"best": 5}),
    "the module's state a number": _entries({"module": 5}),
    "the optimizer's state a list": _entries({"optimizer": [1]}),
    "the sampler's state a number": _entries({"rng": 5}),
    "module tensors of another shape": _wrong_shapes,
}


@pytest.mark.parametrize("case", sorted(CRAFTED))
def test_resume_of_a_crafted_state_is_one_line_naming_it(
    trained, tmp_path, capsys, monkeypatch, case
):
    run, args, root, lib = trained
    monkeypatch.setenv("SPECDEC_CACHE", str(root / "cache"))
    monkeypatch.setattr(
        corpus_module, "default_corpus", lambda cache: corpus_module.Corpus(stdlib=lib)
    )
    out = tmp_path / "run"
    shutil.copytree(run, out)
    metadata, tensors = CRAFTED[case](out)
    save_file(tensors, str(out / STATE_FILE), metadata=metadata)
    capsys.readouterr()
    argv = [*args, "--steps", "2", "--resume"]
    argv[argv.index("--out") + 1] = str(out)
    assert cli.main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]  # after the model loader's progress bar
    assert err.startswith("specdec: error:") and str(out / STATE_FILE) in err, err
    assert "--overwrite" in err, err


@pytest.mark.parametrize("payload", ["a list", "a tensor", "nothing"])
def test_resume_of_a_legacy_state_that_is_no_state_is_one_line(
    trained, tmp_path, capsys, monkeypatch, payload
):
    run, args, root, lib = trained
    monkeypatch.setenv("SPECDEC_CACHE", str(root / "cache"))
    monkeypatch.setattr(
        corpus_module, "default_corpus", lambda cache: corpus_module.Corpus(stdlib=lib)
    )
    out = tmp_path / "run"
    shutil.copytree(run, out)
    (out / STATE_FILE).unlink()
    value = {"a list": [torch.zeros(2)], "a tensor": torch.zeros(2), "nothing": None}[payload]
    torch.save(value, out / LEGACY_STATE_FILE)
    capsys.readouterr()
    argv = [*args, "--steps", "2", "--resume"]
    argv[argv.index("--out") + 1] = str(out)
    assert cli.main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith("specdec: error:") and str(out / LEGACY_STATE_FILE) in err, err
    assert "--overwrite" in err, err
