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
