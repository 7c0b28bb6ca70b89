"""Cost of verifying k tokens, t(k)/t(1), on the old default path and on today's, side by side.

    python benchmarks/tree_costs.py --model smollm2-135m --sizes 1 4 8 16 32 --rounds 5

"before": float32 (the old ``dtype=None`` on a CPU) with one matmul per q/k/v and gate/up
projection; "after": the dtype ``specdec.load`` measures fastest here (``specdec.tuning.dtype``),
with packed projections. Both targets are loaded in one process and measured in interleaved
rounds (``specdec.tuning.dtype.measure_forward``: a chain of k tokens after a 64-token prompt,
median of 5 per round); the table gives the median over rounds. Writes JSON to --out.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

import specdec
from specdec.plugins.registry import default_registry
from specdec.tuning.dtype import measure_forward


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--backend", default="torch")
    parser.add_argument("--sizes", nargs="+", type=int, default=[1, 4, 8, 16, 32])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--out", default="benchmarks/results/tree_costs.json")
    args = parser.parse_args()
    backend = default_registry().get("backend", args.backend).factory()
    after = specdec.load(args.model, backend=args.backend)
    before = specdec.load(args.model, backend=args.backend, dtype="float32")
    before._packed = None  # the forward as it was: one matmul per projection
    targets = {
        "before (float32, unpacked)": before,
        f"after ({after.dtype_choice.dtype}, packed)": after,
    }
    runs = {name: [] for name in targets}
    for _ in range(args.rounds):
        for name, target in targets.items():
            runs[name].append(measure_forward(backend, target, args.sizes))
    table = {
        name: {k: float(np.median([r[k] for r in rounds])) for k in args.sizes}
        for name, rounds in runs.items()
    }
    print(f"{args.model}, {args.backend}, {after.dtype_choice.device or ''}\n")
    print(
        "| path | "
        + " | ".join(f"t({k}) ms" for k in args.sizes)
        + " | "
        + " | ".join(f"t({k})/t(1)" for k in args.sizes[1:])
        + " |"
    )
    print("|---|" + "---|" * (2 * len(args.sizes) - 1))
    for name, costs in table.items():
        print(
            f"| {name} | "
            + " | ".join(f"{costs[k]:.1f}" for k in args.sizes)
            + " | "
            + " | ".join(f"{costs[k] / costs[args.sizes[0]]:.2f}" for k in args.sizes[1:])
            + " |"
        )
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(
        json.dumps(
            dict(
                args=vars(args), table=table, rounds=runs, choice=str(after.dtype_choice.describe())
            ),
            indent=1,
        )
    )


if __name__ == "__main__":
    main()
