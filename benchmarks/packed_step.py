"""What packing a prompt chunk into the decode forward saves (decision 0007), side by side.

    python benchmarks/packed_step.py --model smollm2-135m --rows 4 --chunks 32 128 512 --rounds 7

``rows`` requests are decoding (128-token prompts admitted); each round times, interleaved:
"tree" one verification forward of their draft trees (beams W=2, L=4 as a prefix tree, ~7 nodes
a row); "chunk" a prompt chunk of c tokens alone; "separate" the chunk's forward then the trees'
(two forwards, as a step ran before packing); "packed" one ``forward_tree(tree, slots,
context=[chunk])``. Nothing is committed: the chunk's slot is released after each forward. The
table gives medians over rounds (ms) and separate / packed. Writes JSON to --out.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

import specdec
from specdec.plugins.registry import default_registry
from specdec.reference.tree import build_prefix_tree
from specdec.testing.checks import to_backend_tree


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--backend", default="torch")
    parser.add_argument("--dtype", default=None, help="default: the dtype measured fastest here")
    parser.add_argument("--rows", type=int, default=4)
    parser.add_argument("--chunks", nargs="+", type=int, default=[32, 128, 512])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--out", default="benchmarks/results/packed_step.json")
    args = parser.parse_args()
    backend = default_registry().get("backend", args.backend).factory()
    target = specdec.load(
        args.model, backend=args.backend, dtype=args.dtype, slots=args.rows + 1, capacity=1024
    )
    rng = np.random.default_rng(0)
    vocab = int(target.vocab_size)
    slots = np.arange(args.rows, dtype=np.int64)
    for slot in slots:
        target.admit(int(slot), rng.integers(0, vocab, size=128).tolist())
    beams = rng.integers(0, vocab, size=(args.rows, 2, 4))
    beams[:, 1, :2] = beams[:, 0, :2]  # the beams share a prefix, as drafted beams do
    tree = to_backend_tree(build_prefix_tree(beams), backend, target)
    spare = args.rows
    sync = (
        lambda output: backend.to_numpy(
            output.hidden[..., :1]
            if output.hidden is not None  # noqa: E731
            else output.context[-1].hidden[:1]
        )
    )

    def timed(fn) -> float:
        start = time.perf_counter()
        fn()
        return (time.perf_counter() - start) * 1e3

    def chunk_only(chunk):
        sync(target.forward_tree(None, (), context=[(spare, chunk)]))
        target.release(spare)

    def separate(chunk):
        chunk_only(chunk)
        sync(target.forward_tree(tree, slots))

    def packed(chunk):
        sync(target.forward_tree(tree, slots, context=[(spare, chunk)]))
        target.release(spare)

    table = {}
    for c in args.chunks:
        chunk = rng.integers(0, vocab, size=c)
        runs = {"tree": [], "chunk": [], "separate": [], "packed": []}
        for _ in range(args.rounds + 1):  # the first round warms up
            runs["tree"].append(timed(lambda: sync(target.forward_tree(tree, slots))))
            runs["chunk"].append(timed(lambda: chunk_only(chunk)))
            runs["separate"].append(timed(lambda: separate(chunk)))
            runs["packed"].append(timed(lambda: packed(chunk)))
        table[c] = {name: float(np.median(values[1:])) for name, values in runs.items()}
    dtype = getattr(target, "dtype", "")
    print(
        f"{args.model}, {args.backend} {dtype}, {args.rows} decoding rows of "
        f"{int(np.asarray(tree.num_nodes).max())} nodes at most, medians of {args.rounds} rounds "
        "(ms)\n"
    )
    print(
        "| chunk | tree alone | chunk alone | separate (2 forwards) | packed (1 forward) | "
        "separate / packed |"
    )
    print("|---|---|---|---|---|---|")
    for c, row in table.items():
        print(
            f"| {c} | {row['tree']:.1f} | {row['chunk']:.1f} | {row['separate']:.1f} | "
            f"{row['packed']:.1f} | {row['separate'] / row['packed']:.2f} |"
        )
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(dict(args=vars(args), dtype=str(dtype), table=table), indent=1))


if __name__ == "__main__":
    main()
