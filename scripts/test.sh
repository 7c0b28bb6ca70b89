#!/usr/bin/env bash
# Set up and run the test suite. SPECDEC_TEST_BACKENDS selects the backends under test (default: numpy).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh dev,torch,bench
.venv/bin/python -m pytest -q "$@"
