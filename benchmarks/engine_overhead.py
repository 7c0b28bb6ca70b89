"""One request through ``specdec.Engine`` against ``specdec.generate``: what the serving path costs.

Both decode the same prompts on one target (16 slots, the capacity a server gives them), greedy,
timed from the prompt's submission (``stream``'s first step; the engine's ``submit``) to its last
token, to a fixed length (EOS ignored), plain (``--drafter none``) and speculative (the default
ReDrafter), in rounds that interleave the four runs (the order alternating per round); the
engine is started afresh each round (the target is leased by one at a time). Prints the median
tokens/s of each and the median per-round ratio engine / generate. ``--profile engine|generate``
instead runs the engine (or generate) with cProfile on the compute thread, where every step's
work runs (``specdec.compute``), and prints where the time goes. ``--server`` adds a third way:
the same request streamed from a ``specdec serve`` subprocess per drafter (timed from sending it
to its last token), for the same ratio.

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
        print(
            f"warning: a run of prompt {key[:40]}... gave other tokens than its first run",
            file=sys.stderr,
        )


def run_generate(target, prompt, drafter: str, tokens: int, speculation) -> float:
    import specdec

    steps = specdec.stream(
        target,
        prompt,
        drafter=drafter,
        max_new_tokens=tokens,
        stop_at_eos=False,
        speculation=speculation,
    )  # names resolved and the drafter loaded here, untimed
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
        engine.generate(
            prompt, max_new_tokens=4, ignore_eos=True
        )  # warm-up: the drafter's first call
        start = time.perf_counter()
        completion = engine.generate(prompt, max_new_tokens=tokens, ignore_eos=True)
        seconds = time.perf_counter() - start
    assert len(completion.tokens) == tokens
    if tokens > 8:
        same_tokens(prompt, completion.tokens)
    return tokens / seconds


def run_server(server, prompt, tokens: int) -> float:
    """One streamed request to a ``specdec serve`` subprocess, timed from sending it to its last
    token (HTTP, tokenization and detokenization included)."""
    import asyncio

    import httpx
    from load_test import one_request

    async def once():
        async with httpx.AsyncClient(timeout=600) as client:
            return await one_request(client, server.base, prompt, tokens)

    result = asyncio.run(once())
    assert result["tokens"] == tokens
    return tokens / (result["ttft"] + result["itl"] * (tokens - 1))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument(
        "--prompts", type=int, default=2, help="MT-Bench first turns, one per category"
    )
    parser.add_argument("--drafters", nargs="+", default=["none", "redrafter"])
    parser.add_argument("--speculation", default=None, help="auto | always | never (default: auto)")
    parser.add_argument("--profile", choices=("engine", "generate"), default=None)
    parser.add_argument(
        "--sort", default="cumulative", help="the profile's order (pstats: cumulative, tottime)"
    )
    parser.add_argument(
        "--server",
        action="store_true",
        help="also time each prompt through a `specdec serve` subprocess per drafter (16 slots)",
    )
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT))
    sys.path.insert(0, str(ROOT / "benchmarks"))
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
        from specdec import compute

        # the work runs on the compute thread (specdec.compute), and a profile sees one thread:
        # it is switched on there, around each run of the way profiled
        profile = cProfile.Profile()
        run = run_engine if args.profile == "engine" else run_generate
        for drafter in args.drafters:
            for prompt in prompts:
                compute.run(profile.enable)
                try:
                    run(target, prompt, drafter, args.tokens, args.speculation)
                finally:
                    compute.run(profile.disable)
        out = io.StringIO()
        pstats.Stats(profile, stream=out).sort_stats(args.sort).print_stats(40)
        print(out.getvalue())
        return 0
    ways = ("generate", "engine", "server") if args.server else ("generate", "engine")
    servers = {}
    if args.server:
        from load_test import ServerProcess

        settings = argparse.Namespace(model=args.model, backend="torch", capacity=2048, dtype=None)
        for drafter in args.drafters:  # idle while the others run: nothing computes there
            speculation = f"@{args.speculation}" if args.speculation else ""
            servers[drafter] = ServerProcess(settings, drafter=drafter + speculation, slots=16)
            run_server(servers[drafter], prompts[0], 8)  # warm-up
    results: dict = {}
    try:
        for round_ in range(args.rounds):
            order = [(d, w) for d in args.drafters for w in ways]
            for drafter, way in order if round_ % 2 == 0 else order[::-1]:
                for p, prompt in enumerate(prompts):
                    if way == "server":
                        value = run_server(servers[drafter], prompt, args.tokens)
                    else:
                        run = run_generate if way == "generate" else run_engine
                        value = run(target, prompt, drafter, args.tokens, args.speculation)
                    results.setdefault((drafter, way, p), []).append(value)
    finally:
        for server in servers.values():
            server.stop()
    print(
        "| drafter | prompt | "
        + " | ".join(f"{w} tok/s" for w in ways)
        + " | "
        + " | ".join(f"{w} / generate" for w in ways[1:])
        + " |"
    )
    print("|---" * (2 + 2 * len(ways) - 1) + "|")
    for drafter in args.drafters:
        for p in range(len(prompts)):
            g = results[(drafter, "generate", p)]
            speeds = [statistics.median(results[(drafter, w, p)]) for w in ways]
            ratios = [
                statistics.median(x / y for x, y in zip(results[(drafter, w, p)], g))
                for w in ways[1:]
            ]
            print(
                f"| {drafter} | {p} | "
                + " | ".join(f"{v:.1f}" for v in speeds)
                + " | "
                + " | ".join(f"{r:.2f}" for r in ratios)
                + " |"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
