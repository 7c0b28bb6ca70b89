"""One forward of the torch target with exact mode on and off, side by side (decision 0010).

For committed contexts of 100, 400 and 1,000 tokens and trees of 1, 8 and 16 nodes, the median of
interleaved forwards of two targets loaded from the same folder, one in exact mode, one not, and
a 512-token prompt chunk. Usage: python benchmarks/exact_costs.py [--model smollm2-135m]
[--dtype bfloat16] [--threads 2] [--rounds 12]
"""

from __future__ import annotations

import argparse
import time

import attrs
import numpy as np
import torch

import specdec
from specdec.reference.tree import build_prefix_tree
from specdec.types import DraftTree


def tree(width: int, length: int, vocab: int) -> DraftTree:
    tokens = ((np.arange(width * length) * 104729 + 1) % vocab).reshape(1, width, length)
    tokens[:, :, 0] = 5  # one root
    built = build_prefix_tree(tokens)
    return DraftTree(
        **{
            f.name: None
            if getattr(built, f.name) is None
            else torch.from_numpy(np.asarray(getattr(built, f.name)))
            for f in attrs.fields(DraftTree)
        }
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=12)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    targets = {
        exact: specdec.load(
            args.model, backend="torch", dtype=args.dtype, capacity=1200, exact=exact
        )
        for exact in (False, True)
    }
    vocab = targets[True].vocab_size
    print(f"exact mode: {specdec.tuning.exactness.describe(targets[True])}")
    trees = {1: tree(1, 1, vocab), 8: tree(2, 4, vocab), 16: tree(4, 4, vocab)}
    print("| keys | nodes | exact off ms | exact on ms | on / off |")
    print("|---|---|---|---|---|")
    for context in (100, 400, 1000):
        for target in targets.values():
            if target.cache.admitted[0]:
                target.release(0)
            target.admit(0, ((np.arange(context) * 7919 + 13) % vocab).tolist())
        times = {(e, k): [] for e in targets for k in trees}
        for round_ in range(args.rounds):
            for exact, target in targets.items() if round_ % 2 == 0 else reversed(targets.items()):
                for nodes, t in trees.items():
                    start = time.perf_counter()
                    target.forward_tree(t, [0])
                    times[(exact, nodes)].append(time.perf_counter() - start)
        for nodes in trees:
            off, on = (1e3 * float(np.median(times[(e, nodes)][2:])) for e in (False, True))
            print(f"| {context} | {nodes} | {off:.1f} | {on:.1f} | {on / off:.2f} |")
    prefill = {e: [] for e in targets}
    for _ in range(3):
        for exact, target in targets.items():
            target.release(0)
            start = time.perf_counter()
            target.admit(0, ((np.arange(512) * 7919 + 13) % vocab).tolist())
            prefill[exact].append(time.perf_counter() - start)
    off, on = (1e3 * float(np.median(prefill[e])) for e in (False, True))
    print(f"| prompt chunk of 512 | - | {off:.0f} | {on:.0f} | {on / off:.2f} |")


if __name__ == "__main__":
    main()
