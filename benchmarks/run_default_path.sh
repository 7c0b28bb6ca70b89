#!/usr/bin/env bash
# Runs recorded in benchmarks/README.md for the default path: dtype=None (measured fastest here),
# ReDrafter with its prompt-lookup beam, the shipped drafters, both cores, batch 1, 128 tokens.
# Run on an otherwise idle machine; ~35 minutes.
set -euo pipefail
cd "$(dirname "$0")/.."
source benchmarks/common.sh

# 12. Cost of verifying k tokens, t(k)/t(1): the old default (float32, one matmul per projection)
#     against today's (the measured dtype, packed projections), interleaved in one process.
.venv/bin/python benchmarks/tree_costs.py --sizes 1 4 8 16 32 --rounds 5 --out "$OUT/tree_costs.json"
# 13. MT-Bench (2 prompts per category), default dtype, 2 interleaved repeats: the default path
#     (redrafter), ReDrafter alone, Medusa, lookup alone, transformers in our dtype and in its own.
run default_mtbench --prompts mt-bench --per-category 2 --backends torch --repeats 2 --max-new-tokens 128 \
    --methods plain redrafter redrafter:lookup=false medusa lookup hf hf:dtype=own hf-pld:dtype=own
# 14. HumanEval (first 16 problems), the same methods.
run default_humaneval --prompts humaneval --per-category 16 --backends torch --repeats 2 --max-new-tokens 128 \
    --methods plain redrafter redrafter:lookup=false medusa lookup hf hf:dtype=own hf-pld:dtype=own
# 15. float32: greedy output identical to plain decoding for every drafter (torch and mlx).
run default_f32_identity --prompts mt-bench --per-category 1 --backends torch:float32 mlx:float32 --repeats 1 \
    --max-new-tokens 128 --methods plain redrafter redrafter:lookup=false medusa lookup
# 16. mlx (its default: float32 on the CPU, the system OpenBLAS loaded automatically) against mlx_lm.
run default_mlx_mtbench --prompts mt-bench --per-category 1 --backends mlx --repeats 1 --max-new-tokens 128 \
    --methods plain redrafter lookup mlx-lm
