"""What two kernel choices of the torch backend buy end to end: grouped-query attention in the
form measured fastest (``specdec_torch.layers.attend``: grouped, folded or two matrix products), and
the greedy argmax of half-precision logits compared in float32
(``specdec_torch.sampling.first_argmax``).

For each dtype: plain decoding and the default path (ReDrafter with its lookup beam) with both
choices as before (attention always grouped, the argmax on the logits' own dtype) against both
as now, interleaved per round with the order alternating; decode-phase tokens/s (prefill
excluded), medians over rounds. Also times the attention forms and the argmax alone. Writes JSON.

    python benchmarks/decode_kernels.py --model smollm2-135m --rounds 4 \\
        --out benchmarks/results/decode_kernels.json
"""

from __future__ import annotations


import numpy as np
import torch

import specdec
from decode_timing import add_entry, decode_rate, median_seconds, parse_ab_arguments
from specdec_torch import layers, sampling, verify


def micro_us(run, repeats: int = 200) -> float:
    return round(median_seconds(run, repeats) * 1e6, 1)


def kernel_times(config, dtype: torch.dtype, span: int = 400) -> dict[str, float]:
    heads, kv_heads, dim = config.num_attention_heads, config.num_key_value_heads, config.head_dim
    out = {}
    for n in (1, 8):
        q = torch.randn(1, heads, n, dim, dtype=dtype)
        k, v = (
            torch.randn(1, kv_heads, span, dim, dtype=dtype),
            torch.randn(1, kv_heads, span, dim, dtype=dtype),
        )
        mask = torch.ones(1, 1, n, span, dtype=torch.bool)
        for name, form in layers._FORMS.items():
            out[f"attention {n} x {span} keys, {name}"] = micro_us(
                lambda: form(q, k, v, mask, dim**-0.5)
            )
        logits = torch.randn(n, config.vocab_size).to(dtype)
        out[f"argmax {n} x {config.vocab_size}, own dtype"] = micro_us(
            lambda: torch.argmax(logits, dim=-1)
        )
        out[f"argmax {n} x {config.vocab_size}, float32"] = micro_us(
            lambda: torch.argmax(logits.float(), dim=-1)
        )
    return out


def main() -> None:
    args, prompts, report = parse_ab_arguments(
        __doc__, dtypes=["bfloat16", "float32"], prompts=8, rounds=4
    )
    direct_argmax = lambda x: torch.argmax(x, dim=-1)  # noqa: E731  the greedy argmax before
    for dtype in args.dtypes:
        target = specdec.load(args.model, backend="torch", dtype=dtype)
        layers._CHOSEN.clear()
        for drafter in (
            "none",
            "redrafter",
        ):  # one-off costs: the measured choices (one query, a tree), first kernels
            decode_rate(target, prompts[:1], drafter, 8)
        measured = dict(layers._CHOSEN)
        before = ("before", {key: "grouped" for key in measured}, direct_argmax)
        now = ("now", measured, sampling.first_argmax)
        rates: dict[str, list[float]] = {}
        for round_ in range(args.rounds):
            for label, chosen, greedy in (before, now)[:: 1 if round_ % 2 == 0 else -1]:
                layers._CHOSEN.clear()
                layers._CHOSEN.update(chosen)
                verify.greedy_tokens = greedy
                for drafter in ("none", "redrafter"):
                    rates.setdefault(f"{drafter} {label}", []).append(
                        decode_rate(target, prompts, drafter, args.max_new_tokens)
                    )
        layers._CHOSEN.clear()
        layers._CHOSEN.update(measured)
        verify.greedy_tokens = sampling.first_argmax
        entry = {
            "attention": layers.attention_choices(),
            "tokens_per_second": {k: round(float(np.median(v)), 2) for k, v in rates.items()},
            "kernels_us": kernel_times(target.config, target.lm_head.dtype),
        }
        add_entry(report, dtype, entry, args.out)
        del target


if __name__ == "__main__":
    main()
