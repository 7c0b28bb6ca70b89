#!/usr/bin/env bash
# Runs recorded in benchmarks/README.md for the bandwidth-bound tier: Qwen2.5-Coder-1.5B-Instruct
# with its shipped ReDrafter, against our plain decoding, our draft model and the peers'
# speculative decoding. Both cores, batch 1, on an otherwise idle machine; about an hour.
# One framework's models per process: the torch and MLX copies of the 1.5B and 0.5B together do not
# fit in 24 GB.
set -euo pipefail
cd "$(dirname "$0")/.."
source benchmarks/common.sh
M=qwen2.5-coder-1.5b
D=qwen2.5-coder-0.5b

# 1. The beams `specdec plan` chooses for the shipped drafter on this machine (MT-Bench, its default
#    prompts; generate uses the choice when no beams are given).
"$SPECDEC" plan --model $M --backend torch --measure-top 1
# 2. HumanEval (first 16), torch, default dtype: the default path (planned beams + lookup), the
#    checkpoint's W=4, L=5 with and without lookup, our draft model, transformers' assisted generation
#    with the 0.5B and its prompt lookup.
"$SPECDEC" bench --model $M --prompts humaneval --per-category 16 --backends torch --repeats 1 --max-new-tokens 128 \
    --out "$OUT/tier_humaneval_torch" --methods plain redrafter redrafter:w=4,l=5 redrafter:w=4,l=5,lookup=false \
    draft_model:draft=$D,k=2 hf-assisted:draft=$D hf-pld
# 3. Longer beams (a bandwidth-bound step pays little for more nodes) against prompt lookup, ours and transformers'.
"$SPECDEC" bench --model $M --prompts humaneval --per-category 16 --backends torch --repeats 1 --max-new-tokens 128 \
    --out "$OUT/tier_humaneval_torch_long" --methods plain redrafter:w=4,l=8 redrafter:w=2,l=10 lookup:k=10 hf-pld
# 4. MLX (float32, the CPU build's only candidate) against mlx_lm with the draft model; fewer prompts
#    and tokens: MLX's float32 1.5B decodes at ~3 tokens/s here.
"$SPECDEC" bench --model $M --prompts humaneval --per-category 4 --backends mlx --repeats 1 --max-new-tokens 64 \
    --out "$OUT/tier_humaneval_mlx" --methods plain redrafter:w=2,l=10 lookup:k=10 mlx-lm-draft:draft=$D
# 5. Plan on held-out code prompts of the training corpus (never the benchmark), then the default path again.
CODE=$(mktemp --suffix=.jsonl)
.venv/bin/python benchmarks/heldout_prompts.py --kind code --count 8 --out "$CODE"
"$SPECDEC" plan --model $M --backend torch --prompts "$CODE" --per-category 8 --measure-top 1
"$SPECDEC" bench --model $M --prompts humaneval --per-category 16 --backends torch --repeats 1 --max-new-tokens 128 \
    --out "$OUT/tier_humaneval_planned_code" --methods plain redrafter
