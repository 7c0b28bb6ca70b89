#!/usr/bin/env bash
# Set up and run the demo: decode with each drafter on the default model and compare with plain decoding.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh dev
.venv/bin/specdec demo "$@"
