"""Backend cost benchmark: plain decoding against the framework's own generation, the share of a
speculative step spent outside the target forward, and the cost of verifying k tokens.

    python benchmarks/backend_costs.py --backend torch --dtype bfloat16 --model smollm2-135m
    python benchmarks/backend_costs.py --backend mlx --dtype float32 --model smollm2-135m

Everything is measured side by side in one run: methods are interleaved per repeat and medians
are reported. Prints Markdown and writes JSON next to --out.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

import specdec
from specdec.bench import load_prompt_set, parse_method
from specdec.bench.peers import peer_runner
from specdec.bench.runner import specdec_runner
from specdec.generation.encoding import encode_prompts
from specdec.plugins.registry import default_registry
from specdec.tuning.dtype import measure_forward

PEER = {"torch": "hf", "mlx": "mlx-lm"}


def verify_costs(target, backend, sizes, repeats):
    """Median seconds of one forward over a k-node chain tree
    (``specdec.tuning.dtype.measure_forward``)."""
    return {
        k: ms / 1e3 for k, ms in measure_forward(backend, target, sizes, repeats=repeats).items()
    }


def step_split(target, backend, prompts, drafter, max_new_tokens, **options):
    """Share of decode-step time outside the target's forward_tree, over real speculative decoding.
    The forward is evaluated inside the timed region (lazy backends would otherwise defer it)."""
    forward = target.forward_tree
    spent = {"forward": 0.0}

    def timed(tree, slots, **kwargs):
        start = time.perf_counter()
        output = forward(tree, slots, **kwargs)
        backend.to_numpy(output.logits[:, :1, :1])
        spent["forward"] += time.perf_counter() - start
        return output

    target.forward_tree = timed
    total, draft, tokens, steps = 0.0, 0.0, 0, 0
    try:
        for prompt in prompts:
            for step in specdec.stream(
                target,
                prompt,
                drafter=drafter,
                backend=backend.name,
                max_new_tokens=max_new_tokens,
                **options,
            ):
                if not step.is_prefill:
                    total += step.time_draft + step.time_verify + step.time_other
                    draft += step.time_draft
                    steps += 1
                tokens += len(step.new_tokens[0])
    finally:
        del target.forward_tree
    return dict(
        outside_share=1 - spent["forward"] / total,
        draft_share=draft / total,
        tokens_per_step=tokens / (steps + len(prompts)),
        step_ms=1e3 * total / max(steps, 1),
    )


def main():
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--backend", default="torch")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--prompts", default="mt-bench")
    parser.add_argument("--per-category", type=int, default=1)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--drafter", default="redrafter", help="drafter for the step split")
    parser.add_argument("--sizes", nargs="+", type=int, default=[1, 4, 16, 32, 64])
    parser.add_argument("--out", default="benchmarks/results/backend_costs.json")
    args = parser.parse_args()

    backend = default_registry().get("backend", args.backend).factory()
    target = specdec.load(args.model, backend=args.backend, dtype=args.dtype)
    prompts = [
        encode_prompts(
            p.prompt,
            target.tokenizer,
            target.vocab_size,
            chat_template=getattr(target, "chat_template", None),
        )[0][0]
        for p in load_prompt_set(args.prompts, per_category=args.per_category)
    ]
    costs = verify_costs(target, backend, args.sizes, args.repeats)

    runners = {
        "specdec plain": specdec_runner(
            parse_method("plain"), args.model, target, args.backend, args.max_new_tokens
        ),
        f"{PEER[args.backend]} plain": peer_runner(
            parse_method(PEER[args.backend]), args.model, target, args.dtype, args.max_new_tokens
        ),
    }
    for run in runners.values():
        run(prompts[0], 0.0, 0)  # warm-up
    rates = {name: [] for name in runners}
    for repeat in range(args.repeats):
        for name, run in runners.items():
            tokens = seconds = 0
            for prompt in prompts:
                measured = run(prompt, 0.0, repeat)
                tokens, seconds = tokens + measured["new_tokens"], seconds + measured["seconds"]
            rates[name].append(tokens / seconds)
    ratio = float(
        np.median(np.array(rates["specdec plain"]) / np.array(rates[f"{PEER[args.backend]} plain"]))
    )
    split = step_split(target, backend, prompts, args.drafter, args.max_new_tokens)

    print(
        f"## {args.backend} {args.dtype}, {args.model}, {len(prompts)} prompts x "
        f"{args.max_new_tokens} tokens, {args.repeats} interleaved repeats\n"
    )
    print("| method | tokens/s (median) |\n|---|---|")
    for name, values in rates.items():
        print(f"| {name} | {np.median(values):.1f} |")
    print(
        f"\nspecdec plain / {PEER[args.backend]} plain: **{ratio:.2f}x** (median of per-repeat "
        "ratios)\n"
    )
    print("| verified tokens k | " + " | ".join(map(str, args.sizes)) + " |")
    print("|---|" + "---|" * len(args.sizes))
    print("| forward ms | " + " | ".join(f"{1e3 * costs[k]:.1f}" for k in args.sizes) + " |")
    print(
        "| cost / cost(1) | "
        + " | ".join(f"{costs[k] / costs[args.sizes[0]]:.2f}" for k in args.sizes)
        + " |"
    )
    print(
        f"\n{args.drafter} steps: {split['outside_share']:.1%} of step time outside the target "
        f"forward (drafter {split['draft_share']:.1%}), {split['tokens_per_step']:.2f} "
        f"tokens/step, {split['step_ms']:.1f} ms/step"
    )
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(
        json.dumps(
            dict(args=vars(args), rates=rates, ratio=ratio, verify_costs=costs, split=split),
            indent=1,
        )
    )


if __name__ == "__main__":
    main()
