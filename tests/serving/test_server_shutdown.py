"""Shutdown of the server: when the drain's timeout expires, a stream still running ends with an
error event and ``[DONE]`` and a client waiting for a plain reply gets an OpenAI-shaped 503, as
with ``--no-drain``; a drained ``specdec serve`` exits 0 at SIGTERM."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading

import httpx
import pytest

pytest.importorskip("uvicorn")


def test_when_the_drain_times_out_every_client_is_answered_the_documented_way(
    serve, gate, wait_for
):
    server, base = serve(gate, slots=1, shutdown_timeout=0.3)
    gate.open.clear()
    results = {}

    def stream():
        with httpx.stream(
            "POST",
            base + "/completions",
            timeout=60,
            json={
                "model": "tiny",
                "prompt": [5],
                "max_tokens": 40,
                "stream": True,
                "temperature": 0,
            },
        ) as response:
            results["stream"] = response.read().decode()

    def plain():
        results["plain"] = httpx.post(
            base + "/completions",
            timeout=60,
            json={"model": "tiny", "prompt": [6], "max_tokens": 40},
        )

    threads = [threading.Thread(target=stream)]
    threads[0].start()
    assert gate.proposing.wait(10)
    threads.append(threading.Thread(target=plain))
    threads[1].start()
    assert wait_for(lambda: server.engine.stats()["waiting"] == 1)
    stopper = threading.Thread(target=server.stop)
    stopper.start()
    assert server.drain_expired.wait(30), "the drain's timeout never expired"
    gate.open.set()  # the held step ends; then the engine cancels what is left
    for thread in threads + [stopper]:
        thread.join(30)
    body = results["stream"]
    events = [json.loads(e[6:]) for e in body.split("\n\n") if e.startswith("data: {")]
    assert events[-1]["error"]["code"] == "cancelled" and body.endswith("data: [DONE]\n\n"), body
    reply = results["plain"]
    assert reply.status_code == 503 and reply.headers["content-type"] == "application/json"
    assert set(reply.json()["error"]) == {"message", "type", "param", "code"}
    assert reply.json()["error"]["code"] == "cancelled"
    assert server.engine.closed and not server.engine.target.cache.admitted.any()


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_a_drained_shutdown_at_sigterm_exits_0(model_dir, wait_for):
    port = _free_port()
    argv = [
        "serve",
        "--model",
        str(model_dir),
        "--backend",
        "numpy",
        "--drafter",
        "none",
        "--slots",
        "1",
        "--capacity",
        "2048",
        "--port",
        str(port),
        "--served-model-name",
        "tiny",
    ]  # the default --log-level: specdec's lines, not uvicorn's INFO ones
    process = subprocess.Popen(
        [
            sys.executable,
            "-c",
            f"from specdec.cli.main import main; raise SystemExit(main({argv!r}))",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    base = f"http://127.0.0.1:{port}"

    def up():
        try:
            return httpx.get(base + "/health", timeout=2).status_code == 200
        except httpx.TransportError:
            return process.poll() is not None

    try:
        assert wait_for(up, timeout=120) and process.poll() is None, process.stderr.read().decode()
        with httpx.stream(
            "POST",
            base + "/v1/completions",
            timeout=60,
            json={
                "model": "tiny",
                "prompt": [5, 6],
                # long enough to be in flight when SIGTERM lands: 200 tokens of the tiny model
                # once ended before it did ("no request in flight") on a loaded machine
                "max_tokens": 2000,
                "stream": True,
                "temperature": 0,
                "ignore_eos": True,
            },
        ) as response:
            lines = response.iter_lines()
            assert next(line for line in lines if line).startswith("data: {")
            process.send_signal(signal.SIGTERM)  # in flight: drained, then the process ends
            rest = "\n".join(lines)
        assert rest.rstrip().endswith("data: [DONE]") and '"finish_reason": "length"' in rest
        assert process.wait(60) == 0, process.stderr.read().decode()
        said = process.stderr.read().decode()
        assert (
            "specdec: shutting down: new requests get 503; the 1 request(s) in flight may finish "
            "within 30 s, then what is left is cancelled" in said
        ), said
        assert "specdec: stopped; 1 request(s) ended (1 length)" in said, said
        assert "INFO:" not in said, said  # uvicorn's start and stop lines beside specdec's
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
