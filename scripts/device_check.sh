#!/usr/bin/env bash
# The torch backend on an accelerator in a few minutes: its tests (exact mode's bitwise tests among
# them); the claims of exact mode on random weights of SmolLM2-135M's and Qwen2.5-1.5B's shapes made
# on the spot (scripts/device_check.py: the decoding guard's verdict over trees of 1-16 nodes in 1
# and 16 rows, and plain decoding, prompt lookup, a random ReDrafter and EAGLE each compared token
# for token with plain decoding, with their speeds); a short bench of plain decoding and prompt
# lookup, exact mode on and off. One PASS/FAIL line per claim. For a fresh NVIDIA machine with torch
# installed (nothing is downloaded); DEVICE=cpu tries the same on this machine. Logs under
# ${OUT:-device-check}.
#   bash scripts/device_check.sh            # DEVICE=cuda
#   LARGE=1 bash scripts/device_check.sh    # Qwen2.5-1.5B's shapes too
#   DEVICE=cpu bash scripts/device_check.sh
set -uo pipefail
cd "$(dirname "$0")/.."
DEVICE=${DEVICE:-cuda}
OUT=${OUT:-device-check}
PYTHON=${PYTHON:-python3}
mkdir -p "$OUT"
if [ -x .venv/bin/python ]; then PYTHON=.venv/bin/python; fi
# specdec itself; its dependencies where a package index is reachable (torch is never reinstalled)
"$PYTHON" -m pip install --quiet --no-deps -e . >"$OUT/install.log" 2>&1 || true
"$PYTHON" -m pip install --quiet -e ".[dev,hf]" >>"$OUT/install.log" 2>&1 || echo "(no package index: using what is installed)"
"$PYTHON" - <<'EOF' | tee "$OUT/device.txt"
import torch
print("torch", torch.__version__, "cuda", torch.version.cuda, "available", torch.cuda.is_available())
if torch.cuda.is_available():
    print("gpu", torch.cuda.get_device_name(0))
EOF
export SPECDEC_TORCH_DEVICE=$DEVICE SPECDEC_TEST_BACKENDS=numpy,torch SPECDEC_CACHE="$PWD/$OUT/cache"
status=0
timeout 300 "$PYTHON" -m pytest -q -x -p no:cacheprovider tests/backends/test_torch_exact.py \
  tests/backends/test_torch_target.py tests/backends/test_torch_generate.py tests/backends/test_torch_trees_verifiers.py \
  2>&1 | tee "$OUT/tests.log" | tail -15 || status=1
timeout 300 "$PYTHON" scripts/device_check.py --device "$DEVICE" --out "$OUT" ${LARGE:+--large} \
  2>"$OUT/claims.err" | tee "$OUT/claims.log" || status=1
timeout 300 "$PYTHON" -m specdec.cli.main bench --model "$OUT/models/smollm2-135m" --prompts humaneval --per-category 2 \
  --methods plain plain:exact=false lookup lookup:exact=false --backends torch --max-new-tokens 32 --repeats 2 \
  --out "$OUT/bench" 2>"$OUT/bench.err" | tee "$OUT/bench.md"
[ "${PIPESTATUS[0]}" = 0 ] || { echo "bench failed or ran past 300 s (see $OUT/bench.err)"; status=1; }
"$PYTHON" -c "import specdec, sys; t = specdec.load(sys.argv[1], backend='torch', device=sys.argv[2]); \
print(t.dtype, specdec.tuning.exactness.describe(t))" "$OUT/models/smollm2-135m" "$DEVICE" 2>&1 | tail -2 | tee -a "$OUT/device.txt"
exit $status
