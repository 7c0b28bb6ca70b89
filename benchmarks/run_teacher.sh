#!/usr/bin/env bash
# Teacher data through our target, batched in flight (benchmarks/README.md, last section), and the
# default path measured again after the attention and cache-view changes that came with it.
# Needs a worktree of the commit before the change: git worktree add /tmp/before 75d1786
set -euo pipefail
source "$(dirname "$0")/common.sh"
root=$PWD
mkdir -p "$OUT/teacher_rate/load_test"
# 1. Teacher decoding rate, SmolLM2-135M, 3 rounds alternating; Qwen2.5-Coder-1.5B, one run each.
for round in 1 2 3; do for dir in /tmp/before "$root"; do
  (cd /tmp && PYTHONPATH=$dir:$dir/backends:$dir/drafters OMP_NUM_THREADS=2 "$root/.venv/bin/python" \
     "$root/benchmarks/teacher_rate.py" --label "$(basename "$dir")")
done; done > "$OUT/teacher_rate/bfloat16_128x128.jsonl"
for dir in /tmp/before "$root"; do
  (cd /tmp && PYTHONPATH=$dir:$dir/backends:$dir/drafters OMP_NUM_THREADS=2 "$root/.venv/bin/python" \
     "$root/benchmarks/teacher_rate.py" --model qwen2.5-coder-1.5b --prompts 64 --label "$(basename "$dir")")
done > "$OUT/teacher_rate/qwen15_bfloat16_64x128.jsonl"
# 2. Serving at 16 clients, before and after, 2 rounds alternating.
for round in 1 2; do for dir in /tmp/before "$root"; do
  (cd "$dir" && PYTHONPATH=$dir:$dir/backends:$dir/drafters OMP_NUM_THREADS=2 "$root/.venv/bin/python" \
     benchmarks/load_test.py --modes inflight --concurrency 16 --max-tokens 8 32 \
     --out "$root/$OUT/teacher_rate/load_test/$(basename "$dir")-$round.json")
done; done
# 3. The default path at this commit, both prompt sets, and float32 exactness on both backends.
run teacher_final_mtbench --prompts mt-bench --per-category 2 --backends torch --repeats 1 --max-new-tokens 128 \
    --methods plain redrafter redrafter:lookup=false hf:dtype=own
run teacher_final_humaneval --prompts humaneval --per-category 16 --backends torch --repeats 1 --max-new-tokens 128 \
    --methods plain redrafter redrafter:lookup=false hf:dtype=own
run teacher_final_f32_identity --prompts mt-bench --per-category 1 --backends torch:float32 mlx --repeats 1 \
    --max-new-tokens 128 --methods plain redrafter redrafter:lookup=false medusa eagle lookup
