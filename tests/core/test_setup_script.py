"""scripts/setup.sh, run against a stand-in pip: pip's own lines go to a log, and the end of that
log is shown where pip fails (a machine's pip configuration warned on every line of setup)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def checkout(tmp_path):
    """A folder with setup.sh, pyproject.toml and a .venv whose pip prints noise and exits with
    the status in ./pip-status."""
    (tmp_path / "scripts").mkdir()
    shutil.copy(ROOT / "scripts" / "setup.sh", tmp_path / "scripts")
    shutil.copy(ROOT / "pyproject.toml", tmp_path)
    bin_dir = tmp_path / ".venv" / "bin"
    bin_dir.mkdir(parents=True)
    (bin_dir / "python").symlink_to(sys.executable)
    pip = bin_dir / "pip"
    pip.write_text(
        "#!/usr/bin/env bash\n"
        'for i in 1 2 3; do echo "WARNING: Location file:///x is ignored"; done\n'
        'echo "pip was asked: $*"\n'
        'exit "$(cat "$(dirname "$0")/../../pip-status")"\n'
    )
    pip.chmod(0o755)
    return tmp_path


def run(checkout: Path, status: int) -> subprocess.CompletedProcess:
    (checkout / "pip-status").write_text(str(status))
    return subprocess.run(
        ["bash", "scripts/setup.sh", "torch,dev"],
        cwd=checkout,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_pips_lines_go_to_a_log(checkout):
    done = run(checkout, 0)
    assert done.returncode == 0, done.stderr
    assert "WARNING" not in done.stdout + done.stderr, done.stdout
    assert "setup.sh: installing torch 2.13.0" in done.stdout
    assert "specdec is set up in" in done.stdout
    log = (checkout / ".venv" / "setup.log").read_text()
    assert "pip was asked: install --disable-pip-version-check torch==2.13.0" in log
    assert "pip was asked: install --disable-pip-version-check -e .[torch,dev]" in log


def test_a_failing_pip_shows_the_end_of_its_log(checkout):
    done = run(checkout, 3)
    assert done.returncode == 1
    assert "setup.sh: pip failed; the end of its output" in done.stderr
    assert "pip was asked: install --disable-pip-version-check torch==2.13.0" in done.stderr
    assert "specdec is set up" not in done.stdout
