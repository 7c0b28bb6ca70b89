#!/usr/bin/env bash
# Runs recorded in benchmarks/README.md, "Teacher data about everyday topics": the shipped
# SmolLM2-135M ReDrafter against the same checkpoint fine-tuned on teacher data of the general
# kind (docs/training.md), both at the shipped W=2, L=4, with and without the lookup beam. Both
# cores, batch 1, 128 tokens, default dtype (measured), on an otherwise idle machine; ~20 minutes.
# The fine-tuned checkpoint first:
#   specdec train redrafter --model smollm2-135m --heldout-prompts 64 --save-dtype float16 --prompts 3200 \
#       --prompt-text-prompts 2048 --out runs/rd-gen --minutes 40 --weight-decay 0.1 --lr 3e-4 --threads 2 \
#       --init drafters/specdec_redrafter/weights/smollm2-135m --shortlist 8192
set -euo pipefail
cd "$(dirname "$0")/.."
source benchmarks/common.sh

GEN=redrafter:drafter=runs/rd-gen,w=2,l=4
# 1. SmolLM2-135M, MT-Bench (2 per category).
run general_data_mtbench --prompts mt-bench --per-category 2 --backends torch --repeats 1 --max-new-tokens 128 \
    --methods plain redrafter "$GEN" redrafter:lookup=false "$GEN,lookup=false" hf:dtype=own
# 2. SmolLM2-135M, HumanEval (first 16).
run general_data_humaneval --prompts humaneval --per-category 16 --backends torch --repeats 1 --max-new-tokens 128 \
    --methods plain redrafter "$GEN" redrafter:lookup=false hf:dtype=own
# 3. The tier, HumanEval (first 16), after the kernel changes: the default path against plain decoding,
#    transformers' prompt lookup and assisted generation.
"$SPECDEC" bench --model qwen2.5-coder-1.5b --prompts humaneval --per-category 16 --backends torch --repeats 1 \
    --max-new-tokens 128 --out "$OUT/tier_kernels" --methods plain redrafter hf-pld hf-assisted:draft=qwen2.5-coder-0.5b
