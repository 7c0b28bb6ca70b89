"""Bursts on a fresh engine: N requests submitted at once to a new ``specdec.Engine``, plain
decoding against a drafter (``--drafter``, ReDrafter by default) under ``--speculation auto`` and
``always`` (``never``: the drafter attached, every step plain). A server that
starts and meets a burst, or a batch job on the engine, meets exactly this: the choice of how
much to draft has seen nothing yet.

Per run: a fresh engine (its cost curve read from the cache or measured, nothing else carried
over), one 8-token warm-up request, then the burst (MT-Bench first turns as chats,
``--max-new-tokens`` each, ``ignore_eos``); tokens/s over the burst. The prompts are taken in
turn from the eight categories (4 per category), and each round's burst starts where the last
one's ended: a burst of 1 is a different prompt (and category) in each round, as a burst of 4
is four categories, and every mode of a round decodes the same prompts. (Before, every burst
began at the first prompt, so the one-request figure was one writing prompt's, the second
least predictable of the eight categories' first prompts on the shipped ReDrafter.)

The modes are interleaved per round, their order alternating; printed per burst size: the
median tokens/s of each mode and the median of the per-round ratios to plain, with each
round's ratio, and for auto the steps, the drafting steps and what the realized-rate check
(``specdec.decode.realized``) saw.

    python benchmarks/engine_burst.py --bursts 1 4 16 32 --rounds 3
    python benchmarks/engine_burst.py --model qwen2.5-coder-1.5b --bursts 1 4 16 --rounds 3
    python benchmarks/engine_burst.py --drafter eagle --bursts 16 --modes plain never auto
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def run(
    model, drafter, prompts, mode: str, burst: int, tokens: int, slots: int, first: int = 0
) -> dict:
    """One fresh engine, one burst: tokens/s and what the speculation policy did."""
    from specdec.serving.engine import Engine

    plain = mode == "plain"
    drafter, speculation = ("none", None) if plain else (drafter, mode)
    with Engine(model, drafter=drafter, speculation=speculation, slots=slots) as engine:
        engine.submit("Hello", max_new_tokens=8).result()
        start = time.perf_counter()
        handles = [
            engine.submit(
                [{"role": "user", "content": prompts[(first + i) % len(prompts)]}],
                max_new_tokens=tokens,
                ignore_eos=True,
            )
            for i in range(burst)
        ]
        results = [handle.result() for handle in handles]
        seconds = time.perf_counter() - start
        policy = engine.speculation
        return {
            "tokens_per_second": sum(len(r.tokens) for r in results) / seconds,
            "steps_per_request": sum(r.steps for r in results) / len(results),
            "drafted_per_request": sum(r.drafted_tokens for r in results) / len(results),
            "accepted_per_request": sum(r.accepted_tokens for r in results) / len(results),
            "realized": policy.realized.describe(),
        }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument(
        "--drafter", default="redrafter", help="the drafter of every mode but plain"
    )
    parser.add_argument("--bursts", nargs="+", type=int, default=[1, 4, 16, 32])
    parser.add_argument("--modes", nargs="+", default=["plain", "auto", "always"])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--slots", type=int, default=16)
    parser.add_argument("--json", default=None, help="also write every run here")
    args = parser.parse_args()
    if "plain" not in args.modes:
        parser.error("--modes needs plain: the ratios are to it")
    sys.path.insert(0, str(ROOT))
    from specdec.bench.prompts import load_prompt_set

    chats = load_prompt_set("mt-bench", per_category=4)
    by_category = {}
    for chat in chats:
        by_category.setdefault(chat.category, []).append(chat.messages[-1]["content"])
    # in turn from each category: writing 1, roleplay 1, ..., writing 2, ...
    prompts = [p for group in zip(*by_category.values()) for p in group]
    every = []
    for burst in args.bursts:
        runs = {mode: [] for mode in args.modes}
        for round_ in range(args.rounds):
            for mode in args.modes if round_ % 2 == 0 else args.modes[::-1]:
                start = round_ * burst  # each round its own prompts, the same for every mode
                result = run(
                    args.model,
                    args.drafter,
                    prompts,
                    mode,
                    burst,
                    args.max_new_tokens,
                    args.slots,
                    start,
                )
                runs[mode].append(result)
                every.append({"burst": burst, "mode": mode, "round": round_, **result})
        cells = []
        for mode, results in runs.items():
            rates = [r["tokens_per_second"] for r in results]
            ratios = [a / b["tokens_per_second"] for a, b in zip(rates, runs["plain"])]
            each = ", ".join(f"{r:.2f}" for r in ratios)
            steps = statistics.median(r["steps_per_request"] for r in results)
            cells.append(
                f"{mode} {statistics.median(rates):.1f} tok/s ({statistics.median(ratios):.2f}x; "
                f"rounds {each}; {steps:.0f} steps/request)"
            )
        print(f"burst {burst}: " + " | ".join(cells), flush=True)
        if "auto" in runs:
            print(f"  auto realized tok/s by rows: {runs['auto'][-1]['realized']}", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(every, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
