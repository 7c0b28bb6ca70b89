"""A request's preparation (rendering or tokenizing its prompt on a worker thread) that does not
end: /health answers 503 "stalled" once it has run past the stall timeout, and ``specdec serve``
still exits at SIGTERM within its grace period (status 1, one line saying why)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time

import httpx
import pytest

pytest.importorskip("uvicorn")


def test_health_says_stalled_while_a_preparation_runs_past_the_stall_timeout(
    serve, monkeypatch, wait_for
):
    from specdec.serving import prepare

    tokenize, entered, release = prepare.tokenize, threading.Event(), threading.Event()

    def held(tokenizer, text):
        if "daba" in text:
            entered.set()
            assert release.wait(60), "the test never released the preparation"
        return tokenize(tokenizer, text)

    monkeypatch.setattr(prepare, "tokenize", held)
    server, base = serve("lookup", server_options={"stall_timeout": 0.05})
    root = base.removesuffix("/v1")
    assert httpx.get(root + "/health").json()["status"] == "ok"
    replies = []
    sender = threading.Thread(
        target=lambda: replies.append(
            httpx.post(
                base + "/completions",
                json={"model": "tiny", "prompt": "daba", "max_tokens": 2},
                timeout=60,
            )
        )
    )
    sender.start()
    try:
        assert entered.wait(30), "the request never reached the tokenizer"
        assert wait_for(lambda: server.app.state.preparations.stats()[1] > 0.05)
        reply = httpx.get(root + "/health")
        assert reply.status_code == 503 and reply.json()["status"] == "stalled", reply.text
        assert reply.json()["preparing"] == 1 and reply.json()["step_seconds"] == 0.0
    finally:
        release.set()
        sender.join(60)
    assert replies[0].status_code == 200
    assert wait_for(lambda: httpx.get(root + "/health").status_code == 200)


STUCK = """
import threading
import specdec.serving.prepare
tokenize = specdec.serving.prepare.tokenize
def stuck(tokenizer, text):
    if "daba" in text:  # a preparation that never ends
        threading.Event().wait()
    return tokenize(tokenizer, text)
specdec.serving.prepare.tokenize = stuck
from specdec.cli.main import main
raise SystemExit(main({argv!r}))
"""


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_a_server_whose_preparation_is_stuck_exits_at_sigterm_within_its_grace(model_dir, wait_for):
    from specdec.serving.server import CANCEL_GRACE

    port, shutdown_timeout = _free_port(), 0.2
    argv = ["serve", "--model", str(model_dir), "--backend", "numpy", "--drafter", "none"]
    argv += ["--slots", "1", "--capacity", "256", "--port", str(port), "--log-level", "critical"]
    argv += ["--served-model-name", "tiny", "--stall-timeout", "0.05"]
    argv += ["--shutdown-timeout", str(shutdown_timeout)]
    process = subprocess.Popen(
        [sys.executable, "-c", STUCK.format(argv=argv)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    client = None
    try:

        def status():
            try:
                return httpx.get(f"http://127.0.0.1:{port}/health", timeout=5).json()["status"]
            except httpx.HTTPError:
                return None

        assert wait_for(lambda: status() == "ok", 120), "the server did not start"
        client = subprocess.Popen(
            [
                sys.executable,
                "-c",
                (
                    f"import httpx; httpx.post('http://127.0.0.1:{port}/v1/completions', "
                    "timeout=120, json={'model': 'tiny', 'prompt': 'daba', 'max_tokens': 4})"
                ),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        assert wait_for(lambda: status() == "stalled"), "/health never said it was stuck"
        signalled = time.monotonic()
        process.send_signal(signal.SIGTERM)
        _, err = process.communicate(timeout=120)
        took = time.monotonic() - signalled
    finally:
        for child in (process, client):
            if child is not None and child.poll() is None:
                child.kill()
                child.wait()
    lines = err.decode().strip().splitlines()
    assert process.returncode == 1, err.decode()
    assert lines[-1] == (
        "specdec: error: a request's preparation (rendering or tokenizing its prompt) did not end "
        "at shutdown; exiting with it unfinished"
    ), lines
    # the grace period (drain timeout, then the cancelled requests' grace), with room for a
    # loaded machine: never the minutes of a hang
    assert took < shutdown_timeout + CANCEL_GRACE + 30, took
