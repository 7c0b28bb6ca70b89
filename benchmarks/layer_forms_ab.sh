#!/usr/bin/env bash
# Side-by-side A/B of the torch backend's layer products (specdec_torch.forms): F.linear everywhere
# (SPECDEC_LAYER_PRODUCTS=linear) against the forms measured on this machine, on MT-Bench (one
# prompt per category), alternated for ROUNDS rounds. Usage: bash benchmarks/layer_forms_ab.sh [ROUNDS]
set -euo pipefail
cd "$(dirname "$0")/.."
for round in $(seq 1 "${1:-2}"); do
  for side in linear auto; do
    echo "=== round $round: $side load $(cut -d' ' -f1 /proc/loadavg)"
    SPECDEC_LAYER_PRODUCTS=$side OMP_NUM_THREADS=2 .venv/bin/specdec bench --model smollm2-135m \
      --prompts mt-bench --per-category 1 --methods plain redrafter --repeats 1 \
      --max-new-tokens 128 --out "${OUT:-/tmp}/layer-forms-$side-$round" | grep -E "^\|"
  done
done
