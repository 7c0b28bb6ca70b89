#!/usr/bin/env bash
# Runs recorded in benchmarks/README.md after prompt lookup drafting and the retrained ReDrafter
# (same conditions as run_smollm2.sh: an otherwise idle machine, both cores, batch 1, 128 tokens).
set -euo pipefail
cd "$(dirname "$0")/.."
source benchmarks/common.sh

# 8. torch bfloat16 (the fastest torch dtype here), greedy, MT-Bench (1 prompt per category), 3 interleaved repeats.
run lookup_torch_bf16_mtbench --prompts mt-bench --per-category 1 --backends torch:bfloat16 --repeats 3 \
    --methods plain redrafter redrafter:lookup=true redrafter:w=1,l=5,lookup=true lookup hf hf-pld --max-new-tokens 128
# 9. torch float32 (bit-identical outputs), greedy, MT-Bench (2 prompts per category): tokens per step.
run lookup_torch_f32_mtbench --prompts mt-bench --per-category 2 --backends torch:float32 --repeats 1 \
    --methods plain redrafter:w=4,l=5 redrafter redrafter:lookup=true medusa lookup hf-pld --max-new-tokens 128
# 10. torch float32, greedy, HumanEval (first 16 problems).
run lookup_torch_f32_humaneval --prompts humaneval --per-category 16 --backends torch:float32 --repeats 1 \
    --methods plain redrafter:w=4,l=5 redrafter redrafter:lookup=true medusa lookup hf-pld --max-new-tokens 128
# 11. mlx (float32, OpenBLAS preloaded), greedy, MT-Bench (1 prompt per category).
LD_PRELOAD=$OPENBLAS run lookup_mlx_mtbench --prompts mt-bench --per-category 1 --backends mlx:float32 --repeats 1 \
    --methods plain redrafter redrafter:lookup=true lookup mlx-lm --max-new-tokens 128
