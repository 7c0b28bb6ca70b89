"""Connections and the API key (``specdec.serving.protocol``, ``.limits``): idle connections never
keep a request out, one client cannot take every connection, a connection that sends nothing is
closed sooner than one in the middle of a request, and the API key is the one clients can send
(trimmed; 'none' on the command line is no key; one no header can carry is refused at start)."""

from __future__ import annotations

import socket
import threading

import httpx
import pytest

from specdec.serving.limits import Limits

pytest.importorskip("uvicorn")

ONE = {"model": "tiny", "prompt": [5, 6], "max_tokens": 2, "temperature": 0}
OTHER_CLIENT = "127.0.0.2"  # another loopback address: another client to the server


def post_from(address: str, port: int) -> httpx.Response:
    """A completion request sent from the local ``address`` (skips where this machine has no
    such address: 127.0.0.2 is loopback on Linux, not on every system)."""
    try:
        with socket.socket() as probe:
            probe.bind((address, 0))
    except OSError:
        pytest.skip(f"{address} is not an address of this machine")
    transport = httpx.HTTPTransport(local_address=address)
    with httpx.Client(transport=transport, timeout=60) as client:
        return client.post(f"http://127.0.0.1:{port}/v1/completions", json=ONE)


def test_idle_connections_never_keep_a_request_out(serve):
    limits = Limits(
        max_connections=8, max_connections_per_client=4, first_byte_timeout=60, header_timeout=60
    )
    server, base = serve("lookup", server_options={"limits": limits})
    silent = [socket.create_connection(("127.0.0.1", server.port), timeout=30) for _ in range(20)]
    try:
        assert httpx.post(base + "/completions", json=ONE, timeout=60).status_code == 200
        assert post_from(OTHER_CLIENT, server.port).status_code == 200
        closed = 0
        for connection in silent:  # the server closed all but the newest of the client's limit
            connection.settimeout(0.5)
            try:
                closed += connection.recv(1) == b""
            except TimeoutError:
                pass
        assert closed >= len(silent) - limits.max_connections_per_client
    finally:
        for connection in silent:
            connection.close()


def test_a_client_over_its_limit_is_refused_while_another_is_served(serve, gate, wait_for):
    limits = Limits(max_connections_per_client=2)
    server, base = serve(gate, slots=2, speculation="always", server_options={"limits": limits})
    gate.open.clear()  # two requests of this client held in the engine: its connections are busy
    held = [
        threading.Thread(target=httpx.post, args=(base + "/completions",), kwargs={"json": ONE})
        for _ in range(2)
    ]
    for thread in held:
        thread.start()
    try:
        assert wait_for(lambda: sum(server.engine.stats()[k] for k in ("running", "waiting")) == 2)
        refused = httpx.post(base + "/completions", json=ONE, timeout=60)
        error = refused.json()["error"]
        assert refused.status_code == 503 and error["code"] == "too_many_connections"
        assert "--max-connections-per-client" in error["message"]
        gate.open.set()
        assert post_from(OTHER_CLIENT, server.port).status_code == 200
    finally:
        gate.open.set()
        for thread in held:
            thread.join(60)


def test_a_silent_connection_is_closed_sooner_than_one_in_the_middle_of_a_request(serve):
    limits = Limits(first_byte_timeout=0.2, header_timeout=60)
    server, _ = serve("lookup", server_options={"limits": limits})
    body = b'{"model": "tiny", "prompt": [5, 6], "max_tokens": 2}'
    head = b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
    with (
        socket.create_connection(("127.0.0.1", server.port), timeout=10) as started,
        socket.create_connection(("127.0.0.1", server.port), timeout=10) as silent,
    ):
        started.sendall(head)
        assert silent.recv(1) == b""  # closed (the socket's timeout, 10 s, is a failure)
        started.sendall(
            b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(body) + body
        )
        reply = b""
        while b'"usage"' not in reply:
            chunk = started.recv(65536)
            assert chunk, reply
            reply += chunk
    assert reply.startswith(b"HTTP/1.1 200")


def test_the_api_key_is_trimmed(serve):
    _, base = serve("lookup", server_options={"api_key": "  sesame\n"})
    headers = {"Authorization": "Bearer sesame"}
    assert httpx.post(base + "/completions", json=ONE, headers=headers).status_code == 200
    assert httpx.post(base + "/completions", json=ONE).status_code == 401


@pytest.mark.parametrize("flag", ["none", "NONE"])
def test_api_key_none_on_the_command_line_is_no_key(monkeypatch, model_dir, flag):
    from specdec.cli import main as cli
    from specdec.serving import server as server_module

    statuses = []
    real_run = server_module.Server.run

    def fake_run(self):
        thread = threading.Thread(target=real_run, args=(self,), daemon=True)
        thread.start()
        try:
            for _ in range(3000):
                if self.started:
                    break
                thread.join(0.01)
            url = f"http://127.0.0.1:{self.port}/v1/completions"
            statuses.append(httpx.post(url, json=ONE, timeout=60).status_code)
        finally:
            self.stop()
            thread.join(60)  # its shutdown line is said before the next test's capture begins

    monkeypatch.setattr(server_module.Server, "run", fake_run)
    monkeypatch.setenv("SPECDEC_API_KEY", "from-env")
    argv = ["serve", "--model", str(model_dir), "--backend", "numpy", "--drafter", "lookup"]
    argv += ["--slots", "1", "--capacity", "32", "--port", "0", "--log-level", "warning"]
    assert cli.main(argv + ["--served-model-name", "tiny", "--api-key", flag]) == 0
    assert statuses == [200]


@pytest.mark.parametrize(
    ("key", "fragment"), [("   ", "only whitespace"), ("s\u00e9same", "printable ASCII")]
)
def test_a_key_no_client_can_send_is_refused_at_start(
    monkeypatch, model_dir, capsys, key, fragment
):
    from specdec.cli import main as cli
    from specdec.serving import server as server_module

    monkeypatch.setattr(server_module.Server, "run", lambda self: self.engine.close())
    monkeypatch.delenv("SPECDEC_API_KEY", raising=False)
    argv = ["serve", "--model", str(model_dir), "--backend", "numpy", "--api-key", key]
    assert cli.main(argv) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("specdec: error:") and fragment in lines[0]
