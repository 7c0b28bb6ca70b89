#!/usr/bin/env bash
# Side-by-side A/B of two checkouts of specdec on one workload: runs `specdec bench` from each
# checkout in turn (A B A B ...), each in its own process with that checkout first on sys.path,
# and prints each run's table. Usage:
#   [PYTHON_BEFORE=BEFORE_DIR/.venv/bin/python] \
#   bash benchmarks/ab_versions.sh BEFORE_DIR AFTER_DIR ROUNDS [specdec bench arguments...]
# Example (the checkout before a change, as a worktree):
#   git worktree add /tmp/before <commit>
#   bash benchmarks/ab_versions.sh /tmp/before . 3 --model smollm2-135m --prompts mt-bench \
#        --per-category 1 --methods plain redrafter --max-new-tokens 96 --repeats 1
set -euo pipefail
before=$(cd "$1" && pwd); after=$(cd "$2" && pwd); rounds=$3; shift 3
python=${PYTHON:-$(cd "$(dirname "$0")/.." && pwd)/.venv/bin/python}
# a checkout whose plugins' entry points differ needs its own environment: PYTHON_BEFORE
python_before=${PYTHON_BEFORE:-$python}
for round in $(seq 1 "$rounds"); do
  for side in before after; do
    dir=$([ "$side" = before ] && echo "$before" || echo "$after")
    run=$([ "$side" = before ] && echo "$python_before" || echo "$python")
    echo "=== round $round: $side ($dir, $(git -C "$dir" rev-parse --short HEAD)) load $(cut -d' ' -f1 /proc/loadavg)"
    # the command line's entry point: specdec.cli.main.main, or specdec.cli.main in a checkout
    # from before the core was laid out by role (decision 0012)
    (cd /tmp && PYTHONPATH="$dir:$dir/backends:$dir/drafters" "$run" -c "
import sys, specdec
assert specdec.__file__.startswith('$dir'), specdec.__file__
try:
    from specdec.cli.main import main
except ImportError:
    from specdec.cli import main
sys.exit(main(sys.argv[1:]))" bench "$@" --out "/tmp/ab-$side-$round")
  done
done
