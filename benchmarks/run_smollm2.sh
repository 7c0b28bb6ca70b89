#!/usr/bin/env bash
# The SmolLM2-135M benchmark runs recorded in benchmarks/README.md, in the order they were taken.
# Run on an otherwise idle machine from the repository root after `bash scripts/setup.sh dev,torch,hf,bench,mlx`.
# Each run writes bench.json, bench.md, speedup.png and accepted.png under benchmarks/results/<name>/.
set -euo pipefail
cd "$(dirname "$0")/.."
source benchmarks/common.sh

# 1. torch, greedy, MT-Bench (2 prompts per category): our methods and transformers' side by side.
run torch_mtbench_greedy --prompts mt-bench --per-category 2 --backends torch:float32 \
    --methods plain redrafter:w=4,l=5 redrafter:w=2,l=4 redrafter:w=1,l=4 medusa hf hf-pld --max-new-tokens 128 --repeats 1
# 2. torch, greedy, HumanEval (first 16 problems).
run torch_humaneval_greedy --prompts humaneval --per-category 16 --backends torch:float32 \
    --methods plain redrafter:w=4,l=5 redrafter:w=2,l=4 medusa hf hf-pld --max-new-tokens 128 --repeats 1
# 3. torch, sampling at T=0.7 (exact verifier: rejection sampling over sampled chains / the Medusa tree).
run torch_mtbench_t07 --prompts mt-bench --per-category 1 --backends torch:float32 --temperatures 0.7 \
    --methods plain redrafter:w=4,l=5 redrafter:w=2,l=4 medusa hf --max-new-tokens 128 --repeats 2
# 4. mlx (float32, OpenBLAS preloaded), greedy, MT-Bench (1 prompt per category).
LD_PRELOAD=$OPENBLAS run mlx_mtbench_greedy --prompts mt-bench --per-category 1 --backends mlx:float32 \
    --methods plain redrafter:w=4,l=5 redrafter:w=2,l=4 medusa mlx-lm --max-new-tokens 128 --repeats 1
