#!/usr/bin/env bash
# Exact mode's outputs and cost on the default path (decision 0010): every method against plain
# decoding at the default dtype, and the default path with exact mode on against the same path
# with it off, in one interleaved run per prompt set. Results: benchmarks/results/exact_*.
set -euo pipefail
cd "$(dirname "$0")/.."
methods=(plain plain:exact=false redrafter redrafter:exact=false medusa eagle lookup)
.venv/bin/specdec bench --model smollm2-135m --prompts mt-bench --per-category 2 --methods "${methods[@]}" \
  --repeats 2 --out benchmarks/results/exact_mtbench
.venv/bin/specdec bench --model smollm2-135m --prompts humaneval --per-category 16 --methods "${methods[@]}" \
  --repeats 2 --out benchmarks/results/exact_humaneval
.venv/bin/python benchmarks/exact_costs.py | tee benchmarks/results/exact_costs.md
