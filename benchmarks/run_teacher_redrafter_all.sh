#!/usr/bin/env bash
# The ReDrafter that ships now (benchmarks/README.md, "The ReDrafter continued on all the teacher
# data"): the head before it (run_teacher_redrafter.sh, 1.3M positions) trained on for 60 minutes
# of one thread on all 2.49M answer positions at half the learning rate, then both side by side
# on MT-Bench and HumanEval. DATA holds part1.npz and part2.npz; the records of all the sequences
# are made (and cached) first, on both threads. RUN, LR and MINUTES name and size a further run
# from the head before (BEFORE): RUN=rd4 BEFORE=runs/rd3 LR=3e-4 MINUTES=60 trained the one after.
set -euo pipefail
source "$(dirname "$0")/common.sh"
DATA=${DATA:?set DATA to the folder holding part1.npz and part2.npz}
FILES=(--data "$DATA/part1.npz" --data "$DATA/part2.npz")
BEFORE=${BEFORE:?set BEFORE to the head before (a checkpoint folder of run_teacher_redrafter.sh)}
OMP_NUM_THREADS=2 "$SPECDEC" train redrafter --model smollm2-135m --out runs/records-all --overwrite \
    --steps 1 --threads 2 "${FILES[@]}" --draft-layers 2 --beam-width 2 --beam-length 4
RUN=${RUN:-rd3}
OMP_NUM_THREADS=1 "$SPECDEC" train redrafter --model smollm2-135m --out "runs/$RUN" --init "$BEFORE" \
    "${FILES[@]}" --minutes "${MINUTES:-60}" --threads 1 --draft-layers 2 --beam-width 2 \
    --beam-length 4 --batch-size 256 --lr "${LR:-5e-4}" --weight-decay 0.1 --negatives 4096 \
    --save-dtype float16 --quiet
for prompts in "mt-bench --per-category 2" "humaneval --per-category 16"; do
    # shellcheck disable=SC2086
    "$SPECDEC" bench --model smollm2-135m --prompts $prompts --backends torch --repeats 1 \
        --max-new-tokens 128 --out "$OUT/teacher_$RUN/${prompts%% *}" --methods plain \
        "redrafter:drafter=$BEFORE,beam_length=3" "redrafter:drafter=runs/$RUN,beam_length=3"
done
