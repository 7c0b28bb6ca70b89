"""A step that does not end: the engine reports how long it has run, /health answers 503
"stalled" past the stall timeout, ``Engine.close`` with a timeout returns False instead of
waiting forever, and ``specdec serve`` still exits at SIGTERM (status 1, one line saying why)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys

import httpx
import pytest

import specdec

pytest.importorskip("uvicorn")


def test_health_says_stalled_while_a_step_runs_past_the_stall_timeout(serve, gate, wait_for):
    server, base = serve(
        gate, slots=1, speculation="always", server_options={"stall_timeout": 0.05}
    )
    root = base.removesuffix("/v1")
    assert httpx.get(root + "/health").json()["status"] == "ok"
    gate.open.clear()
    handle = server.engine.submit([5], max_new_tokens=4)
    assert gate.proposing.wait(10)
    assert wait_for(lambda: server.engine.stats()["step_seconds"] > 0.05)
    reply = httpx.get(root + "/health")
    assert reply.status_code == 503 and reply.json()["status"] == "stalled", reply.text
    gate.open.set()
    assert len(handle.result(timeout=30).tokens) == 4
    assert wait_for(lambda: httpx.get(root + "/health").status_code == 200)


def test_close_with_a_timeout_gives_up_on_a_stuck_step_and_closes_once_it_ends(model_dir, gate):
    engine = specdec.Engine(
        model_dir,
        drafter=gate,
        backend="numpy",
        slots=1,
        capacity=32,
        tree_room=8,
        speculation="always",
    )
    gate.open.clear()
    handle = engine.submit([5], max_new_tokens=4)
    assert gate.proposing.wait(10)
    assert engine.close(drain=False, timeout=0.1) is False
    assert not engine.closed and engine.stats()["closing"]
    with pytest.raises(specdec.EngineClosedError):
        engine.submit([6], max_new_tokens=1)
    gate.open.set()
    assert engine.close(drain=False) is True and engine.closed
    assert handle.result(timeout=10).finish_reason == "cancelled"
    assert not engine.target.cache.admitted.any()


STUCK = """
import threading
import specdec.drafting.none
propose = specdec.drafting.none.NoDrafter.propose
def stuck(self, context):
    if any(77 in list(row) for row in context.history):  # a step that never ends
        threading.Event().wait()
    return propose(self, context)
specdec.drafting.none.NoDrafter.propose = stuck
from specdec.cli.main import main
raise SystemExit(main({argv!r}))
"""


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_a_server_whose_step_is_stuck_exits_at_sigterm(model_dir, wait_for):
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
        "256",
        "--port",
        str(port),
        "--served-model-name",
        "tiny",
        "--log-level",
        "warning",
        "--speculation",
        "always",
        "--shutdown-timeout",
        "0.2",
        "--stall-timeout",
        "0.05",
    ]
    process = subprocess.Popen(
        [sys.executable, "-c", STUCK.format(argv=argv)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    health = f"http://127.0.0.1:{port}/health"
    try:

        def status():
            try:
                return httpx.get(health, timeout=5).json()["status"]
            except httpx.HTTPError:
                return None

        assert wait_for(lambda: status() == "ok", 120), "the server did not start"
        client = subprocess.Popen(
            [
                sys.executable,
                "-c",
                (
                    "import httpx; httpx.post('http://127.0.0.1:%d/v1/completions', timeout=120, "
                    "json={'model': 'tiny', 'prompt': [77], 'max_tokens': 4})" % port
                ),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        assert wait_for(lambda: status() == "stalled"), "/health never said the step was stuck"
        process.send_signal(signal.SIGTERM)
        _, err = process.communicate(timeout=120)
        client.kill()
        client.wait()
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    lines = err.decode().strip().splitlines()
    assert process.returncode == 1, err.decode()
    assert (
        lines[-1]
        == "specdec: error: the engine's step did not end at shutdown; exiting with it unfinished"
    ), lines
