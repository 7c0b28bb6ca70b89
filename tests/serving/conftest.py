"""Fixtures of the serving tests: engines over the session's tiny model, a drafter that can be
held mid-step (to fill queues and slots on purpose), servers on a free loopback port, and a wait
for a condition that another thread makes true."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

import specdec
from specdec.drafting.none import NoDrafter


class GateDrafter:
    """Plain decoding whose ``propose`` waits while the gate is closed, so a test can hold the
    engine in a step; ``proposing`` is set while it waits. ``poison``: a token that makes
    ``propose`` raise for the rows whose text holds it (a request failing late)."""

    caps = NoDrafter.caps

    def __init__(self, poison: int | None = None):
        self.open = threading.Event()
        self.open.set()
        self.proposing = threading.Event()
        self.poison = poison
        self.calls = 0

    def propose(self, context):
        self.calls += 1
        self.proposing.set()
        assert self.open.wait(60), "the gate stayed closed"
        self.proposing.clear()
        if self.poison is not None and any(self.poison in h for h in context.history):
            raise RuntimeError(f"poisoned row: token {self.poison} in its text")
        roots = np.asarray(context.root_tokens)
        return specdec.Draft(root_tokens=context.root_tokens, beams=roots[:, None, None])


def _wait_for(predicate, timeout: float = 60.0) -> bool:
    """Whether ``predicate()`` came true within ``timeout`` seconds (asked every 10 ms)."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if predicate():
            return True
        time.sleep(0.01)
    return False


@pytest.fixture
def wait_for():
    """``wait_for(predicate, timeout=60.0)``: whether the predicate came true in time."""
    return _wait_for


@pytest.fixture
def gate_drafter():
    """The GateDrafter class, for tests that make their own."""
    return GateDrafter


@pytest.fixture
def gate():
    drafter = GateDrafter()
    yield drafter
    drafter.open.set()


@pytest.fixture
def cancel_asked(monkeypatch):
    """An event set when the server asks the engine to cancel a request (``Handle.cancel``): a
    test holding the engine at the gate waits for it before opening the gate, or the engine
    could finish the request before the server has noticed that its client left."""
    from specdec.serving.handle import Handle

    asked = threading.Event()
    cancel = Handle.cancel

    def cancel_and_tell(self):
        cancel(self)
        asked.set()

    monkeypatch.setattr(Handle, "cancel", cancel_and_tell)
    return asked


@pytest.fixture
def make_engine(model_dir):
    """Engine factory over ``model_dir`` on numpy (64 positions per request, 32 more for a draft
    tree); closed at teardown."""
    engines = []

    def make(drafter="lookup", *, slots=2, capacity=64, backend="numpy", **options):
        engine = specdec.Engine(
            model_dir,
            drafter=drafter,
            backend=backend,
            slots=slots,
            capacity=capacity,
            tree_room=32,
            **options,
        )
        engines.append(engine)
        return engine

    yield make
    for engine in engines:
        engine.close(drain=False)


@pytest.fixture
def serve(make_engine):
    """Server factory: ``serve(drafter=..., server_options={...}, **engine options)`` ->
    (server, base URL of /v1); ``server_options`` go to ``Server``
    (``api_key``, ``limits``, ...)."""
    pytest.importorskip("uvicorn")
    from specdec.serving.server import Server

    servers = []

    def start(
        drafter="lookup", *, drain=True, shutdown_timeout=30.0, server_options=None, **options
    ):
        engine = make_engine(drafter, **options)
        server = Server(
            engine,
            model_name="tiny",
            port=0,
            drain=drain,
            shutdown_timeout=shutdown_timeout,
            log_level="warning",
            **(server_options or {}),
        ).start()
        servers.append(server)
        return server, f"http://127.0.0.1:{server.port}/v1"

    yield start
    for server in servers:
        server.stop()
