"""SPECDEC_TEST_BACKENDS (tests/conftest.py): a named backend must be usable, or the run stops."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def collect(backends: str, pythonpath: Path | None = None) -> subprocess.CompletedProcess:
    """``pytest --collect-only`` of a small test file with SPECDEC_TEST_BACKENDS set."""
    env = {**os.environ, "SPECDEC_TEST_BACKENDS": backends}
    if pythonpath is not None:
        env["PYTHONPATH"] = str(pythonpath)
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "--collect-only", "-p", "no:cacheprovider",
                           "tests/core/test_chat.py"], cwd=ROOT, env=env, capture_output=True, text=True)


def test_an_unknown_backend_stops_the_run():
    done = collect("numpy,jax")
    assert done.returncode == pytest.ExitCode.USAGE_ERROR, done.stdout + done.stderr
    assert "'jax' is not a registered backend" in done.stderr, done.stderr


def test_names_are_stripped_and_an_unusable_framework_stops_the_run(tmp_path):
    """" numpy , torch ," names torch; a torch that fails to import is then an error, not a skip."""
    (tmp_path / "torch").mkdir()
    (tmp_path / "torch" / "__init__.py").write_text('raise ImportError("a broken torch install")\n')
    broken = collect(" numpy , torch ,", pythonpath=tmp_path)
    assert broken.returncode == pytest.ExitCode.USAGE_ERROR, broken.stdout + broken.stderr
    assert "SPECDEC_TEST_BACKENDS=numpy,torch: 'torch' is not usable" in broken.stderr, broken.stderr
    unnamed = collect("numpy", pythonpath=tmp_path)
    assert unnamed.returncode == pytest.ExitCode.OK and "2 tests collected" in unnamed.stdout, "torch not named: optional"
