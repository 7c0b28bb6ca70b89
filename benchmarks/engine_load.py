"""Closed-loop clients on ``specdec.Engine`` in one process (no HTTP): throughput of plain decoding
and of the default drafter under ``--speculation`` modes as the number of concurrent requests
grows. Each client submits its next request (an MT-Bench first turn of 32-96 tokens, the same
lengths as ``load_test.py``) when its last one ends; a fresh engine per run on one loaded
target (leased by one engine at a time), so what "auto" learnt in the runs before carries
over, as on a server that has run a while (``specdec.decode.memory``; ``engine_burst.py``
loads the model afresh per run for a start from nothing); the modes interleaved per round,
their order alternating. Prints per concurrency the median tokens/s of each mode and the median
of the per-round ratios to plain.

    python benchmarks/engine_load.py --concurrency 8 32 --rounds 2 --modes plain auto
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def run(target, prompts, mode: str, clients: int, requests: int, bounds) -> float:
    """Tokens/s of ``requests`` requests served to ``clients`` closed-loop clients."""
    from specdec.serving.engine import Engine

    plain = mode == "plain"
    drafter, speculation = ("none", None) if plain else ("redrafter", mode)
    with Engine(target, drafter=drafter, speculation=speculation) as engine:
        engine.generate(prompts[0], max_new_tokens=4, ignore_eos=True)  # warm-up
        queue, lock, tokens = list(range(requests)), threading.Lock(), [0]

        def client():
            while True:
                with lock:
                    if not queue:
                        return
                    i = queue.pop(0)
                length = random.Random(i).randint(*bounds)
                done = engine.generate(
                    prompts[i % len(prompts)], max_new_tokens=length, ignore_eos=True
                )
                with lock:
                    tokens[0] += len(done.tokens)

        start = time.perf_counter()
        threads = [threading.Thread(target=client) for _ in range(clients)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        return tokens[0] / (time.perf_counter() - start)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--concurrency", nargs="+", type=int, default=[1, 8, 32])
    parser.add_argument("--modes", nargs="+", default=["plain", "auto", "always"])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--requests", type=int, default=32)
    parser.add_argument("--max-tokens", type=int, nargs=2, default=[32, 96])
    parser.add_argument("--slots", type=int, default=16)
    args = parser.parse_args()
    if "plain" not in args.modes:
        parser.error("--modes needs plain: the ratios are to it")
    sys.path.insert(0, str(ROOT))
    import specdec
    from specdec.bench.prompts import load_prompt_set

    prompts = [p.prompt for p in load_prompt_set("mt-bench", per_category=2)]
    target = specdec.load(args.model, slots=args.slots, capacity=1024)
    for clients in args.concurrency:
        rates = {mode: [] for mode in args.modes}
        for round_ in range(args.rounds):
            for mode in args.modes if round_ % 2 == 0 else args.modes[::-1]:
                rate = run(target, prompts, mode, clients, args.requests, args.max_tokens)
                rates[mode].append(rate)
        cells = []
        for mode, values in rates.items():
            ratios = [a / b for a, b in zip(values, rates["plain"])]
            each = ", ".join(f"{r:.2f}" for r in ratios)
            cells.append(
                f"{mode} {statistics.median(values):.1f} tok/s "
                f"({statistics.median(ratios):.2f}x; rounds {each})"
            )
        print(f"{clients} clients: " + " | ".join(cells), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
