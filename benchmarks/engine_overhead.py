"""One request through ``specdec.Engine`` against ``specdec.generate``: what the serving path costs.

Both decode the same prompts on one target (16 slots, the capacity a server gives them), greedy,
timed from the prompt's submission (``stream``'s first step; the engine's ``submit``) to its last token,
to a fixed length (EOS ignored), plain (``--drafter none``) and speculative (the default
ReDrafter), in rounds that interleave the four runs (the order alternating per round); the
engine is started afresh each round (the target is leased by one at a time). Prints the median
tokens/s of each and the median per-round ratio engine / generate. ``--profile engine|generate``
instead runs the engine's scheduler thread (or generate) under cProfile and prints where the
time goes.

    OMP_NUM_THREADS=2 python benchmarks/engine_overhead.py --rounds 5
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


SEEN: dict = {}  # prompt -> the tokens of its first run: every run must give them (exact mode)


def same_tokens(prompt, tokens) -> None:
    key = repr(prompt)
    if SEEN.setdefault(key, tuple(tokens)) != tuple(tokens):
        print(f"warning: a run of prompt {key[:40]}... gave other tokens than its first run", file=sys.stderr)


def run_generate(target, prompt, drafter: str, tokens: int, speculation) -> float:
    import specdec

    steps = specdec.stream(target, prompt, drafter=drafter, max_new_tokens=tokens, stop_at_eos=False,
                           speculation=speculation)  # names resolved and the drafter loaded here, untimed
    start = time.perf_counter()
    emitted = [t for step in steps for t in step.new_tokens[0]]
    seconds = time.perf_counter() - start
    assert len(emitted) == tokens
    if tokens > 8:
        same_tokens(prompt, emitted)
    return tokens / seconds


def run_engine(target, prompt, drafter: str, tokens: int, speculation) -> float:
    from specdec.serving.engine import Engine

    with Engine(target, drafter=drafter, speculation=speculation) as engine:
        engine.generate(prompt, max_new_tokens=4, ignore_eos=True)  # warm-up: the drafter's first call
        start = time.perf_counter()
        completion = engine.generate(prompt, max_new_tokens=tokens, ignore_eos=True)
        seconds = time.perf_counter() - start
    assert len(completion.tokens) == tokens
    if tokens > 8:
        same_tokens(prompt, completion.tokens)
    return tokens / seconds


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--prompts", type=int, default=2, help="MT-Bench first turns, one per category")
    parser.add_argument("--drafters", nargs="+", default=["none", "redrafter"])
    parser.add_argument("--speculation", default=None, help="auto | always | never (default: auto)")
    parser.add_argument("--profile", choices=("engine", "generate"), default=None)
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT))
    import specdec
    from specdec.bench.prompts import load_prompt_set
    from specdec.slots import TREE_ROOM

    prompts = [p.prompt for p in load_prompt_set("mt-bench", per_category=1)]  # chats
    prompts = prompts[: args.prompts]
    target = specdec.load(args.model, slots=16, capacity=2048 + TREE_ROOM)
    for drafter in args.drafters:  # warm-up: drafter loading, the cost curve, kernels
        run_generate(target, prompts[0], drafter, 8, args.speculation)
        run_engine(target, prompts[0], drafter, 8, args.speculation)
    if args.profile:
        profile = cProfile.Profile()
        if args.profile == "engine":  # the scheduler thread, under the profile while it serves
            from specdec.serving.engine import Engine

            serve = Engine._serve

            def profiled(engine):
                profile.enable()
                try:
                    return serve(engine)
                finally:
                    profile.disable()

            Engine._serve = profiled
        for drafter in args.drafters:
            for prompt in prompts:
                if args.profile == "engine":
                    run_engine(target, prompt, drafter, args.tokens, args.speculation)
                else:
                    profile.enable()
                    run_generate(target, prompt, drafter, args.tokens, args.speculation)
                    profile.disable()
        out = io.StringIO()
        pstats.Stats(profile, stream=out).sort_stats("cumulative").print_stats(40)
        print(out.getvalue())
        return 0
    results: dict = {}
    for round_ in range(args.rounds):
        order = [(d, w) for d in args.drafters for w in ("generate", "engine")]
        for drafter, way in order if round_ % 2 == 0 else order[::-1]:
            for p, prompt in enumerate(prompts):
                run = run_generate if way == "generate" else run_engine
                results.setdefault((drafter, way, p), []).append(run(target, prompt, drafter, args.tokens,
                                                                     args.speculation))
    print("| drafter | prompt | generate tok/s | engine tok/s | engine / generate |")
    print("|---|---|---|---|---|")
    for drafter in args.drafters:
        for p in range(len(prompts)):
            g, e = results[(drafter, "generate", p)], results[(drafter, "engine", p)]
            ratio = statistics.median(x / y for x, y in zip(e, g))
            print(f"| {drafter} | {p} | {statistics.median(g):.1f} | {statistics.median(e):.1f} | {ratio:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
