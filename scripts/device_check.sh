#!/usr/bin/env bash
# The torch backend on an accelerator in a few minutes: its tests (exact mode's bitwise tests among
# them) and a short bench of plain decoding and prompt lookup, exact mode on and off, on a random
# model of SmolLM2-135M's shapes (no download). For a fresh NVIDIA machine with torch installed;
# DEVICE=cpu tries the same on this machine. Writes its logs under ${OUT:-device-check}.
#   bash scripts/device_check.sh            # DEVICE=cuda
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
"$PYTHON" - "$OUT/model" <<'EOF'
import sys
from specdec.testing import make_random_model
make_random_model(sys.argv[1], vocab_size=49152, hidden_size=576, intermediate_size=1536, num_layers=30,
                  num_heads=9, num_kv_heads=3, seed=0, with_tokenizer=True)
EOF
timeout 300 "$PYTHON" -m specdec.cli.main bench --model "$OUT/model" --prompts humaneval --per-category 2 \
  --methods plain plain:exact=false lookup lookup:exact=false --backends torch --max-new-tokens 32 --repeats 2 \
  --out "$OUT/bench" 2>"$OUT/bench.err" | tee "$OUT/bench.md"
[ "${PIPESTATUS[0]}" = 0 ] || { echo "bench failed or ran past 300 s (see $OUT/bench.err)"; status=1; }
"$PYTHON" -c "import specdec, sys; t = specdec.load(sys.argv[1], backend='torch', device=sys.argv[2]); \
print(t.dtype, specdec.tuning.exactness.describe(t))" "$OUT/model" "$DEVICE" 2>&1 | tail -2 | tee -a "$OUT/device.txt"
exit $status
