"""What the measured LM-head product formulation (``specdec_torch.products``) buys end to end.

For each dtype: plain decoding and the default path (ReDrafter with its lookup beam) with every
vocabulary-sized product forced to ``F.linear`` (the formulation before), against the
formulation measured fastest on this machine, interleaved per round (the order alternating);
decode-phase tokens/s (prefill excluded), medians over rounds. Also times the products themselves.
Writes JSON.

    python benchmarks/head_products.py --model smollm2-135m --rounds 3 \\
        --out benchmarks/results/head_products.json
"""

from __future__ import annotations


import numpy as np
import torch

import specdec
from decode_timing import add_entry, decode_rate, median_seconds, parse_ab_arguments
from specdec_torch import products


def product_ms(weight: torch.Tensor, rows: int, transposed: bool, repeats: int = 15) -> float:
    x = torch.randn(rows, weight.shape[1], dtype=weight.dtype)
    run = (
        (lambda: products.transposed_product(x, weight))
        if transposed
        else (lambda: torch.nn.functional.linear(x, weight))
    )
    return median_seconds(run, repeats) * 1e3


def main() -> None:
    args, prompts, report = parse_ab_arguments(
        __doc__, dtypes=["float32", "bfloat16"], prompts=4, rounds=3
    )
    for dtype in args.dtypes:
        target = specdec.load(args.model, backend="torch", dtype=dtype)
        products._TRANSPOSED.clear()
        decode_rate(
            target, prompts[:1], "redrafter", 8
        )  # measures the formulations (first products)
        measured = dict(products._TRANSPOSED)
        rates: dict[str, list[float]] = {}
        configurations = [("F.linear", {key: False for key in measured}), ("measured", measured)]
        for round_ in range(args.rounds):
            for label, choice in configurations[
                :: 1 if round_ % 2 == 0 else -1
            ]:  # alternate the order
                products._TRANSPOSED.clear()
                products._TRANSPOSED.update(choice)
                for drafter in ("none", "redrafter"):
                    rates.setdefault(f"{drafter} {label}", []).append(
                        decode_rate(target, prompts, drafter, args.max_new_tokens)
                    )
        products._TRANSPOSED.clear()
        products._TRANSPOSED.update(measured)
        head = target.lm_head
        entry = {
            "choices": products.head_product_choices(),
            "tokens_per_second": {k: round(float(np.median(v)), 2) for k, v in rates.items()},
            "lm_head_ms": {
                f"{rows} rows {'transposed' if t else 'F.linear'}": round(
                    product_ms(head, rows, t), 2
                )
                for rows in (1, 8)
                for t in (False, True)
            },
        }
        add_entry(report, dtype, entry, args.out)
        del target


if __name__ == "__main__":
    main()
