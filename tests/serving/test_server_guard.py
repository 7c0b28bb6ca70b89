"""What the server checks before a route runs (``specdec.serving.guard``, ``.protocol``): the API
key, the Host header, the content type, the body's size and time, header timeouts, the
connection limit and malformed HTTP; each refusal an OpenAI-shaped error."""

from __future__ import annotations

import json
import select
import socket
import threading
import time

import httpx
import pytest

from specdec.serving.limits import Limits

pytest.importorskip("uvicorn")
openai = pytest.importorskip("openai")

ONE = {"model": "tiny", "prompt": [5, 6], "max_tokens": 2, "temperature": 0}


def error_of(response: httpx.Response) -> dict:
    body = response.json()
    assert set(body) == {"error"} and set(body["error"]) == {"message", "type", "param", "code"}, (
        body
    )
    return body["error"]


def raw_exchange(port: int, data: bytes, *, timeout: float = 30.0) -> bytes:
    """Send ``data`` on a fresh connection and read until the server closes it."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as connection:
        connection.sendall(data)
        received = b""
        while chunk := connection.recv(65536):
            received += chunk
    return received


def status_and_error(response: bytes) -> tuple[int, dict]:
    head, _, body = response.partition(b"\r\n\r\n")
    return int(head.split(b" ")[1]), json.loads(body)["error"]


def test_an_api_key_is_required_on_every_route_but_health(serve):
    server, base = serve("lookup", server_options={"api_key": "sesame"})
    root = base.removesuffix("/v1")
    for headers in (
        {},
        {"Authorization": "Bearer wrong"},
        {"Authorization": "sesame"},
        {"Authorization": "Basic sesame"},
    ):
        response = httpx.post(base + "/completions", json=ONE, headers=headers)
        assert response.status_code == 401 and error_of(response)["code"] == "invalid_api_key", (
            headers
        )
        assert response.headers["www-authenticate"] == "Bearer"
    for path in ("/v1/models", "/metrics"):
        assert httpx.get(root + path).status_code == 401
    assert httpx.get(root + "/health").status_code == 200
    good = httpx.post(base + "/completions", json=ONE, headers={"Authorization": "Bearer sesame"})
    assert good.status_code == 200 and good.json()["usage"]["completion_tokens"] == 2
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=base, api_key="wrong", max_retries=0).completions.create(
            model="tiny", prompt="x"
        )
    reply = openai.OpenAI(base_url=base, api_key="sesame", max_retries=0).completions.create(
        model="tiny", prompt=[5, 6], max_tokens=3, temperature=0
    )
    assert reply.usage.completion_tokens == 3


def test_the_command_line_takes_the_key_and_warns_when_exposed_without_one(
    monkeypatch, model_dir, capsys
):
    from specdec.cli import main as cli
    from specdec.serving import server as server_module

    seen = []
    monkeypatch.setattr(
        server_module.Server, "run", lambda self: (seen.append(self), self.engine.close())
    )
    common = [
        "serve",
        "--model",
        str(model_dir),
        "--backend",
        "numpy",
        "--drafter",
        "lookup",
        "--slots",
        "1",
        "--capacity",
        "32",
    ]

    def warnings_of(argv, key_variable=None):
        if key_variable is None:
            monkeypatch.delenv("SPECDEC_API_KEY", raising=False)
        else:
            monkeypatch.setenv("SPECDEC_API_KEY", key_variable)
        capsys.readouterr()
        assert cli.main(common + argv) == 0
        return [line for line in capsys.readouterr().err.splitlines() if "warning" in line]

    exposed = warnings_of(["--host", "0.0.0.0"])
    assert len(exposed) == 1 and "0.0.0.0" in exposed[0] and "--api-key" in exposed[0]
    assert warnings_of(["--host", "0.0.0.0", "--api-key", "k"]) == []
    assert warnings_of(["--host", "0.0.0.0"], key_variable="from-env") == []
    assert warnings_of(["--host", "127.0.0.1"]) == [] and warnings_of(["--host", "::1"]) == []


def test_the_key_from_the_environment_is_enforced(monkeypatch, model_dir, wait_for):
    from specdec.cli import main as cli
    from specdec.serving import server as server_module

    statuses = {}
    real_run = server_module.Server.run

    def fake_run(self):
        thread = threading.Thread(target=real_run, args=(self,), daemon=True)
        thread.start()
        assert wait_for(lambda: self.started)
        try:
            url = f"http://127.0.0.1:{self.port}/v1/completions"
            statuses["none"] = httpx.post(url, json=ONE).status_code
            statuses["key"] = httpx.post(
                url, json=ONE, headers={"Authorization": "Bearer env-key"}
            ).status_code
        finally:
            self.stop()
            thread.join(60)  # its shutdown line is said before the next test's capture begins

    monkeypatch.setattr(server_module.Server, "run", fake_run)
    monkeypatch.setenv("SPECDEC_API_KEY", "env-key")
    assert (
        cli.main(
            [
                "serve",
                "--model",
                str(model_dir),
                "--backend",
                "numpy",
                "--drafter",
                "lookup",
                "--slots",
                "1",
                "--capacity",
                "32",
                "--port",
                "0",
                "--log-level",
                "warning",
                "--served-model-name",
                "tiny",
            ]
        )
        == 0
    )
    assert statuses == {"none": 401, "key": 200}


def test_a_body_over_the_limit_is_413_before_it_is_read(serve):
    server, base = serve("lookup", server_options={"limits": Limits(max_body_bytes=2000)})
    # declared too long: answered at once, with 50 MB announced and none of it sent
    head = (
        b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        b"Content-Length: 50000000\r\n\r\n"
    )
    status, error = status_and_error(raw_exchange(server.port, head))
    assert status == 413 and error["code"] == "request_too_large" and "2000" in error["message"]
    # not declared (chunked): refused once the limit is passed
    chunked = (
        b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        b"Transfer-Encoding: chunked\r\n\r\n" + b"%x\r\n%s\r\n" % (3000, b" " * 3000)
    )
    status, error = status_and_error(raw_exchange(server.port, chunked))
    assert status == 413 and error["code"] == "request_too_large"
    over = httpx.post(base + "/completions", json={**ONE, "user": "x" * 2500})
    assert over.status_code == 413 and error_of(over)["code"] == "request_too_large"
    assert httpx.post(base + "/completions", json={**ONE, "user": "x" * 1500}).status_code == 200


@pytest.mark.parametrize(
    "content_type",
    [
        None,
        "text/plain",
        "application/x-www-form-urlencoded",
        "multipart/form-data; boundary=x",
        "application/json; charset=latin-1",
        "application/jsonx",
    ],
)
def test_a_body_must_be_sent_as_json(serve, content_type):
    _, base = serve("lookup")
    headers = {} if content_type is None else {"Content-Type": content_type}
    response = httpx.post(base + "/completions", content=json.dumps(ONE).encode(), headers=headers)
    assert response.status_code == 415 and error_of(response)["code"] == "unsupported_media_type"


def test_json_with_a_utf8_charset_is_accepted(serve):
    _, base = serve("lookup")
    for content_type in ("application/json; charset=utf-8", "Application/JSON;charset=\"UTF-8\""):
        response = httpx.post(
            base + "/completions",
            content=json.dumps(ONE).encode(),
            headers={"Content-Type": content_type},
        )
        assert response.status_code == 200, content_type


def test_the_host_header_must_name_this_server(serve):
    server, base = serve("lookup", server_options={"allowed_hosts": ("models.internal",)})
    url = f"http://127.0.0.1:{server.port}/v1/completions"
    for host in (
        "evil.example",
        "evil.example:8000",
        "127.0.0.1.evil.example",
        "10.1.2.3",
        "localhost.evil",
    ):
        response = httpx.post(url, json=ONE, headers={"Host": host})
        assert response.status_code == 421 and error_of(response)["code"] == "host_not_allowed", (
            host
        )
    assert (
        httpx.get(
            base.removesuffix("/v1") + "/health", headers={"Host": "evil.example"}
        ).status_code
        == 421
    )
    for host in (
        "localhost",
        f"localhost:{server.port}",
        "127.0.0.1",
        "127.0.0.2:80",
        "[::1]",
        "[::1]:8000",
        "LOCALHOST.",
        "models.internal",
        "models.internal:443",
    ):
        assert httpx.post(url, json=ONE, headers={"Host": host}).status_code == 200, host


def test_host_names_accepted_by_binding():
    from specdec.serving.guard import HostCheck

    assert HostCheck("0.0.0.0")("10.1.2.3:8000") and HostCheck("::")("[fe80::1]:80")
    assert not HostCheck("0.0.0.0")("attacker.example")
    assert HostCheck("myhost.lan")("MyHost.lan:8000") and not HostCheck("myhost.lan")("other.lan")
    assert HostCheck("127.0.0.1", ["*"])("anything.example")
    assert HostCheck("127.0.0.1")(None)  # HTTP/1.0 without a Host: not a browser


def test_headers_that_never_finish_are_timed_out(serve):
    server, _ = serve("lookup", server_options={"limits": Limits(header_timeout=0.3)})
    half = raw_exchange(
        server.port, b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-"
    )
    status, error = status_and_error(half)
    assert status == 408 and error["code"] == "request_timeout"
    assert raw_exchange(server.port, b"") == b""  # a connection that sends nothing is closed
    # after a first request, the next one's headers are timed out too
    body = json.dumps(ONE).encode()
    first = (
        b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        b"Content-Length: %d\r\n\r\n" % len(body) + body
    )
    with socket.create_connection(("127.0.0.1", server.port), timeout=30) as connection:
        connection.sendall(first)
        received = b""
        while b'"usage"' not in received:
            received += connection.recv(65536)
        assert received.startswith(b"HTTP/1.1 200")
        connection.sendall(b"GET /health HTTP/1.1\r\nHo")
        rest = b""
        while chunk := connection.recv(65536):
            rest += chunk
    assert status_and_error(rest)[0] == 408


def test_a_body_that_never_finishes_is_408(serve):
    server, base = serve("lookup", server_options={"limits": Limits(body_timeout=0.3)})
    partial = (
        b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        b"Content-Length: 100\r\n\r\n{\"model\": "
    )
    status, error = status_and_error(raw_exchange(server.port, partial))
    assert status == 408 and error["code"] == "request_timeout"
    assert httpx.post(base + "/completions", json=ONE).status_code == 200


def test_connections_beyond_the_limit_are_503_when_none_is_idle(serve, gate, wait_for):
    server, base = serve(
        gate, slots=2, speculation="always", server_options={"limits": Limits(max_connections=2)}
    )
    gate.open.clear()  # two requests held in the engine: their connections are busy
    held = [
        threading.Thread(target=httpx.post, args=(base + "/completions",), kwargs={"json": ONE})
        for _ in range(2)
    ]
    for thread in held:
        thread.start()
    try:
        assert wait_for(lambda: sum(server.engine.stats()[k] for k in ("running", "waiting")) == 2)
        response = httpx.post(base + "/completions", json=ONE)
        assert response.status_code == 503 and error_of(response)["code"] == "too_many_connections"
        assert response.headers["retry-after"] == "1"
    finally:
        gate.open.set()
        for thread in held:
            thread.join(60)
    for _ in range(100):  # the server notices the closed connections on its own time
        if (status := httpx.post(base + "/completions", json=ONE).status_code) == 200:
            break
        time.sleep(0.05)
    assert status == 200


def test_malformed_http_and_oversized_headers_get_an_openai_error(serve):
    server, _ = serve("lookup")
    status, error = status_and_error(raw_exchange(server.port, b"NOT HTTP AT ALL\r\n\r\n"))
    assert status == 400 and error["code"] == "invalid_http"
    big = b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Big: " + b"a" * 40000 + b"\r\n\r\n"
    status, error = status_and_error(
        raw_exchange(server.port, big)
    )  # arriving at once: parsed, then refused
    assert status == 431 and error["code"] == "headers_too_large"
    with socket.create_connection(("127.0.0.1", server.port), timeout=30) as connection:
        connection.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Big: ")
        for _ in range(
            40
        ):  # arriving piece by piece: h11 stops buffering at its limit, and answers
            connection.sendall(b"a" * 1000)
            if select.select([connection], [], [], 0.02)[0]:
                break
        received = b""
        while chunk := connection.recv(65536):
            received += chunk
    status, error = status_and_error(received)
    assert status == 400 and error["code"] == "invalid_http"
