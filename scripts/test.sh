#!/usr/bin/env bash
# Set up and run the test suite. SPECDEC_TEST_BACKENDS (comma-separated) names the backends that must be tested
# (default: numpy; the torch and mlx tests also run whenever their framework is installed, which this script
# does); tests/conftest.py stops the run when a named one is unusable.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh dev,torch,hf,bench,mlx
.venv/bin/python -m pytest -q "$@"
