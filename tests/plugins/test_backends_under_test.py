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
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "--collect-only",
            "-p",
            "no:cacheprovider",
            "tests/core/test_chat.py",
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
    )


def test_an_unknown_backend_stops_the_run():
    done = collect("numpy,jax")
    assert done.returncode == pytest.ExitCode.USAGE_ERROR, done.stdout + done.stderr
    assert "'jax' is not a registered backend" in done.stderr, done.stderr


def test_names_are_stripped_and_an_unusable_framework_stops_the_run(tmp_path):
    """ " numpy , torch ," names torch; a torch that fails to import is then an error, not a
    skip."""
    (tmp_path / "torch").mkdir()
    (tmp_path / "torch" / "__init__.py").write_text('raise ImportError("a broken torch install")\n')
    broken = collect(" numpy , torch ,", pythonpath=tmp_path)
    assert broken.returncode == pytest.ExitCode.USAGE_ERROR, broken.stdout + broken.stderr
    assert "SPECDEC_TEST_BACKENDS=numpy,torch: 'torch' is not usable" in broken.stderr, (
        broken.stderr
    )
    unnamed = collect("numpy", pythonpath=tmp_path)
    assert unnamed.returncode == pytest.ExitCode.OK and "2 tests collected" in unnamed.stdout, (
        "torch not named: optional"
    )


GUARDED = '''
import pytest

def test_a_reason_naming_the_backend():
    pytest.skip("mlx is not installed")

def test_on_mlx_a_missing_module():
    pytest.importorskip("a_module_that_is_not_there")

@pytest.mark.parametrize("backend", ["mlx"])
def test_parameters_name_it(backend):
    pytest.skip("the backend is not registered")

def test_on_mlx_for_another_reason():
    pytest.skip("the bundled reference BLAS is the Linux wheel's")

def test_another_backend_of_a_similar_name():
    pytest.skip("the numpy32 backend is not installed")

def test_real_model(shipped_model):
    pass
'''


def run_guarded(tmp_path: Path, **env) -> str:
    """pytest -rA on GUARDED beside a copy of tests/conftest.py; its report lines
    (outcome, test)."""
    (tmp_path / "tests").mkdir(exist_ok=True)
    (tmp_path / "tests" / "conftest.py").write_text((ROOT / "tests" / "conftest.py").read_text())
    (tmp_path / "tests" / "test_guarded.py").write_text(GUARDED)
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-rA", "-p", "no:cacheprovider", "tests"],
        cwd=tmp_path,
        env={**os.environ, "SPECDEC_CACHE": str(tmp_path / "cache"), **env},
        capture_output=True,
        text=True,
    )
    return done.stdout


def test_a_skip_for_want_of_a_named_backend_fails_wherever_the_test_is(tmp_path):
    """Not only under tests/backends/: a reason naming the backend, or a missing-module skip of a
    test whose name or parameters name it, fails; other skips stay skips."""
    named = run_guarded(tmp_path, SPECDEC_TEST_BACKENDS="numpy,mlx", SPECDEC_TEST_SHIPPED="0")
    assert "3 failed" in named, named
    for test in (
        "test_a_reason_naming_the_backend",
        "test_on_mlx_a_missing_module",
        "test_parameters_name_it[mlx]",
    ):
        assert f"FAILED tests/test_guarded.py::{test}" in named, named
    assert named.count("SKIPPED") == 3, named
    unnamed = run_guarded(tmp_path, SPECDEC_TEST_BACKENDS="numpy", SPECDEC_TEST_SHIPPED="0")
    assert "failed" not in unnamed and "6 skipped" in unnamed, unnamed


def test_a_missing_bundled_model_fails_under_specdec_test_shipped(tmp_path):
    done = run_guarded(tmp_path, SPECDEC_TEST_BACKENDS="numpy", SPECDEC_TEST_SHIPPED="1")
    assert "1 error" in done and "SPECDEC_TEST_SHIPPED=1 requires it" in done, done
