#!/usr/bin/env bash
# Data scaling of the drafters trained on the target's own answers (benchmarks/README.md, "How
# acceptance grows with the teacher data"): ReDrafter and EAGLE-3 on the first 0.1M, 0.3M and 1.3M
# answer positions of the teacher sequences and on all of them (3.0M; SIZES="..." picks some),
# each for the optimiser steps that 20 minutes of one thread make here (the same positions seen
# for every data size: only how many distinct ones changes), the two drafters side by side, one
# thread each. Held-out tokens per step are each run's
# last evaluation (training_log.json). DATA holds part1.npz and part2.npz; the records are those of
# run_teacher_redrafter.sh (cached in ~/.cache/specdec/teacher).
set -euo pipefail
source "$(dirname "$0")/common.sh"
DATA=${DATA:?set DATA to the folder holding part1.npz and part2.npz}
FILES=(--data "$DATA/part1.npz" --data "$DATA/part2.npz")
COMMON=(--model smollm2-135m --threads 1 --lr 1e-3 --weight-decay 0.1 --negatives 4096 \
    --save-dtype float16 --quiet "${FILES[@]}")
train_sizes() {  # kind steps settings...
    local kind=$1 steps=$2
    shift 2
    for n in ${SIZES:-100000 300000 1300000 all}; do
        local size=(--max-positions "$n")
        [ "$n" = all ] && size=()
        OMP_NUM_THREADS=1 "$SPECDEC" train "$kind" --out "runs/scale/$kind-$n" --overwrite \
            "${size[@]}" --steps "$steps" "${COMMON[@]}" "$@"
    done
}
train_sizes redrafter 2150 --draft-layers 2 --beam-width 2 --beam-length 4 --batch-size 256 &
train_sizes eagle3 700 --batch-size 512 --top-k 4 --depth 4 --total-tokens 16 --unroll 4 \
    --draft-vocab 8192 &
wait
mkdir -p "$OUT/teacher_scaling"
for run in runs/scale/*/; do
    for file in training_log.json training_report.json; do
        cp "$run/$file" "$OUT/teacher_scaling/$(basename "$run").$file"
    done
done
