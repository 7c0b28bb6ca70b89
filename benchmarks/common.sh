# Shared by the benchmark scripts: run from the repository root after `bash scripts/setup.sh dev,torch,hf,bench,mlx`.
# `run NAME ARGS...` writes bench.json, bench.md, speedup.png and accepted.png under benchmarks/results/NAME/.
SPECDEC=${SPECDEC:-.venv/bin/specdec}
OUT=benchmarks/results
OPENBLAS=${OPENBLAS:-/usr/lib/x86_64-linux-gnu/openblas-pthread/libblas.so.3}  # earlier runs preloaded it by hand; specdec_mlx now loads it itself
run() { local name=$1; shift; "$SPECDEC" bench --model smollm2-135m --categories --out "$OUT/$name" "$@"; }
