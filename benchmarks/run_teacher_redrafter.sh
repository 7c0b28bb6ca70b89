#!/usr/bin/env bash
# The ReDrafter retrained on the target's own answers, and a first EAGLE-3 on them
# (benchmarks/README.md, "The ReDrafter retrained on the target's own answers"): records of the
# first 1.3M answer positions, the two runs side by side (one thread each), then both beside the
# shipped drafters on MT-Bench and HumanEval. DATA holds part1.npz and part2.npz.
set -euo pipefail
source "$(dirname "$0")/common.sh"
DATA=${DATA:?set DATA to the folder holding part1.npz and part2.npz}
FILES=(--data "$DATA/part1.npz" --data "$DATA/part2.npz")
# 1. Records (cached in ~/.cache/specdec/teacher; the three EAGLE-3 layers kept for every drafter).
OMP_NUM_THREADS=2 "$SPECDEC" train eagle3 --model smollm2-135m --out runs/records --steps 1 --threads 2 \
    --max-positions 1300000 "${FILES[@]}"
# 2. The two runs, one thread each.
OMP_NUM_THREADS=1 "$SPECDEC" train redrafter --model smollm2-135m --out runs/rd2 "${FILES[@]}" \
    --max-positions 1300000 --minutes 55 --threads 1 --draft-layers 2 --beam-width 2 --beam-length 4 \
    --batch-size 256 --lr 1e-3 --weight-decay 0.1 --negatives 4096 --save-dtype float16 --quiet &
OMP_NUM_THREADS=1 "$SPECDEC" train eagle3 --model smollm2-135m --out runs/e3 "${FILES[@]}" \
    --max-positions 1300000 --minutes 52 --threads 1 --batch-size 512 --lr 1e-3 --top-k 4 --depth 4 \
    --total-tokens 16 --unroll 4 --negatives 4096 --draft-vocab 8192 --save-dtype float16 --quiet &
wait
# 3. Side by side (both cores, nothing else running).
"$SPECDEC" bench --model smollm2-135m --prompts mt-bench --per-category 2 --backends torch --repeats 1 \
    --max-new-tokens 128 --out "$OUT/teacher_rd2/mtbench" --methods plain redrafter \
    "redrafter:drafter=runs/rd2" "redrafter:drafter=runs/rd2,beam_length=3" eagle "eagle3:drafter=runs/e3" \
    "eagle3:drafter=runs/e3,total_tokens=6,depth=3,tree_top_k=2"
"$SPECDEC" bench --model smollm2-135m --prompts humaneval --per-category 16 --backends torch --repeats 1 \
    --max-new-tokens 128 --out "$OUT/teacher_rd2/humaneval" --methods plain redrafter \
    "redrafter:drafter=runs/rd2" "redrafter:drafter=runs/rd2,beam_length=3" \
    "eagle3:drafter=runs/e3,total_tokens=6,depth=3,tree_top_k=2"
