"""What the measured LM-head product formulation (``specdec_torch.products``) buys end to end.

For each dtype: plain decoding and the default path (ReDrafter with its lookup beam) with every
vocabulary-sized product forced to ``F.linear`` (the formulation before), against the
formulation measured fastest on this machine, interleaved per round (the order alternating); decode-phase tokens/s
(prefill excluded), medians over rounds. Also times the products themselves. Writes JSON.

    python benchmarks/head_products.py --model smollm2-135m --rounds 3 --out benchmarks/results/head_products.json
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np
import torch

import specdec
from specdec.bench import load_prompt_set
from specdec_torch import products


def decode_rate(target, prompts, drafter: str, max_new_tokens: int) -> float:
    tokens, seconds = 0, 0.0
    for prompt in prompts:
        stats = specdec.generate(target, prompt, drafter=drafter, backend="torch", max_new_tokens=max_new_tokens).stats
        tokens += stats.new_tokens - 1
        seconds += stats.time_draft + stats.time_verify + stats.time_other
    return tokens / seconds


def product_ms(weight: torch.Tensor, rows: int, transposed: bool, repeats: int = 15) -> float:
    x = torch.randn(rows, weight.shape[1], dtype=weight.dtype)
    run = (lambda: products._transposed(x, weight)) if transposed else (lambda: torch.nn.functional.linear(x, weight))
    run()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return float(np.median(times)) * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16"])
    parser.add_argument("--prompts", type=int, default=4, help="first MT-Bench prompt of this many categories")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    prompts = [p.prompt for p in load_prompt_set("mt-bench", per_category=1)[: args.prompts]]
    report = {"model": args.model, "torch": torch.__version__, "threads": torch.get_num_threads(), "dtypes": {}}
    for dtype in args.dtypes:
        target = specdec.load(args.model, backend="torch", dtype=dtype)
        products._TRANSPOSED.clear()
        decode_rate(target, prompts[:1], "redrafter", 8)  # measures the formulations (first products)
        measured = dict(products._TRANSPOSED)
        rates: dict[str, list[float]] = {}
        configurations = [("F.linear", {key: False for key in measured}), ("measured", measured)]
        for round_ in range(args.rounds):
            for label, choice in configurations[:: 1 if round_ % 2 == 0 else -1]:  # alternate the order
                products._TRANSPOSED.clear()
                products._TRANSPOSED.update(choice)
                for drafter in ("none", "redrafter"):
                    rates.setdefault(f"{drafter} {label}", []).append(
                        decode_rate(target, prompts, drafter, args.max_new_tokens))
        products._TRANSPOSED.clear()
        products._TRANSPOSED.update(measured)
        head = target.lm_head
        entry = {"choices": products.head_product_choices(),
                 "tokens_per_second": {k: round(float(np.median(v)), 2) for k, v in rates.items()},
                 "lm_head_ms": {f"{rows} rows {'transposed' if t else 'F.linear'}": round(product_ms(head, rows, t), 2)
                                for rows in (1, 8) for t in (False, True)}}
        report["dtypes"][dtype] = entry
        print(dtype, json.dumps(entry, indent=1), flush=True)
        del target
    if args.out:
        with open(args.out, "w") as f:
            json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
