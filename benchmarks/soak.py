"""Soak test of ``specdec serve``: many requests, random disconnects, nothing leaks or gets lost.

Starts the server as a subprocess (a small random model by default, or ``--model``) and sends
``--requests`` requests from ``--clients`` concurrent clients, each at random one of:

- a stream read to its end;
- a stream the client leaves after a random number of events (the server must cancel it);
- a plain request;
- a plain request the client gives up on after a few milliseconds (a disconnect while waiting);

with small random ``max_tokens``, greedy or seeded sampling over a few prompts. A 429 (full
queue) is retried after its Retry-After. At the end it checks:

- no slot leak: ``/metrics`` shows every slot free, nothing running or waiting;
- nothing lost or answered twice: every request the client finished got exactly one answer
  (one ``[DONE]`` per stream, distinct ids), with ``max_tokens`` tokens; the server ended as many
  requests as it accepted (``requests_submitted`` = sum of ``requests_finished`` by reason), and
  every client-side completion is counted by the server;
- same request, same answer: every greedy or seeded request equals the first one of its kind;
- RSS flat: the server's resident memory (``/proc/PID/status``) after warm-up against the end.

    python benchmarks/soak.py --requests 1000 --out benchmarks/results/soak.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
PROMPTS = [
    "daba deba diba",
    "tell me about caches",
    "fabe gaba laba goba",
    "one two three four five six",
]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def metrics(port: int) -> dict[str, float]:
    out = {}
    for line in httpx.get(f"http://127.0.0.1:{port}/metrics").text.splitlines():
        if line and not line.startswith("#") and "_bucket" not in line:
            name, value = line.rsplit(" ", 1)
            labels = name.partition("{")[2]
            reason = (
                labels.split('finish_reason="')[1].split('"')[0]
                if "finish_reason" in labels
                else None
            )
            out[name.split("{")[0] + (f":{reason}" if reason else "")] = float(value)
    return out


class Soak:
    def __init__(self, args, port: int):
        self.args, self.port = args, port
        self.base = f"http://127.0.0.1:{port}/v1"
        self.rng = random.Random(args.seed)
        self.outcomes: Counter = Counter()
        self.ids: set[str] = set()
        self.duplicates = 0
        self.wrong_length = []
        self.answers: dict = {}
        self.mismatches = []
        self.retries_429 = 0
        self.errors: list = []
        self.rss: list[tuple[int, float]] = []
        self.done = 0

    def plan(self, index: int) -> dict:
        rng = self.rng
        kind = rng.choices(
            ["stream", "leave_stream", "plain", "leave_plain"], weights=[4, 2, 3, 1]
        )[0]
        sampled = rng.random() < 0.4
        body = {
            "model": "soak",
            "prompt": rng.choice(PROMPTS),
            "max_tokens": rng.randint(1, self.args.max_tokens),
            "temperature": 0.8 if sampled else 0,
            "ignore_eos": True,
        }
        if sampled:
            body["seed"] = rng.randint(0, 3)
        return {
            "index": index,
            "kind": kind,
            "body": body,
            "leave_after": rng.randint(1, 3),
            "give_up_s": rng.uniform(0.001, 0.02),
        }

    def check_answer(self, item: dict, text: str, tokens: int) -> None:
        body = item["body"]
        if tokens != body["max_tokens"]:
            self.wrong_length.append((item["index"], tokens, body["max_tokens"]))
        key = (body["prompt"], body["max_tokens"], body["temperature"], body.get("seed"))
        first = self.answers.setdefault(key, text)
        if first != text:
            self.mismatches.append((item["index"], key))

    def record_id(self, ident: str) -> None:
        if ident in self.ids:
            self.duplicates += 1
        self.ids.add(ident)

    async def send(self, client: httpx.AsyncClient, item: dict) -> None:
        while True:
            try:
                outcome = await self.attempt(client, item)
            except httpx.HTTPStatusError as error:
                if error.response.status_code == 429:
                    self.retries_429 += 1
                    await asyncio.sleep(
                        float(error.response.headers.get("retry-after", "1")) * 0.05
                    )
                    continue
                self.errors.append((item["index"], repr(error)))
                outcome = "error"
            self.outcomes[outcome] += 1
            return

    async def attempt(self, client: httpx.AsyncClient, item: dict) -> str:
        body, kind = item["body"], item["kind"]
        if kind in ("plain", "leave_plain"):
            timeout = item["give_up_s"] if kind == "leave_plain" else 120
            try:
                response = await client.post(self.base + "/completions", json=body, timeout=timeout)
            except httpx.TimeoutException:
                return "left_plain"
            if response.status_code != 200:
                raise httpx.HTTPStatusError("status", request=response.request, response=response)
            reply = response.json()
            self.record_id(reply["id"])
            self.check_answer(
                item, reply["choices"][0]["text"], reply["usage"]["completion_tokens"]
            )
            return "completed"
        stream_body = {**body, "stream": True, "stream_options": {"include_usage": True}}
        events, done, text, usage, ident = 0, 0, [], None, None
        async with client.stream(
            "POST", self.base + "/completions", json=stream_body, timeout=120
        ) as response:
            if response.status_code != 200:
                await response.aread()
                raise httpx.HTTPStatusError("status", request=response.request, response=response)
            async for line in response.aiter_lines():
                if not line.startswith("data: "):
                    continue
                if line == "data: [DONE]":
                    done += 1
                    continue
                event = json.loads(line[6:])
                if "error" in event:
                    self.errors.append((item["index"], event["error"]))
                    continue
                ident = event["id"]
                if event.get("usage"):
                    usage = event["usage"]
                if event.get("choices"):
                    text.append(event["choices"][0]["text"])
                    events += 1
                    if (
                        kind == "leave_stream"
                        and events >= item["leave_after"]
                        and not event["choices"][0]["finish_reason"]
                    ):
                        return "left_stream"  # leaving the block closes the connection
        if done != 1:
            self.duplicates += int(done > 1)
            self.errors.append((item["index"], f"{done} [DONE] events"))
        self.record_id(ident)
        self.check_answer(item, "".join(text), usage["completion_tokens"])
        return "completed"

    async def run(self, pid: int) -> None:
        items = [self.plan(i) for i in range(self.args.requests)]
        queue = list(items)
        limits = httpx.Limits(max_connections=self.args.clients + 4)
        async with httpx.AsyncClient(limits=limits) as client:

            async def worker():
                while queue:
                    item = queue.pop(0)
                    await self.send(client, item)
                    self.done += 1
                    if self.done % 50 == 0:
                        self.rss.append((self.done, rss_mb(pid)))

            await asyncio.gather(*(worker() for _ in range(self.args.clients)))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--model", default=None, help="default: a small random model made for the run"
    )
    parser.add_argument("--backend", default="numpy")
    parser.add_argument("--drafter", default="lookup")
    parser.add_argument("--dtype", default=None, help="default: the server's (measured fastest)")
    parser.add_argument("--requests", type=int, default=1000)
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--slots", type=int, default=4)
    parser.add_argument("--max-queue", type=int, default=8)
    parser.add_argument(
        "--max-prefill-tokens",
        type=int,
        default=512,
        help="prompt tokens per step (smaller than the prompts: they are prefilled in chunks)",
    )
    parser.add_argument("--max-tokens", type=int, default=12)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()

    sys.path.insert(0, str(ROOT))
    tmp = tempfile.TemporaryDirectory()
    model = args.model
    if model is None:
        from specdec.testing import make_random_model

        model = str(
            make_random_model(
                Path(tmp.name) / "model",
                vocab_size=512,
                hidden_size=64,
                num_layers=2,
                num_heads=4,
                num_kv_heads=2,
                seed=0,
                with_tokenizer=True,
            )
        )
    port = free_port()
    command = [
        sys.executable,
        "-m",
        "specdec.cli.main",
        "serve",
        "--model",
        model,
        "--backend",
        args.backend,
        "--drafter",
        args.drafter,
        "--slots",
        str(args.slots),
        "--capacity",
        "256",
        "--max-queue",
        str(args.max_queue),
        "--max-prefill-tokens",
        str(args.max_prefill_tokens),
        "--port",
        str(port),
        "--served-model-name",
        "soak",
        "--log-level",
        "warning",
    ]
    if args.dtype:
        command += ["--dtype", args.dtype]
    server = subprocess.Popen(command, cwd=ROOT, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 600
        while True:
            if server.poll() is not None:
                raise RuntimeError(server.stderr.read())
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError("the server did not start")
            time.sleep(0.2)
        soak = Soak(args, port)
        start_rss = rss_mb(server.pid)
        start = time.perf_counter()
        asyncio.run(soak.run(server.pid))
        wall = time.perf_counter() - start
        time.sleep(0.5)  # the server notices the last disconnects
        end = metrics(port)
        end_rss = rss_mb(server.pid)
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(60)
    finished = {
        k.split(":")[1]: v
        for k, v in end.items()
        if k.startswith("specdec_requests_finished_total:")
    }
    warm = next((mb for n, mb in soak.rss if n >= min(200, args.requests // 2)), start_rss)
    completed = soak.outcomes["completed"]
    checks = {
        "no slot leak (all slots free, nothing running or waiting)": end["specdec_slots_free"]
        == args.slots
        and end["specdec_requests_running"] == 0
        and end["specdec_requests_waiting"] == 0,
        "every accepted request ended once (submitted = finished)": end[
            "specdec_requests_submitted_total"
        ]
        == sum(finished.values()),
        "every client request accounted for": sum(soak.outcomes.values()) == args.requests,
        "server saw every completion": finished.get("length", 0) + finished.get("stop", 0)
        >= completed,
        "no answer twice (one [DONE] per stream, distinct ids)": soak.duplicates == 0,
        "every answer has max_tokens tokens": not soak.wrong_length,
        "same request, same answer": not soak.mismatches,
        "no errors": not soak.errors and finished.get("error", 0) == 0,
        "RSS flat (end within 5% or 10 MB of after warm-up)": end_rss - warm
        <= max(10.0, 0.05 * warm),
    }
    report = {
        "command": " ".join(sys.argv),
        "wall_s": wall,
        "requests": args.requests,
        "clients": args.clients,
        "outcomes": dict(soak.outcomes),
        "retries_429": soak.retries_429,
        "server_finished": finished,
        "server_submitted": end["specdec_requests_submitted_total"],
        "server_rejected_429": end["specdec_requests_rejected_total"],
        "rss_mb": {"start": start_rss, "after_warmup": warm, "end": end_rss, "series": soak.rss},
        "errors": soak.errors[:10],
        "mismatch_count": len(soak.mismatches),
        "mismatches": soak.mismatches[:10],
        "wrong_length": soak.wrong_length[:10],
        "checks": checks,
    }
    print(
        json.dumps(
            {k: v for k, v in report.items() if k != "rss_mb"}
            | {"rss_mb": {k: v for k, v in report["rss_mb"].items() if k != "series"}},
            indent=1,
        )
    )
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(report, indent=1))
    return 0 if all(checks.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
