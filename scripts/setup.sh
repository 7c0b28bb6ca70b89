#!/usr/bin/env bash
# Create .venv (if missing) and install specdec with the extras given as arguments.
# torch is pinned to 2.13.0, the version the project is tested on. Where pip's index holds a CPU
# wheel of it, that one is taken; from stock PyPI on Linux it is the multi-GB CUDA build, so
# TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu takes the CPU build from PyTorch's index.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  echo "setup.sh: creating $(pwd)/.venv"
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
# pip's own output goes to a log (a machine's pip configuration can warn on every line); its end
# is shown where pip fails
log=.venv/setup.log
install() {
  echo "setup.sh: installing $1 (pip's output: $(pwd)/$log)"
  shift
  if ! .venv/bin/pip install --disable-pip-version-check "$@" >>"$log" 2>&1; then
    echo "setup.sh: pip failed; the end of its output ($(pwd)/$log):" >&2
    tail -n 30 "$log" >&2
    exit 1
  fi
}
if [[ ",$extras," == *",torch,"* ]]; then
  install "torch 2.13.0" "torch==2.13.0" ${TORCH_INDEX_URL:+--index-url "$TORCH_INDEX_URL"}
fi
install "specdec with the extras $extras" -e ".[$extras]"
echo "specdec is set up in $(pwd)/.venv with the extras: $extras, besides any installed before (run again with others to add them)"
