#!/usr/bin/env bash
# Follow-up runs recorded in benchmarks/README.md (after run_smollm2.sh, same conditions):
# the planner on torch float32, torch bfloat16 side by side, and the opt-in large tier.
set -euo pipefail
cd "$(dirname "$0")/.."
source benchmarks/common.sh
mkdir -p "$OUT/plan_torch_float32"
# 5. planner: acceptance per (W, L) from one recorded run, measured step costs, predicted vs measured for the best 3.
"$SPECDEC" plan --model smollm2-135m --backend torch --dtype float32 --prompts mt-bench --per-category 1 \
    --widths 1 2 4 --lengths 3 4 5 --max-new-tokens 64 --measure-top 3 | tee "$OUT/plan_torch_float32/plan.md"
# 6. torch bfloat16, greedy, MT-Bench (1 prompt per category).
"$SPECDEC" bench --model smollm2-135m --categories --out "$OUT/torch_mtbench_greedy_bf16" --prompts mt-bench \
    --per-category 1 --backends torch:bfloat16 --methods plain redrafter:w=4,l=5 redrafter:w=2,l=4 redrafter:w=1,l=4 hf hf-pld \
    --max-new-tokens 128 --repeats 1
# 7. the large tier (by hand, never in CI): Qwen2.5-Coder-1.5B with its 0.5B sibling as the draft model.
"$SPECDEC" bench --model qwen2.5-coder-1.5b --categories --out "$OUT/large_qwen_humaneval" --prompts humaneval \
    --per-category 4 --backends torch:float32 \
    --methods plain hf hf-pld hf-assisted:draft=qwen2.5-coder-0.5b --max-new-tokens 64 --repeats 1
