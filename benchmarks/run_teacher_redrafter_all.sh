#!/usr/bin/env bash
# The ReDrafter that ships now (benchmarks/README.md, "The ReDrafter continued on all the teacher
# data"): the head before it (run_teacher_redrafter.sh, 1.3M positions) trained on for 60 minutes
# of one thread on all 2.49M answer positions at half the learning rate, then both side by side
# on MT-Bench and HumanEval. DATA holds part1.npz and part2.npz; the records of all the sequences
# are made (and cached) first, on both threads.
set -euo pipefail
source "$(dirname "$0")/common.sh"
DATA=${DATA:?set DATA to the folder holding part1.npz and part2.npz}
FILES=(--data "$DATA/part1.npz" --data "$DATA/part2.npz")
BEFORE=${BEFORE:?set BEFORE to the head before (a checkpoint folder of run_teacher_redrafter.sh)}
OMP_NUM_THREADS=2 "$SPECDEC" train redrafter --model smollm2-135m --out runs/records-all --overwrite \
    --steps 1 --threads 2 "${FILES[@]}" --draft-layers 2 --beam-width 2 --beam-length 4
OMP_NUM_THREADS=1 "$SPECDEC" train redrafter --model smollm2-135m --out runs/rd3 --init "$BEFORE" \
    "${FILES[@]}" --minutes 60 --threads 1 --draft-layers 2 --beam-width 2 --beam-length 4 \
    --batch-size 256 --lr 5e-4 --weight-decay 0.1 --negatives 4096 --save-dtype float16 --quiet
for prompts in "mt-bench --per-category 2" "humaneval --per-category 16"; do
    # shellcheck disable=SC2086
    "$SPECDEC" bench --model smollm2-135m --prompts $prompts --backends torch --repeats 1 \
        --max-new-tokens 128 --out "$OUT/teacher_rd3/${prompts%% *}" --methods plain \
        "redrafter:drafter=$BEFORE,beam_length=3" "redrafter:drafter=runs/rd3,beam_length=3"
done
