"""Cost of verifying k tokens on the mlx backend, t(k)/t(1), under the BLAS the mlx[cpu] wheel
bundles and under the OpenBLAS the mlx extra installs from PyPI (ngsolve-openblas), side by side.

    python benchmarks/mlx_blas_costs.py --model smollm2-135m --sizes 1 4 8 16 32 --rounds 5

The BLAS is chosen when a process loads MLX, so each round runs one process per BLAS
(``SPECDEC_MLX_BLAS=bundled``, then the default), alternating; each measures
``specdec.tuning.measure_forward`` (a chain of k tokens after a 64-token prompt, median of 5) in
float32. The table gives the median over rounds. Writes JSON to --out.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np

ONE_ROUND = """
import json, sys
import specdec
from specdec.plugins.registry import default_registry
from specdec.tuning import measure_forward
from specdec_mlx.blas import _state
backend = default_registry().get("backend", "mlx").factory()
target = specdec.load(sys.argv[1], backend="mlx", dtype="float32")
sizes = [int(k) for k in sys.argv[2:]]
costs = measure_forward(backend, target, sizes)
print(
    json.dumps({"blas": _state["loaded"] or "bundled", "costs": {str(k): costs[k] for k in sizes}})
)
"""

CHOICES = {"bundled reference BLAS": "bundled", "OpenBLAS from PyPI (ngsolve-openblas)": ""}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--sizes", nargs="+", type=int, default=[1, 4, 8, 16, 32])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--out", default="benchmarks/results/mlx_blas_costs.json")
    args = parser.parse_args()
    runs: dict[str, list] = {name: [] for name in CHOICES}
    for _ in range(args.rounds):
        for name, choice in CHOICES.items():
            env = {**os.environ, "SPECDEC_MLX_BLAS": choice}
            done = subprocess.run(
                [sys.executable, "-c", ONE_ROUND, args.model, *map(str, args.sizes)],
                env=env,
                capture_output=True,
                text=True,
                check=True,
            )
            runs[name].append(json.loads(done.stdout.strip().splitlines()[-1]))
    table = {
        name: {k: float(np.median([r["costs"][str(k)] for r in rounds])) for k in args.sizes}
        for name, rounds in runs.items()
    }
    print(f"{args.model}, mlx float32, {args.rounds} interleaved rounds\n")
    print(
        "| BLAS | "
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
    out.write_text(json.dumps(dict(args=vars(args), table=table, rounds=runs), indent=1))


if __name__ == "__main__":
    main()
