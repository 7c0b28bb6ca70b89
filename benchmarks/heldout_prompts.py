"""Write held-out prompts of the training corpus (never a benchmark's) as a JSONL prompt set.

    python benchmarks/heldout_prompts.py --kind code --count 8 --out /tmp/code_heldout.jsonl
    specdec plan --model M --prompts /tmp/code_heldout.jsonl --per-category 8

``specdec plan`` chooses beams on the prompts it is given (MT-Bench by default); this gives it
prompts like a model's use without planning on the benchmark that is then measured. The prompts
are the first ``count`` of the corpus's held-out split (``specdec.training.corpus``, seed 0) whose
template is of ``--kind`` (code: tasks on standard-library functions; prose: the Python docs;
verse: Shakespeare; all: any), one category, so ``--per-category`` keeps them all.
"""

from __future__ import annotations

import argparse
import json

KINDS = {"code": "stdlib:", "prose": "docs:", "verse": "shakespeare:", "all": ""}


def main() -> None:
    from specdec.models.cache import cache_entry
    from specdec.training.corpus import build_prompts, default_corpus

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kind", choices=sorted(KINDS), default="code")
    parser.add_argument("--count", type=int, default=8)
    parser.add_argument("--scan", type=int, default=400, help="held-out prompts to look through")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    corpus = default_corpus(cache_entry("corpus"))
    chosen = [
        p
        for p in build_prompts(corpus, args.scan, split="heldout", seed=0)
        if p.template.startswith(KINDS[args.kind])
    ][: args.count]
    with open(args.out, "w") as f:
        for p in chosen:
            f.write(json.dumps({"messages": list(p.messages), "category": args.kind}) + "\n")
    print(f"wrote {len(chosen)} held-out {args.kind} prompts to {args.out}")


if __name__ == "__main__":
    main()
