"""The command line, run as a user would."""

from __future__ import annotations

import subprocess
import sys


def run(*args):
    return subprocess.run([sys.executable, "-m", "specdec.cli", *args], capture_output=True, text=True)


def test_demo_on_a_random_model():
    done = run("demo", "--random", "--backend", "numpy", "--max-new-tokens", "6")
    assert done.returncode == 0, done.stderr[-2000:]
    assert "assistant:" in done.stdout and done.stdout.count("identical to plain decoding") == 3, done.stdout


def test_generate_from_token_ids(model_dir):
    done = run("generate", "--model", str(model_dir), "--prompt-ids", "[1, 2, 3]", "--drafter", "none",
               "--backend", "numpy", "--max-new-tokens", "4")
    assert done.returncode == 0, done.stderr[-2000:]
    assert "1.00 tokens/step" in done.stderr, done.stderr


def test_errors_are_reported_without_a_traceback(model_dir):
    done = run("generate", "--model", str(model_dir), "--prompt-ids", "[1, 999]", "--drafter", "none",
               "--backend", "numpy")
    assert done.returncode == 2 and "specdec: error:" in done.stderr and "Traceback" not in done.stderr, done.stderr


def test_generate_with_lookup(model_dir):
    done = run("generate", "--model", str(model_dir), "--prompt-ids", "[1, 2, 3, 1, 2, 3]", "--drafter", "lookup",
               "--backend", "numpy", "--max-new-tokens", "4")
    assert done.returncode == 0, done.stderr[-2000:]
    refused = run("generate", "--model", str(model_dir), "--prompt-ids", "[1, 2]", "--drafter", "none", "--lookup",
                  "--backend", "numpy", "--max-new-tokens", "4")
    assert refused.returncode == 2 and "drafter='lookup'" in refused.stderr, refused.stderr
