"""Helpers shared by the benchmark scripts that compare kernel choices end to end
(``head_products.py``, ``decode_kernels.py``); run those from the repository root."""

from __future__ import annotations

import time
from typing import Any, Callable

import numpy as np

import specdec


def decode_rate(target, prompts, drafter: str, max_new_tokens: int) -> float:
    """Decode-phase tokens/s over ``prompts`` (prefill and the first token excluded)."""
    tokens, seconds = 0, 0.0
    for prompt in prompts:
        stats = specdec.generate(
            target, prompt, drafter=drafter, backend="torch", max_new_tokens=max_new_tokens
        ).stats
        tokens += stats.new_tokens - 1
        seconds += stats.time_draft + stats.time_verify + stats.time_other
    return tokens / seconds


def median_seconds(run: Callable[[], Any], repeats: int) -> float:
    """Median wall time of ``run()`` over ``repeats`` calls after one warm-up call."""
    run()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return float(np.median(times))


def parse_ab_arguments(description: str, *, dtypes: list[str], prompts: int, rounds: int):
    """The options both kernel comparisons take -> (args, MT-Bench prompts, report skeleton)."""
    import argparse

    import torch

    from specdec.bench import load_prompt_set

    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--dtypes", nargs="+", default=dtypes)
    parser.add_argument(
        "--prompts", type=int, default=prompts, help="first MT-Bench prompt of this many categories"
    )
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=rounds)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    chosen = [p.prompt for p in load_prompt_set("mt-bench", per_category=1)[: args.prompts]]
    report = {
        "model": args.model,
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "dtypes": {},
    }
    return args, chosen, report


def add_entry(report: dict, dtype: str, entry: dict, out: str | None) -> None:
    """Record one dtype's results, print them, and rewrite the JSON report when asked to."""
    import json

    report["dtypes"][dtype] = entry
    print(dtype, json.dumps(entry, indent=1), flush=True)
    if out:
        with open(out, "w") as f:
            json.dump(report, f, indent=1)
