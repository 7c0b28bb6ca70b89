#!/usr/bin/env bash
# Runs recorded in benchmarks/README.md, "The prompt-lookup beam at its own length": the lookup
# chain beside ReDrafter drafts its own number of tokens (Draft.beam_lengths) instead of being cut
# to ReDrafter's beam length. Both cores, batch 1, 128 tokens, default dtype (measured), on an
# otherwise idle machine; about 40 minutes.
set -euo pipefail
cd "$(dirname "$0")/.."
source benchmarks/common.sh

# 1. SmolLM2-135M, MT-Bench (2 per category): chain lengths 3 (what the old cut to W=2, L=4 gave),
#    6, 10 (the default) and 16; ReDrafter alone; lookup alone; transformers in our dtype and its own.
run lookup_length_mtbench --prompts mt-bench --per-category 2 --backends torch --repeats 1 --max-new-tokens 128 \
    --methods plain redrafter:lookup=3 redrafter:lookup=6 redrafter redrafter:lookup=16 redrafter:lookup=false \
    lookup:k=6 lookup hf hf:dtype=own hf-pld:dtype=own
# 2. SmolLM2-135M, HumanEval (first 16).
run lookup_length_humaneval --prompts humaneval --per-category 16 --backends torch --repeats 1 --max-new-tokens 128 \
    --methods plain redrafter:lookup=3 redrafter redrafter:lookup=false lookup hf:dtype=own hf-pld:dtype=own
# 3. The tier, HumanEval (first 16): the default path (this machine's plan, W=1, L=6, with the 10-token
#    chain), the same with a 6-token chain, the checkpoint's W=4, L=5 (the default where `specdec plan`
#    has not run), our lookup alone, transformers' prompt lookup and assisted generation.
"$SPECDEC" bench --model qwen2.5-coder-1.5b --prompts humaneval --per-category 16 --backends torch --repeats 1 \
    --max-new-tokens 128 --out "$OUT/tier_lookup_length" --methods plain redrafter redrafter:lookup=6 \
    redrafter:w=4,l=5 lookup:k=10 hf-pld hf-assisted:draft=qwen2.5-coder-0.5b
# 4. float32: every drafter's greedy output identical to plain decoding, torch and mlx.
run lookup_length_f32_identity --prompts mt-bench --per-category 1 --backends torch:float32 mlx --repeats 1 \
    --max-new-tokens 128 --methods plain redrafter redrafter:lookup=false medusa lookup eagle
