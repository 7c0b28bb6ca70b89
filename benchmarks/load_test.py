"""Load test of ``specdec serve`` on loopback: throughput and latency as concurrency grows.

For each server (a drafter, ``name`` or ``name@mode`` for ``--speculation mode``: the default
``redrafter``, which chooses per step how much to draft, and ``none``, plain decoding) it starts
``specdec serve`` as a subprocess, all of them at once (an idle one waits without computing), and
then runs, for each round and number of concurrent clients, every server in turn (the order
alternating, so that neither side always runs first):

- ``inflight``: a server with 16 slots; each client sends its next request as soon as its last
  one ends (closed loop), so requests join and leave the running batch at any step;
- ``static``: the same server, but requests go in waves of ``concurrency`` and a wave starts
  only when the whole previous one has ended (static batching, emulated by the clients);
- ``serial``: a server with 1 slot: requests are decoded one at a time, the rest wait in its queue.

Every run sends the same ``--requests`` requests. Each is a streamed chat completion of an MT-Bench
first turn, greedy, of a length drawn between the two ``--max-tokens`` bounds
(request i always gets the same one) and decoded to that length (``ignore_eos``), so every mode
decodes the same tokens, and a static wave lasts as long as its longest request. Per run:
tokens/s (completion tokens over the run's wall time), time to first token (p50/p99, queueing
included) and inter-token latency (p50/p99 of each request's mean time per token after its
first, ``(t_last - t_first) / (tokens - 1)``), plus the server's mean tokens per step and the
budgets it chose (drafted nodes per request per step, the share of steps with no drafting). The
table gives medians over ``--rounds`` and the median of each round's ratio to the first server.

    python benchmarks/load_test.py --model smollm2-135m --backend torch \\
        --out benchmarks/results/load_test.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import signal
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def load_average() -> str:
    """The 1, 5 and 15 minute load averages (as ``uptime`` shows them)."""
    path = Path("/proc/loadavg")
    return " ".join(path.read_text().split()[:3]) if path.exists() else "?"


class ServerProcess:
    """``specdec serve`` in a subprocess; ``base`` is its /v1 URL."""

    def __init__(self, args, *, drafter: str, slots: int):
        self.port = free_port()
        drafter, _, speculation = drafter.partition("@")
        command = [
            sys.executable,
            "-m",
            "specdec.cli.main",
            "serve",
            "--model",
            args.model,
            "--backend",
            args.backend,
            "--drafter",
            drafter,
            "--slots",
            str(slots),
            "--capacity",
            str(args.capacity),
            "--max-queue",
            "1024",
            "--port",
            str(self.port),
            "--log-level",
            "warning",
            "--served-model-name",
            "bench",
        ] + (["--speculation", speculation] if speculation else [])
        if args.dtype:
            command += ["--dtype", args.dtype]
        self.process = subprocess.Popen(command, cwd=ROOT, stderr=subprocess.PIPE, text=True)
        self.base = f"http://127.0.0.1:{self.port}/v1"
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"the server exited: {self.process.stderr.read()}")
            try:
                if httpx.get(f"http://127.0.0.1:{self.port}/health", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            time.sleep(0.5)
        else:
            raise RuntimeError("the server did not come up")
        self.health = httpx.get(f"http://127.0.0.1:{self.port}/health").json()

    def metrics(self) -> dict[str, float]:
        out = {}
        for line in httpx.get(f"http://127.0.0.1:{self.port}/metrics").text.splitlines():
            if line and not line.startswith("#"):
                name, value = line.rsplit(" ", 1)
                out[name.split("{")[0] if "_bucket" not in name else name] = float(value)
        return out

    def stop(self) -> None:
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(60)
        except subprocess.TimeoutExpired:
            self.process.kill()


async def one_request(client: httpx.AsyncClient, base: str, messages, max_tokens: int) -> dict:
    body = {
        "model": "bench",
        "messages": messages,
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": True,
        "ignore_eos": True,
        "stream_options": {"include_usage": True},
    }
    start = time.perf_counter()
    first = last = None
    usage = None
    async with client.stream("POST", base + "/chat/completions", json=body) as response:
        if response.status_code != 200:
            raise RuntimeError(f"HTTP {response.status_code}: {await response.aread()}")
        async for line in response.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            event = json.loads(line[6:])
            if "error" in event:
                raise RuntimeError(event["error"])
            if event.get("usage"):
                usage = event["usage"]
            if event.get("choices") and event["choices"][0]["delta"].get("content"):
                now = time.perf_counter()
                first = first or now
                last = now
    tokens = usage["completion_tokens"]
    return {
        "ttft": first - start,
        "itl": (last - first) / (tokens - 1) if tokens > 1 else None,
        "tokens": tokens,
        "total": time.perf_counter() - start,
    }


def length_of(index: int, bounds: tuple[int, int]) -> int:
    """The number of tokens request ``index`` asks for: the same in every mode and run."""
    return random.Random(index).randint(*bounds)


async def run_mode(
    base: str, mode: str, concurrency: int, prompts: list, requests: int, bounds: tuple[int, int]
) -> dict:
    queue = list(range(requests))
    results = []
    limits = httpx.Limits(max_connections=concurrency + 4)
    async with httpx.AsyncClient(timeout=httpx.Timeout(600), limits=limits) as client:
        start = time.perf_counter()
        if mode == "static":
            for wave in range(0, requests, concurrency):
                batch = queue[wave : wave + concurrency]
                results += await asyncio.gather(
                    *(
                        one_request(client, base, prompts[i % len(prompts)], length_of(i, bounds))
                        for i in batch
                    )
                )
        else:

            async def worker():
                while queue:
                    i = queue.pop(0)
                    results.append(
                        await one_request(
                            client, base, prompts[i % len(prompts)], length_of(i, bounds)
                        )
                    )

            await asyncio.gather(*(worker() for _ in range(concurrency)))
        wall = time.perf_counter() - start
    ttft = sorted(r["ttft"] for r in results)
    itl = sorted(r["itl"] for r in results if r["itl"] is not None)
    tokens = sum(r["tokens"] for r in results)
    return {
        "mode": mode,
        "concurrency": concurrency,
        "requests": len(results),
        "tokens": tokens,
        "wall_s": wall,
        "tokens_per_s": tokens / wall,
        "ttft_p50": percentile(ttft, 50),
        "ttft_p99": percentile(ttft, 99),
        "itl_p50": percentile(itl, 50),
        "itl_p99": percentile(itl, 99),
    }


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    if len(values) == 1:
        return values[0]
    return (
        statistics.quantiles(values, n=100, method="inclusive")[int(q) - 1]
        if q < 100
        else values[-1]
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--backend", default="torch")
    parser.add_argument(
        "--dtype", default=None, help="default: the dtype measured fastest (specdec tune)"
    )
    parser.add_argument(
        "--drafters",
        nargs="+",
        default=["none", "redrafter"],
        help="servers: a drafter name, or name@auto|always|never for its --speculation; the first "
        "is the baseline of the ratios",
    )
    parser.add_argument("--concurrency", nargs="+", type=int, default=[1, 4, 16])
    parser.add_argument("--modes", nargs="+", default=["inflight", "static", "serial"])
    parser.add_argument(
        "--rounds", type=int, default=1, help="rounds of every setting, servers interleaved"
    )
    parser.add_argument(
        "--requests",
        type=int,
        default=32,
        help="requests per run: the same ones (prompts, lengths) at every concurrency and mode",
    )
    parser.add_argument(
        "--max-tokens",
        type=int,
        nargs=2,
        default=[8, 64],
        metavar=("LOW", "HIGH"),
        help="bounds of the requests' lengths",
    )
    parser.add_argument("--capacity", type=int, default=1024)
    parser.add_argument(
        "--slots", type=int, default=16, help="slots of the in-flight and static server"
    )
    parser.add_argument("--out", default=None, help="JSON file for every run")
    args = parser.parse_args()

    sys.path.insert(0, str(ROOT))
    from specdec.bench.prompts import load_prompt_set

    prompts = [p.prompt for p in load_prompt_set("mt-bench", per_category=2)]
    runs, info = (
        [],
        {
            "command": " ".join(sys.argv),
            "load_before": load_average(),
            "threads": os.environ.get("OMP_NUM_THREADS"),
        },
    )
    slots_of = {m: 1 if m == "serial" else args.slots for m in args.modes}
    servers = {}
    try:
        for drafter in args.drafters:
            for slots in sorted(set(slots_of.values())):
                server = servers[(drafter, slots)] = ServerProcess(
                    args, drafter=drafter, slots=slots
                )
                info.setdefault("dtype", server.health.get("dtype"))
                asyncio.run(run_mode(server.base, "inflight", 1, prompts, 1, (8, 8)))  # warm-up
        for round_ in range(args.rounds):
            for turn, (concurrency, mode) in enumerate(
                (c, m) for c in args.concurrency for m in args.modes
            ):
                order = args.drafters if (round_ + turn) % 2 == 0 else args.drafters[::-1]
                for drafter in order:
                    run = one_run(
                        servers[(drafter, slots_of[mode])], args, prompts, mode, concurrency
                    )
                    run.update(drafter=drafter, slots=slots_of[mode], round=round_)
                    runs.append(run)
                    print(
                        f"{drafter:>16} {mode:>8} c={concurrency:<2} {run['tokens_per_s']:7.1f} "
                        f"tok/s  TTFT p50 {run['ttft_p50'] * 1e3:7.0f} ms p99 "
                        f"{run['ttft_p99'] * 1e3:7.0f} ms  ITL p50 {run['itl_p50'] * 1e3:6.1f} ms "
                        f"p99 {run['itl_p99'] * 1e3:6.1f} ms  tokens/step "
                        f"{run['tokens_per_step'] or 0:.2f}  drafted nodes/step "
                        f"{run['draft_nodes_per_row_step'] or 0:.2f}  no-draft steps "
                        f"{run['plain_step_share'] or 0:.0%}  load {run['load']}",
                        flush=True,
                    )
    finally:
        for server in servers.values():
            server.stop()
    info["load_after"] = load_average()
    print(markdown(runs, args.drafters))
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps({"info": info, "runs": runs}, indent=1))
    return 0


def one_run(server: ServerProcess, args, prompts, mode: str, concurrency: int) -> dict:
    """One run on ``server`` with what its /metrics counted during it."""
    before = server.metrics()
    run = asyncio.run(
        run_mode(server.base, mode, concurrency, prompts, args.requests, tuple(args.max_tokens))
    )
    after = server.metrics()
    delta = {
        name: after.get(name, 0.0) - before.get(name, 0.0)
        for name in (
            "specdec_decode_row_steps_total",
            "specdec_decode_tokens_total",
            "specdec_draft_nodes_total",
            "specdec_decode_steps_total",
            "specdec_plain_steps_total",
        )
    }
    rows, steps = delta["specdec_decode_row_steps_total"], delta["specdec_decode_steps_total"]
    run.update(
        tokens_per_step=delta["specdec_decode_tokens_total"] / rows if rows else None,
        draft_nodes_per_row_step=delta["specdec_draft_nodes_total"] / rows if rows else None,
        plain_step_share=delta["specdec_plain_steps_total"] / steps if steps else None,
        load=load_average(),
    )
    return run


def markdown(runs: list[dict], drafters: list[str]) -> str:
    """Per setting and server: medians over rounds, and the median ratio to the first server."""
    baseline = drafters[0]
    lines = [
        "| clients | mode | server | tok/s | / "
        + baseline
        + " | TTFT p50 / p99 ms | ITL p50 / p99 ms "
        "| tokens/step | drafted nodes/step | no-draft steps |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    settings = dict.fromkeys((r["concurrency"], r["mode"]) for r in runs)
    median = statistics.median
    for concurrency, mode in sorted(settings):
        cell = [r for r in runs if (r["concurrency"], r["mode"]) == (concurrency, mode)]
        base = {r["round"]: r["tokens_per_s"] for r in cell if r["drafter"] == baseline}
        for drafter in drafters:
            mine = [r for r in cell if r["drafter"] == drafter]
            ratios = [r["tokens_per_s"] / base[r["round"]] for r in mine if r["round"] in base]
            pick = lambda key: median([r[key] or 0.0 for r in mine])  # noqa: E731
            lines.append(
                f"| {concurrency} | {mode} | {drafter} | {pick('tokens_per_s'):.1f} | "
                f"{median(ratios) if ratios else float('nan'):.2f} | {pick('ttft_p50') * 1e3:.0f} "
                f"/ {pick('ttft_p99') * 1e3:.0f} | {pick('itl_p50') * 1e3:.1f} / "
                f"{pick('itl_p99') * 1e3:.1f} | {pick('tokens_per_step'):.2f} | "
                f"{pick('draft_nodes_per_row_step'):.2f} | {pick('plain_step_share'):.0%} |"
            )
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
