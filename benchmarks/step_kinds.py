"""Auto with and without the drafter's step kinds, side by side in one process.

    python benchmarks/step_kinds.py --repeats 2
    python benchmarks/step_kinds.py --prompts humaneval --max-new-tokens 64

Four methods decode each prompt in turn (the order alternates from prompt to prompt): plain
decoding, the default drafter drafting every step, ``speculation="auto"`` as it ships (each step
decided on the acceptance of its kind, ``specdec.protocols.StepKinds``), and auto with every step
of one kind (the drafter's ``step_kind`` ignored; the prompt-lookup chain still leads where it
matched). Each auto policy is carried from prompt to prompt within a repeat, as ``specdec bench``
carries one, and made afresh for each repeat. Every output is checked against plain decoding.
Prints each prompt's speedups over plain decoding, then per repeat their median and geometric
mean, and the steps each auto drafted.
"""

from __future__ import annotations

import argparse

import numpy as np

import specdec
from specdec.bench import load_prompt_set
from specdec.decode.budget import Speculation

METHODS = ("plain", "always", "auto", "one kind")


class OneKind(Speculation):
    """Auto with every step of kind 0, whatever the drafter says."""

    def step_budgets(self, request_ids, chunk_tokens=0, kinds=None):
        return super().step_budgets(request_ids, chunk_tokens)


def rate(stats) -> float:
    """Tokens per second of decode steps (the first token comes from the prompt's forward)."""
    return (stats.new_tokens - 1) / (stats.time_draft + stats.time_verify + stats.time_other)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--backend", default="torch")
    parser.add_argument("--prompts", default="mt-bench")
    parser.add_argument("--per-category", type=int, default=1)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=1)
    args = parser.parse_args()
    target = specdec.load(args.model, backend=args.backend)
    prompts = load_prompt_set(args.prompts, per_category=args.per_category)
    specdec.generate(target, prompts[0].prompt, max_new_tokens=16, speculation="auto")  # warm up
    for repeat in range(args.repeats):
        policies = {"auto": Speculation("auto"), "one kind": OneKind("auto")}
        options = {"plain": {"drafter": "none"}, "always": {"speculation": "always"}}
        options |= {name: {"speculation": policy} for name, policy in policies.items()}
        speedups = {name: [] for name in METHODS[1:]}
        for n, prompt in enumerate(prompts):
            order = METHODS if (n + repeat) % 2 == 0 else METHODS[:1] + METHODS[:0:-1]
            results = {
                name: specdec.generate(
                    target, prompt.prompt, max_new_tokens=args.max_new_tokens, **options[name]
                )
                for name in order
            }
            plain = results["plain"]
            for name, result in results.items():
                if result.tokens != plain.tokens:
                    raise SystemExit(f"{name} differs from plain decoding on {prompt.category}")
            for name in METHODS[1:]:
                speedups[name].append(rate(results[name].stats) / rate(plain.stats))
            steps = {
                name: f"{results[name].stats.drafting_row_steps}/{results[name].stats.steps}"
                for name in policies
            }
            shown = {name: round(values[-1], 2) for name, values in speedups.items()}
            print(repeat, prompt.category, shown, "drafting steps", steps, flush=True)
        for name, values in speedups.items():
            ratios = np.array(values)
            print(
                f"{repeat} {name}: median {np.median(ratios):.3f}x, "
                f"geometric mean {np.exp(np.log(ratios).mean()):.3f}x",
                flush=True,
            )


if __name__ == "__main__":
    main()
