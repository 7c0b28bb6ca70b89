"""Teacher decoding speed: new tokens per second of ``specdec.training.teacher.greedy_teacher``
on training prompts of the default mix's corpus kind, for one checkout of specdec.

Run it from two checkouts side by side (a worktree of the commit before a change), alternating,
to compare them on the same prompts; prints one JSON line per run:

    git worktree add /tmp/before <commit>
    for round in 1 2 3; do for dir in /tmp/before .; do
      (cd /tmp && PYTHONPATH=$dir:$dir/backends:$dir/drafters OMP_NUM_THREADS=2 \\
         /work/main/.venv/bin/python /work/main/benchmarks/teacher_rate.py --label $dir); done; done

Options: --prompts 128 (decoded, the first of the training split from index 5,000, far from the
shipped drafters' data), --max-new-tokens 128, --batch-size 64, --dtype bfloat16.
"""

from __future__ import annotations

import argparse
import json
import time

import specdec
from specdec.models.cache import cache_entry
from specdec.training.corpus import build_prompts, default_corpus
from specdec.training.teacher import greedy_teacher, load_teacher_target


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--prompts", type=int, default=128)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--label", default="")
    args = parser.parse_args()
    target = load_teacher_target(args.model, dtype=args.dtype)
    corpus = default_corpus(cache_entry("corpus"))
    prompts = [
        target.encode(list(p.messages))
        for p in build_prompts(corpus, args.prompts, split="train", seed=0, start=5000)
    ]
    prompts = [p for p in prompts if len(p) <= 320]
    began = time.perf_counter()
    data = greedy_teacher(
        target.model,
        prompts,
        max_new_tokens=args.max_new_tokens,
        top_k=32,
        eos_token_ids=target.eos_token_ids,
        batch_size=args.batch_size,
    )
    seconds = time.perf_counter() - began
    print(
        json.dumps(
            {
                "label": args.label,
                "specdec": specdec.__file__,
                "prompts": len(prompts),
                "prompt_tokens": sum(map(len, prompts)),
                "new_tokens": data.num_positions,
                "seconds": round(seconds, 2),
                "new_tokens_per_second": round(data.num_positions / seconds, 1),
            }
        )
    )


if __name__ == "__main__":
    main()
