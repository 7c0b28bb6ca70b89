"""Every expected failure of the command line is one line on stderr and a non-zero exit;
``--debug`` keeps the traceback."""

from __future__ import annotations

import importlib.util
import subprocess
import sys

import pytest


def run(*args, cwd=None):
    return subprocess.run(
        [sys.executable, "-m", "specdec.cli.main", *args], capture_output=True, text=True, cwd=cwd
    )


def one_line_error(done, *fragments):
    assert done.returncode == 2, (done.returncode, done.stderr)
    lines = done.stderr.strip().splitlines()
    assert (
        len(lines) == 1
        and lines[0].startswith("specdec: error:")
        and "Traceback" not in done.stderr
    ), done.stderr
    for fragment in fragments:
        assert fragment in lines[0], (fragment, lines[0])


def gen(model, *extra):
    return (
        "generate",
        "--model",
        str(model),
        "--prompt-ids",
        "[1, 2, 3]",
        "--drafter",
        "none",
        "--backend",
        "numpy",
        "--max-new-tokens",
        "3",
        *extra,
    )


@pytest.fixture
def broken(model_dir, tmp_path):
    """A copy of the model folder whose config.json is not JSON."""
    import shutil

    copy = tmp_path / "broken"
    shutil.copytree(model_dir, copy)
    (copy / "config.json").write_text('{"hidden_size": 32,')
    return copy


def test_model_path_that_does_not_exist(tmp_path):
    one_line_error(run(*gen(tmp_path / "no" / "such")), "model folder", "does not exist")


def test_config_that_is_not_json(broken):
    one_line_error(run(*gen(broken)), str(broken / "config.json"), "not valid JSON")


def test_truncated_drafter_file(model_dir, tmp_path):
    from specdec.testing import make_random_drafter

    drafter = make_random_drafter(tmp_path / "rd", model_dir, kind="redrafter", seed=1)
    weights = drafter / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:200])
    done = run(
        "generate",
        "--model",
        str(model_dir),
        "--prompt-ids",
        "[1, 2]",
        "--drafter",
        str(drafter),
        "--backend",
        "numpy",
        "--max-new-tokens",
        "3",
    )
    one_line_error(done, str(weights), "damaged")


def test_missing_drafter_path_is_not_called_an_unknown_drafter(model_dir, tmp_path):
    done = run(*gen(model_dir)[:6], str(tmp_path / "no-drafter"), *gen(model_dir)[7:])
    one_line_error(done, "drafter checkpoint folder", "does not exist")


@pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="needs torch")
def test_device_that_is_not_available(model_dir):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    done = run(
        "generate",
        "--model",
        str(model_dir),
        "--prompt-ids",
        "[1, 2]",
        "--drafter",
        "none",
        "--backend",
        "torch",
        "--device",
        "cuda",
        "--max-new-tokens",
        "2",
    )
    one_line_error(done, "torch backend could not load", "device='cuda'")


@pytest.mark.parametrize("ids", ["[1, 2", "1 2 3", "[1, 2.5]", "[]"])
def test_malformed_prompt_ids(model_dir, ids):
    done = run(
        "generate",
        "--model",
        str(model_dir),
        "--prompt-ids",
        ids,
        "--drafter",
        "none",
        "--backend",
        "numpy",
    )
    one_line_error(done, "prompt")


def test_bad_seed(model_dir):
    one_line_error(
        run(*gen(model_dir, "--temperature", "1", "--seed", "-1")), "seed must be an integer >= 0"
    )


def test_unwritable_out(model_dir, tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    done = run(
        "bench",
        "--model",
        str(model_dir),
        "--out",
        str(blocker / "out"),
        "--methods",
        "plain",
        "--backends",
        "numpy",
        "--per-category",
        "1",
        "--max-new-tokens",
        "2",
        "--repeats",
        "1",
        "--warmup",
        "0",
    )
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr[-3000:]
    assert done.stderr.strip().splitlines()[-1].startswith("specdec: error:"), done.stderr[-2000:]
    assert str(blocker) in done.stderr.strip().splitlines()[-1]


@pytest.mark.parametrize(
    "mix, fragment",
    [("poems=1", "poems"), ("general=-1,plain=1", "-1.0"), ("general=x", "kind=share pairs")],
)
def test_bad_prompt_mix(model_dir, tmp_path, mix, fragment):
    done = run(
        "train",
        "redrafter",
        "--model",
        str(model_dir),
        "--out",
        str(tmp_path / "out"),
        "--steps",
        "1",
        "--prompt-mix",
        mix,
    )
    one_line_error(done, "--prompt-mix", fragment)
    assert not (tmp_path / "out").exists(), "refused before any work"


def test_debug_keeps_the_traceback(tmp_path):
    done = run("--debug", *gen(tmp_path / "missing"))
    assert done.returncode != 0 and "Traceback" in done.stderr and "does not exist" in done.stderr
