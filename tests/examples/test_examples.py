"""The third-party examples under examples/, as installed distributions: their own conformance
tests (specdec.testing against the float64 reference) pass, and ``specdec plugins`` lists them
with their distribution names.

scripts/test.sh installs them (``pip install -e examples/...``) and sets SPECDEC_TEST_EXAMPLES=1,
which turns a missing distribution into a failure; elsewhere these tests skip without them.
"""

from __future__ import annotations

import os
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = {  # distribution -> (plugin name, what `specdec plugins` lists)
    "specdec-example-backend": (
        "numpy32",
        [
            "numpy32",
            "prefix_tree [numpy32]",
            "greedy [numpy32] lossless",
            "exact [numpy32] lossless",
            "rejection [numpy32] lossless",
        ],
    ),
    "specdec-example-drafter": ("ngram", ["ngram [*]"]),
}


def installed(distribution: str) -> str:
    """The installed version; skips (or fails under SPECDEC_TEST_EXAMPLES=1) when it is missing."""
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        message = (
            f"{distribution} is not installed: pip install -e examples/{distribution} "
            "(scripts/test.sh does)"
        )
        if os.environ.get("SPECDEC_TEST_EXAMPLES") == "1":
            pytest.fail(message)
        pytest.skip(message)


@pytest.mark.parametrize("distribution", sorted(EXAMPLES))
def test_the_example_passes_its_conformance_tests(distribution):
    installed(distribution)
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            str(ROOT / "examples" / distribution / "tests"),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    assert " passed" in done.stdout and "skipped" not in done.stdout, done.stdout[-2000:]


@pytest.mark.parametrize("distribution", sorted(EXAMPLES))
def test_specdec_plugins_lists_the_example_with_its_distribution(distribution):
    version = installed(distribution)
    plugin, rows = EXAMPLES[distribution]
    done = subprocess.run(
        [sys.executable, "-m", "specdec.cli.main", "plugins"],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr
    for row in rows:
        assert (
            f"  {row}  ({distribution} {version}, plugin {plugin})" in done.stdout.splitlines()
        ), done.stdout
