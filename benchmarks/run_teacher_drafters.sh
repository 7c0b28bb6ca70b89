#!/usr/bin/env bash
# Drafters trained on the target's own answers (benchmarks/README.md, "Drafters trained on the
# target's own answers"): the records, the EAGLE run, then the heads side by side on MT-Bench and
# HumanEval. DATA holds part1.npz and part2.npz (9,216 sequences of SmolLM2-135M-Instruct's greedy
# answers); runs/ keeps the checkpoints.
set -euo pipefail
source "$(dirname "$0")/common.sh"
DATA=${DATA:?set DATA to the folder holding part1.npz and part2.npz}
FILES=(--data "$DATA/part1.npz" --data "$DATA/part2.npz")
# 1. Records of every sequence (one teacher-forced forward each, the three EAGLE-3 layers kept),
#    cached in ~/.cache/specdec/teacher; one optimiser step so that only the records are made.
OMP_NUM_THREADS=1 "$SPECDEC" train eagle3 --model smollm2-135m --out runs/records --steps 1 --threads 1 \
    "${FILES[@]}"
# 2. EAGLE from the previous run's best weights (runs/eg2), first on the records made so far, then on all.
OMP_NUM_THREADS=1 "$SPECDEC" train eagle --model smollm2-135m --out runs/eg3 "${FILES[@]}" --init runs/eg2 \
    --max-positions 1400000 --minutes 40 --threads 1 --lr 5e-4 --batch-size 512 --top-k 4 --depth 4 \
    --total-tokens 16 --save-dtype float16
# 3. Then on all records with the training-time test (the shipped EAGLE).
OMP_NUM_THREADS=2 "$SPECDEC" train eagle --model smollm2-135m --out runs/eg4 "${FILES[@]}" --init runs/eg3 \
    --minutes 48 --threads 2 --lr 5e-4 --batch-size 512 --top-k 4 --depth 4 --total-tokens 16 --unroll 3 \
    --save-dtype float16
# 4. Side by side (both cores, nothing else running).
E=runs/eg4
"$SPECDEC" bench --model smollm2-135m --prompts mt-bench --per-category 2 --backends torch --repeats 1 \
    --max-new-tokens 128 --categories --out "$OUT/teacher_data/mtbench_all_records" --methods plain redrafter eagle \
    "eagle:drafter=$E,total_tokens=4,depth=3,tree_top_k=2" "eagle:drafter=$E,total_tokens=6,depth=3,tree_top_k=2" \
    "eagle:drafter=$E,total_tokens=6,depth=3,tree_top_k=2,speculation=always" \
    "eagle:drafter=$E,total_tokens=3,depth=3,tree_top_k=1"
"$SPECDEC" bench --model smollm2-135m --prompts humaneval --per-category 16 --backends torch --repeats 1 \
    --max-new-tokens 128 --out "$OUT/teacher_data/humaneval_all_records" --methods plain redrafter \
    redrafter:speculation=always "eagle:drafter=$E,total_tokens=6,depth=3,tree_top_k=2" \
    "eagle:drafter=$E,total_tokens=6,depth=3,tree_top_k=2,speculation=always"
