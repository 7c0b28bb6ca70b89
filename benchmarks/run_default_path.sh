#!/usr/bin/env bash
# Runs recorded in benchmarks/README.md for the default path: dtype=None (measured fastest here),
# ReDrafter with its prompt-lookup beam, the shipped drafters, both cores, batch 1, 128 tokens.
# Run on an otherwise idle machine (anything else running, even niced, stalls torch's two threads);
# about 70 minutes, most of it the MT-Bench grid.
set -euo pipefail
cd "$(dirname "$0")/.."
source benchmarks/common.sh

# 13. MT-Bench (2 prompts per category), default dtype, 2 interleaved repeats: the default path
#     (redrafter), ReDrafter alone, Medusa, lookup alone, transformers in our dtype and in its own.
run default_mtbench --prompts mt-bench --per-category 2 --backends torch --repeats 2 --max-new-tokens 128 \
    --methods plain redrafter redrafter:lookup=false medusa lookup hf hf:dtype=own hf-pld:dtype=own
# 14. HumanEval (first 16 problems), one repeat: the default path, ReDrafter alone, transformers in its own dtype.
run default_humaneval --prompts humaneval --per-category 16 --backends torch --repeats 1 --max-new-tokens 128 \
    --methods plain redrafter redrafter:lookup=false hf:dtype=own
# 15. torch float32: greedy output identical to plain decoding for every drafter.
run default_f32_identity --prompts mt-bench --per-category 1 --backends torch:float32 --repeats 1 \
    --max-new-tokens 128 --methods plain redrafter redrafter:lookup=false medusa lookup
# 16. mlx with its defaults (float32 on the CPU, the system OpenBLAS loaded automatically) against mlx_lm;
#     float32, so this is also mlx's identity check.
run default_mlx_mtbench --prompts mt-bench --per-category 1 --backends mlx --repeats 1 --max-new-tokens 128 \
    --methods plain redrafter redrafter:lookup=false medusa lookup mlx-lm
# 12. Cost of verifying k tokens, t(k)/t(1): the old default (float32, one matmul per projection)
#     against today's (the measured dtype, packed projections), interleaved in one process.
.venv/bin/python benchmarks/tree_costs.py --sizes 1 4 8 16 32 --rounds 5 --out "$OUT/tree_costs.json"
