#!/usr/bin/env bash
# Runs recorded in benchmarks/README.md, "Drafter weights in int8": the default path (ReDrafter
# with its lookup beam, weights in int8 where measured faster) against the same drafter with its
# weights in the target's dtype (int8=false), ReDrafter alone, plain decoding and transformers.
# Both cores, batch 1, 128 tokens, default dtype (measured), on an otherwise idle machine; ~40 minutes.
# Runs 1-4 were taken while the checkpoint's default beams were W=2, L=4 (so `redrafter` in their
# results is W=2, L=4); run 4 moved the default to W=2, L=3. To repeat 1-3 as run, add w=2,l=4.
set -euo pipefail
cd "$(dirname "$0")/.."
source benchmarks/common.sh

# 1. SmolLM2-135M, MT-Bench (2 per category).
run int8_mtbench --prompts mt-bench --per-category 2 --backends torch --repeats 1 --max-new-tokens 128 \
    --methods plain redrafter redrafter:int8=false redrafter:lookup=false hf:dtype=own
# 2. SmolLM2-135M, HumanEval (first 16).
run int8_humaneval --prompts humaneval --per-category 16 --backends torch --repeats 1 --max-new-tokens 128 \
    --methods plain redrafter redrafter:int8=false redrafter:lookup=false hf:dtype=own
# 3. float32 (texts identical to plain decoding): int8 weights forced, to measure acceptance on the same texts.
run int8_f32_identity --prompts mt-bench --per-category 2 --backends torch:float32 --repeats 1 \
    --max-new-tokens 128 --methods plain redrafter redrafter:int8=true redrafter:lookup=false \
    redrafter:lookup=false,int8=true
# 4. The beam shape after int8 drafting (`specdec plan --model smollm2-135m --no-save --measure-top 3`
#    recommended W=2, L=2 on MT-Bench's first prompt per category): the checkpoint's W=2, L=4 (its
#    default then; `redrafter:w=2,l=4` since) against shorter beams, both prompt sets, two runs with
#    the methods in opposite orders.
for set in "mt-bench --per-category 2" "humaneval --per-category 16"; do
    name=$(echo "$set" | cut -d' ' -f1 | tr -d -)
    run "int8_beams_$name" --prompts $set --backends torch --repeats 1 --max-new-tokens 128 \
        --methods plain redrafter:w=2,l=4 redrafter:w=2,l=3 redrafter:w=2,l=2
    run "int8_beams2_$name" --prompts $set --backends torch --repeats 1 --max-new-tokens 128 \
        --methods plain redrafter:w=2,l=2 redrafter:w=2,l=3 redrafter:w=2,l=4
done
# 5. The default path as shipped after run 4 (W=2, L=3, int8 weights, lookup beam), both prompt sets.
run int8_final_mtbench --prompts mt-bench --per-category 2 --backends torch --repeats 1 --max-new-tokens 128 \
    --methods plain redrafter redrafter:lookup=false hf:dtype=own
run int8_final_humaneval --prompts humaneval --per-category 16 --backends torch --repeats 1 --max-new-tokens 128 \
    --methods plain redrafter redrafter:lookup=false hf:dtype=own
# 6. float32 exactness with the new default beams, both backends (speeds not to be quoted: both in one process).
run int8_final_f32_identity --prompts mt-bench --per-category 1 --backends torch:float32 mlx --repeats 1 \
    --max-new-tokens 128 --methods plain redrafter redrafter:lookup=false
# 7. What torch.compile would buy instead (beam search; the target's layer math).
OMP_NUM_THREADS=2 .venv/bin/python benchmarks/compile_costs.py
# 8. The tier (Qwen2.5-Coder-1.5B, HumanEval first 16): the default path with and without int8 drafter weights.
"$SPECDEC" bench --model qwen2.5-coder-1.5b --prompts humaneval --per-category 16 --backends torch --repeats 1 \
    --max-new-tokens 128 --out "$OUT/int8_tier" --methods plain redrafter redrafter:int8=false
