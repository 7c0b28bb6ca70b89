"""One burst on a fresh engine, traced step by step: what the speculation policy predicted each
decode step would cost against what it cost. The policy is a ``Speculation`` subclass passed as
``speculation=`` (the documented extension point), so nothing inside the engine is patched.

Per step, one JSON line: decode ``rows``, prompt tokens beside them (``chunk``), requests
``drafting``, the forward's planned ``tokens``, the predicted seconds of the chosen step and of
the plain step (``predicted``, ``predicted_plain``), then the target part's ``seconds``, the
drafting ``draft_seconds`` and the tokens it ``committed``. Then the burst's tokens/s and what
the realized-rate check saw.

    python benchmarks/burst_trace.py --model qwen2.5-coder-1.5b --burst 16 --max-new-tokens 24
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--drafter", default="redrafter")
    parser.add_argument("--burst", type=int, default=16)
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--slots", type=int, default=16)
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT))
    from specdec.bench.prompts import load_prompt_set
    from specdec.decode.budget import Speculation
    from specdec.serving.engine import Engine

    steps: list[dict] = []

    class Traced(Speculation):
        def choose(self, ids, chunk_tokens):
            plan = super().choose(ids, chunk_tokens)
            rows = len(ids)
            plain = float(self.costs.target(chunk_tokens + rows, rows + (chunk_tokens > 0)))
            steps.append(
                {
                    "rows": rows,
                    "chunk": chunk_tokens,
                    "drafting": plan.drafting,
                    "tokens": plan.tokens,
                    "predicted": round(plan.seconds, 4),
                    "predicted_plain": round(plain, 4),
                }
            )
            return plan

        def observe_step(self, tokens, seconds, drafting, draft_seconds, rows=1, plain_tokens=None):
            if steps and "seconds" not in steps[-1]:
                steps[-1].update(
                    seconds=round(seconds, 4),
                    draft_seconds=round(draft_seconds, 4),
                    committed=self._step_tokens,
                )
            super().observe_step(tokens, seconds, drafting, draft_seconds, rows, plain_tokens)

    prompts = [p.messages[-1]["content"] for p in load_prompt_set("mt-bench", per_category=4)]
    policy = Traced("auto")
    with Engine(args.model, drafter=args.drafter, speculation=policy, slots=args.slots) as engine:
        engine.submit("Hello", max_new_tokens=8).result()
        steps.clear()  # the warm-up request's steps taught the policy; the burst's are traced
        start = time.perf_counter()
        handles = [
            engine.submit(
                [{"role": "user", "content": prompts[i % len(prompts)]}],
                max_new_tokens=args.max_new_tokens,
                ignore_eos=True,
            )
            for i in range(args.burst)
        ]
        results = [handle.result() for handle in handles]
        seconds = time.perf_counter() - start
    for step in steps:
        print(json.dumps(step))
    print(f"burst of {args.burst}: {sum(len(r.tokens) for r in results) / seconds:.1f} tokens/s")
    print(f"realized tokens/s by rows: {policy.realized.describe()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
