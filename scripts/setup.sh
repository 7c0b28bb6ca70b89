#!/usr/bin/env bash
# Create .venv (if missing) and install specdec with the extras given as arguments.
# torch is pinned to 2.13.0, the version the project is tested on. Where pip's index holds a CPU
# wheel of it, that one is taken; from stock PyPI on Linux it is the multi-GB CUDA build, so
# TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu takes the CPU build from PyTorch's index.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PYTHON" -m venv .venv
fi
extras=${1:-dev}
# an extra pip does not know is only a warning there: refuse it here, naming the ones there are
known=$(.venv/bin/python -c 'import tomllib; print(" ".join(tomllib.load(open("pyproject.toml", "rb"))["project"]["optional-dependencies"]))')
for extra in ${extras//,/ }; do
  if [[ " $known " != *" $extra "* ]]; then
    echo "setup.sh: unknown extra '$extra'; the extras are: ${known// /, }" >&2
    exit 2
  fi
done
if [[ ",$extras," == *",torch,"* ]]; then
  .venv/bin/pip install --quiet --disable-pip-version-check "torch==2.13.0" \
    ${TORCH_INDEX_URL:+--index-url "$TORCH_INDEX_URL"}
fi
.venv/bin/pip install --quiet --disable-pip-version-check -e ".[$extras]"
echo "specdec is set up in $(pwd)/.venv with the extras: $extras, besides any installed before (run again with others to add them)"
