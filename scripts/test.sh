#!/usr/bin/env bash
# Set up and run the test suite. SPECDEC_TEST_BACKENDS (comma-separated) names the backends that must be tested
# (default: numpy; the torch and mlx tests also run whenever their framework is installed, which this script
# does); tests/conftest.py stops the run when a named one is unusable. The third-party examples under examples/
# are installed as distributions, and SPECDEC_TEST_EXAMPLES=1 makes their tests (tests/examples/) mandatory.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh dev,torch,hf,bench,mlx,serve
.venv/bin/pip install --quiet --disable-pip-version-check -e examples/specdec-example-backend \
  -e examples/specdec-example-drafter
SPECDEC_TEST_EXAMPLES=${SPECDEC_TEST_EXAMPLES:-1} .venv/bin/python -m pytest -q "$@"
