#!/usr/bin/env bash
# The per-step speculation budgets under load (decision 0011), every figure of benchmarks/README.md's
# "Speculation that never loses" section, one after another on an otherwise idle machine:
#   bash benchmarks/run_budgets.sh [smollm|sweep|qwen|overhead ...]   (default: all four)
# The model's step-cost curve (16 slots) is measured first, alone, and cached, so that every server
# of a load test reads the same curve.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
OUT=benchmarks/results
warm() {  # the cost curve of MODEL with 16 slots, measured alone and cached
  "$PY" -c "
import time, specdec
from specdec import compute
from specdec.generation.api import load_backend
from specdec.plugins.registry import default_registry
from specdec.tuning.costs import curve_for
backend = load_backend(None, default_registry())
target = specdec.load('$1', slots=16, capacity=1024)
start = time.perf_counter()  # on the thread that runs the steps (decision 0014), as a server does
curve = compute.run_for(backend, curve_for, backend, target, tuple(range(16)))
print(f'{time.perf_counter() - start:.1f} s:', curve)"
}
for part in "${@:-smollm sweep qwen overhead}"; do
  for what in $part; do
    echo "=== $what: $(date -u +%H:%M:%S) load $(cut -d' ' -f1-3 /proc/loadavg)"
    case $what in
      smollm)
        warm smollm2-135m
        "$PY" benchmarks/load_test.py --drafters none redrafter redrafter@always \
          --concurrency 1 2 4 8 16 32 --modes inflight --requests 32 --max-tokens 32 96 \
          --out "$OUT/load_test_budgets_rows.json" ;;
      sweep)
        warm smollm2-135m
        "$PY" benchmarks/load_test.py --drafters none redrafter --concurrency $(seq 1 32) \
          --modes inflight --requests 32 --max-tokens 16 32 --out "$OUT/load_test_sweep.json" ;;
      qwen)
        warm qwen2.5-coder-1.5b
        "$PY" benchmarks/load_test.py --model qwen2.5-coder-1.5b --drafters none redrafter \
          --concurrency 1 4 16 --modes inflight --requests 16 --max-tokens 16 32 \
          --out "$OUT/load_test_qwen.json" ;;
      overhead)
        "$PY" benchmarks/engine_overhead.py --rounds 3 --prompts 2 --server ;;
    esac
  done
done
