"""The OpenAI-compatible server (specdec serve) on a loopback port, through the official
``openai`` client and raw HTTP: completions and chat, streamed and not, every error status, a
client leaving mid-stream, metrics, and shutdown with and without draining."""

from __future__ import annotations

import json
import threading
import time

import httpx
import pytest

import specdec

openai = pytest.importorskip("openai")


def client(base: str):
    return openai.OpenAI(base_url=base, api_key="unused", max_retries=0, timeout=60)


def metrics_of(base: str) -> dict[str, float]:
    """{name{labels}: value} of the server's /metrics, parsed by prometheus_client."""
    from prometheus_client.parser import text_string_to_metric_families

    text = httpx.get(base.removesuffix("/v1") + "/metrics").text
    out = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = ",".join(
                f"{k}={v}" for k, v in sorted(sample.labels.items()) if k != "model_name"
            )
            out[sample.name + (f"{{{labels}}}" if labels else "")] = sample.value
    return out


def test_completions_match_generate_and_count_usage(serve, model_dir):
    _, base = serve("lookup")
    reply = client(base).completions.create(
        model="tiny", prompt="daba deba diba", max_tokens=8, temperature=0
    )
    alone = specdec.generate(
        model_dir, "daba deba diba", drafter="lookup", backend="numpy", max_new_tokens=8
    )
    choice = reply.choices[0]
    assert (
        reply.object == "text_completion" and reply.model == "tiny" and reply.id.startswith("cmpl-")
    )
    assert (
        choice.text == " " + alone.text and choice.finish_reason == "length" and choice.index == 0
    )
    assert (reply.usage.prompt_tokens, reply.usage.completion_tokens, reply.usage.total_tokens) == (
        3,
        8,
        11,
    )
    ids = client(base).completions.create(
        model="tiny", prompt=[5, 6, 7], max_tokens=4, temperature=0
    )
    assert ids.usage.prompt_tokens == 3 and ids.usage.completion_tokens == 4


def test_streamed_completions_and_chat_add_up_to_the_plain_answer(serve):
    server, base = serve("lookup")
    api = client(base)
    plain = api.completions.create(model="tiny", prompt="daba deba", max_tokens=10, temperature=0)
    pieces = list(
        api.completions.create(
            model="tiny", prompt="daba deba", max_tokens=10, temperature=0, stream=True
        )
    )
    assert "".join(p.choices[0].text for p in pieces) == plain.choices[0].text
    assert pieces[-1].choices[0].finish_reason == "length" and all(
        p.choices[0].finish_reason is None for p in pieces[:-1]
    )
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "daba deba"}]
    chat = api.chat.completions.create(model="tiny", messages=messages, max_tokens=6, temperature=0)
    assert chat.object == "chat.completion" and chat.choices[0].message.role == "assistant"
    assert (
        chat.usage.prompt_tokens == len(server.engine.encode(messages))
        and chat.usage.completion_tokens == 6
    )
    chunks = list(
        api.chat.completions.create(
            model="tiny",
            messages=messages,
            max_tokens=6,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == chat.choices[0].message.content
    finals = [
        c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason
    ]
    assert (
        finals == ["length"]
        and chunks[-1].choices == []
        and chunks[-1].usage.total_tokens == chat.usage.total_tokens
    )
    parts = [
        {
            "role": "user",
            "content": [{"type": "text", "text": "daba "}, {"type": "text", "text": "deba"}],
        }
    ]
    assert (
        api.chat.completions.create(model="tiny", messages=parts, max_tokens=6, temperature=0)
        .choices[0]
        .message.content
        == api.chat.completions.create(
            model="tiny",
            messages=[{"role": "user", "content": "daba deba"}],
            max_tokens=6,
            temperature=0,
        )
        .choices[0]
        .message.content
    )


def test_raw_sse_framing_ends_with_done(serve):
    _, base = serve("lookup")
    with httpx.stream(
        "POST",
        base + "/completions",
        json={"model": "tiny", "prompt": [5, 6], "max_tokens": 3, "stream": True, "temperature": 0},
    ) as response:
        assert response.headers["content-type"].startswith("text/event-stream")
        body = response.read().decode()
    events = body.split("\n\n")
    assert events[-1] == "" and events[-2] == "data: [DONE]"
    assert all(e.startswith("data: {") for e in events[:-2])
    assert json.loads(events[-3][6:])["choices"][0]["finish_reason"] == "length"


def test_seeds_make_sampling_reproducible_and_equal_to_generate(serve, model_dir):
    _, base = serve("lookup")
    api = client(base)
    answers = [
        api.completions.create(
            model="tiny", prompt=[5, 6, 7], max_tokens=12, temperature=0.9, top_p=0.95, seed=42
        )
        .choices[0]
        .text
        for _ in range(2)
    ]
    others = [
        api.completions.create(
            model="tiny", prompt=[5, 6, 7], max_tokens=12, temperature=0.9, top_p=0.95, seed=seed
        )
        .choices[0]
        .text
        for seed in (43, 44, 45)
    ]  # the text is peaked
    alone = specdec.generate(
        model_dir,
        [5, 6, 7],
        drafter="lookup",
        backend="numpy",
        max_new_tokens=12,
        temperature=0.9,
        top_p=0.95,
        seed=42,
    )
    tokenizer_text = " " + alone.text
    assert answers[0] == answers[1] == tokenizer_text and any(
        other != answers[0] for other in others
    )


def test_stop_strings_and_extensions(serve):
    _, base = serve("lookup")
    api = client(base)
    full = (
        api.completions.create(model="tiny", prompt=[5, 6, 7], max_tokens=12, temperature=0)
        .choices[0]
        .text
    )
    stop = full.split()[2]
    cut = api.completions.create(
        model="tiny", prompt=[5, 6, 7], max_tokens=12, temperature=0, stop=[stop]
    )
    assert (
        cut.choices[0].text == full[: full.index(stop)] and cut.choices[0].finish_reason == "stop"
    )
    streamed = list(
        api.completions.create(
            model="tiny", prompt=[5, 6, 7], max_tokens=12, temperature=0, stop=stop, stream=True
        )
    )
    assert "".join(p.choices[0].text for p in streamed) == cut.choices[0].text
    top_k = api.completions.create(
        model="tiny",
        prompt=[5, 6, 7],
        max_tokens=4,
        temperature=0.7,
        seed=1,
        extra_body={"top_k": 1},
    )
    assert (
        top_k.choices[0].text
        == api.completions.create(model="tiny", prompt=[5, 6, 7], max_tokens=4, temperature=0)
        .choices[0]
        .text
    )


def error_of(response: httpx.Response) -> dict:
    body = response.json()
    assert set(body) == {"error"} and set(body["error"]) == {"message", "type", "param", "code"}, (
        body
    )
    return body["error"]


@pytest.mark.parametrize(
    "payload, param",
    [
        ({"prompt": "x", "temperature": 2.5}, "temperature"),
        ({"prompt": "x", "temperature": "hot"}, "temperature"),
        ({"prompt": "x", "top_p": 0}, "top_p"),
        ({"prompt": "x", "top_p": 1.5}, "top_p"),
        ({"prompt": "x", "top_k": -3}, "top_k"),
        ({"prompt": "x", "top_k": 2.5}, "top_k"),
        ({"prompt": "x", "n": 2}, "n"),
        ({"prompt": "x", "max_tokens": 0}, "max_tokens"),
        ({"prompt": "x", "seed": -1}, "seed"),
        ({"prompt": "x", "stop": [1, 2]}, "stop"),
        ({"prompt": "x", "logprobs": 2}, "logprobs"),
        ({"prompt": "x", "stream": "yes"}, "stream"),
        ({"prompt": ""}, "prompt"),
        ({"prompt": ["a", "b"]}, "prompt"),
        ({"prompt": [5, 500]}, "prompt"),
        ({}, "prompt"),
    ],
)
def test_bad_arguments_are_400_naming_the_parameter(serve, payload, param):
    _, base = serve("lookup")
    response = httpx.post(base + "/completions", json={"model": "tiny", **payload})
    assert response.status_code == 400
    error = error_of(response)
    assert error["type"] == "invalid_request_error" and error["param"] == param, error


def test_error_statuses_through_the_openai_client(serve):
    _, base = serve("lookup", capacity=40)
    api = client(base)
    with pytest.raises(openai.NotFoundError) as info:
        api.completions.create(model="gpt-4", prompt="x")
    assert info.value.body["code"] == "model_not_found" and info.value.body["param"] == "model"
    with pytest.raises(openai.BadRequestError) as info:
        api.completions.create(model="tiny", prompt=[5] * 40, max_tokens=1)
    assert (
        info.value.body["code"] == "context_length_exceeded"
        and info.value.body["param"] == "prompt"
    )
    with pytest.raises(openai.BadRequestError) as info:
        api.chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": "daba " * 40}]
        )
    assert info.value.body["param"] == "messages"
    with pytest.raises(openai.BadRequestError) as info:
        api.completions.create(model="tiny", prompt=[5] * 30, max_tokens=11)
    assert info.value.body["param"] == "max_tokens" and "at most 10" in info.value.body["message"]
    with pytest.raises(openai.BadRequestError) as info:
        api.chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": "x"}], temperature=-0.5
        )
    assert info.value.body["param"] == "temperature"
    with pytest.raises(openai.BadRequestError):
        api.chat.completions.create(model="tiny", messages=[], max_tokens=3)
    # chat without max_tokens gets what the context leaves
    assert (
        api.chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": "daba"}], temperature=0
        ).usage.total_tokens
        == 40
    )


def test_malformed_json_and_unknown_routes(serve):
    _, base = serve("lookup")
    for body in (b"{not json", b"[1, 2]", b"\xff\xfe"):
        response = httpx.post(
            base + "/chat/completions", content=body, headers={"content-type": "application/json"}
        )
        assert response.status_code == 400 and error_of(response)["type"] == "invalid_request_error"
    assert httpx.get(base + "/nothing").status_code == 404
    assert httpx.get(base + "/completions").status_code == 405


def test_models_and_health(serve):
    server, base = serve("lookup")
    models = client(base).models.list()
    assert [m.id for m in models.data] == ["tiny"]
    health = httpx.get(base.removesuffix("/v1") + "/health")
    assert health.status_code == 200 and health.json()["status"] == "ok"


def test_a_full_queue_is_429_with_retry_after(serve, gate, wait_for):
    server, base = serve(gate, slots=1, max_queue=1)
    gate.open.clear()
    results = {}

    def post(name, tokens):
        results[name] = httpx.post(
            base + "/completions",
            json={"model": "tiny", "prompt": tokens, "max_tokens": 3, "temperature": 0},
            timeout=60,
        )

    first = threading.Thread(target=post, args=("first", [5]))
    first.start()
    assert gate.proposing.wait(10)
    second = threading.Thread(target=post, args=("second", [6]))
    second.start()
    assert wait_for(lambda: server.engine.stats()["waiting"] == 1)
    response = httpx.post(
        base + "/completions", json={"model": "tiny", "prompt": [7], "max_tokens": 3}
    )
    assert response.status_code == 429 and response.headers["retry-after"] == "1"
    assert error_of(response)["code"] == "queue_full"
    with pytest.raises(openai.RateLimitError):
        client(base).completions.create(model="tiny", prompt=[7], max_tokens=3)
    gate.open.set()
    first.join(30), second.join(30)
    assert results["first"].status_code == results["second"].status_code == 200
    assert metrics_of(base)["specdec_requests_rejected_total"] == 2


def test_a_client_leaving_mid_stream_cancels_its_request_and_frees_the_slot(
    serve, gate, cancel_asked, wait_for
):
    server, base = serve(gate, slots=1)
    gate.open.clear()
    with httpx.stream(
        "POST",
        base + "/completions",
        json={
            "model": "tiny",
            "prompt": [5, 6],
            "max_tokens": 50,
            "stream": True,
            "temperature": 0,
        },
    ) as response:
        lines = response.iter_lines()
        first = next(line for line in lines if line)
        assert json.loads(first[6:])["choices"][0]["text"]
        assert gate.proposing.wait(10)
        assert metrics_of(base)["specdec_requests_running"] == 1
    # the connection is closed: the server notices and cancels, which frees the slot
    assert cancel_asked.wait(10), "the server did not notice that its client left"
    gate.open.set()
    assert wait_for(
        lambda: (
            metrics_of(base).get('specdec_requests_finished_total{finish_reason=cancelled}') == 1
        )
    )
    metrics = metrics_of(base)
    assert metrics["specdec_slots_free"] == 1 and metrics["specdec_requests_running"] == 0
    assert not server.engine.target.cache.admitted.any()
    assert (
        client(base)
        .completions.create(model="tiny", prompt=[5], max_tokens=2)
        .usage.completion_tokens
        == 2
    )


def test_a_client_leaving_a_plain_request_cancels_it(serve, gate, cancel_asked, wait_for):
    server, base = serve(gate, slots=1)
    gate.open.clear()

    def post():
        try:
            httpx.post(
                base + "/completions",
                json={"model": "tiny", "prompt": [5], "max_tokens": 50},
                timeout=0.5,
            )
        except httpx.TimeoutException:
            pass

    thread = threading.Thread(target=post)
    thread.start()
    assert gate.proposing.wait(10)
    thread.join(10)  # the client gave up and closed its connection
    assert cancel_asked.wait(10), "the server did not notice that its client left"
    gate.open.set()
    assert wait_for(
        lambda: (
            metrics_of(base).get('specdec_requests_finished_total{finish_reason=cancelled}') == 1
        )
    )
    assert metrics_of(base)["specdec_slots_free"] == 1


def test_metrics_report_steps_acceptance_and_latencies(serve):
    _, base = serve("lookup", slots=2)
    api = client(base)
    for prompt in ([5, 6, 5, 6, 5, 6], [7, 8, 9]):
        api.completions.create(model="tiny", prompt=prompt, max_tokens=12, temperature=0)
    metrics = metrics_of(base)
    assert metrics["specdec_requests_finished_total{finish_reason=length}"] == 2
    assert (
        metrics["specdec_generation_tokens_total"] == 24
        and metrics["specdec_prompt_tokens_total"] == 9
    )
    assert metrics["specdec_decode_steps_total"] >= 1 and metrics["specdec_draft_tokens_total"] > 0
    assert (
        0 < metrics["specdec_acceptance_rate"] <= 1 and metrics["specdec_mean_tokens_per_step"] >= 1
    )
    assert metrics["specdec_time_to_first_token_seconds_count"] == 2
    assert metrics["specdec_inter_token_latency_seconds_count"] == 22
    assert metrics["specdec_tokens_per_step_count"] == metrics["specdec_decode_row_steps_total"]
    assert metrics["specdec_slots"] == 2 and metrics["specdec_requests_waiting"] == 0
    # the budgets chosen (every step drafts in the tests: SPECDEC_SPECULATION=always)
    assert (
        metrics["specdec_draft_nodes_per_row_step_count"]
        == metrics["specdec_decode_row_steps_total"]
    )
    assert 0 < metrics["specdec_draft_nodes_total"] <= metrics["specdec_draft_tokens_total"]
    assert metrics["specdec_mean_draft_nodes_per_row_step"] == pytest.approx(
        metrics["specdec_draft_nodes_total"] / metrics["specdec_decode_row_steps_total"]
    )
    assert (
        0 <= metrics["specdec_plain_step_share"] < 1
        and metrics["specdec_prefill_budget_tokens"] >= 1
    )


def test_shutdown_with_drain_finishes_streams_in_flight(serve, gate, wait_for):
    server, base = serve(gate, slots=1)
    gate.open.clear()
    with httpx.stream(
        "POST",
        base + "/completions",
        json={"model": "tiny", "prompt": [5], "max_tokens": 6, "stream": True, "temperature": 0},
    ) as response:
        assert gate.proposing.wait(10)
        stopper = threading.Thread(target=server.stop)
        stopper.start()
        assert wait_for(lambda: server.engine.stats()["closing"])
        # uvicorn may have closed its sockets already: then a new connection is refused, never
        # served
        assert _health_status(base) in (503, None)
        gate.open.set()
        body = response.read().decode()
    stopper.join(30)
    assert body.endswith("data: [DONE]\n\n") and '"finish_reason": "length"' in body
    assert server.engine.closed and not server.engine.target.cache.admitted.any()


def _health_status(base: str) -> int | None:
    """The status of GET /health, or None when the server no longer accepts connections."""
    try:
        return httpx.get(base.removesuffix("/v1") + "/health", timeout=5).status_code
    except httpx.TransportError:
        return None


def test_while_listening_a_closing_engine_makes_health_and_new_requests_503(serve):
    """What a drained shutdown does first (the engine stops taking requests), with the server still
    listening: /health and new requests answer 503, and nothing else is refused meanwhile."""
    server, base = serve("lookup")
    assert _health_status(base) == 200
    server.engine.stop_accepting()
    health = httpx.get(base.removesuffix("/v1") + "/health", timeout=5)
    assert (
        health.status_code == 503
        and health.json()["status"] == "unavailable"
        and health.json()["closing"]
    )
    response = httpx.post(
        base + "/completions", json={"model": "tiny", "prompt": [5], "max_tokens": 2}, timeout=30
    )
    assert response.status_code == 503 and error_of(response)["code"] == "shutting_down"
    assert httpx.get(base + "/models", timeout=5).status_code == 200


def test_shutdown_without_drain_cancels_streams_with_an_error_event(serve, gate):
    said = []
    server, base = serve(gate, slots=1, drain=False, server_options=dict(announce=said.append))
    gate.open.clear()
    with httpx.stream(
        "POST",
        base + "/completions",
        json={"model": "tiny", "prompt": [5], "max_tokens": 40, "stream": True, "temperature": 0},
    ) as response:
        assert gate.proposing.wait(10)
        stopper = threading.Thread(target=server.stop)
        stopper.start()
        time.sleep(0.1)
        gate.open.set()
        body = response.read().decode()
    stopper.join(30)
    events = [json.loads(e[6:]) for e in body.split("\n\n") if e.startswith("data: {")]
    assert events[-1]["error"]["code"] == "cancelled" and body.endswith("data: [DONE]\n\n")
    assert server.engine.closed and not server.engine.target.cache.admitted.any()
    assert said == ["shutting down: cancelling the 1 request(s) in flight"]


def test_serve_command_line(monkeypatch, model_dir):
    """``specdec serve`` builds the engine from its options and serves it
    (the server's run is stubbed)."""
    from specdec.cli import main as cli
    from specdec.serving import server as server_module

    seen = {}

    def fake_run(self):
        seen.update(
            name=self.app.state.model_name,
            slots=self.engine.num_slots,
            context=self.engine.context_length,
            drain=self.drain,
        )
        self.engine.close()

    monkeypatch.setattr(server_module.Server, "run", fake_run)
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
                "3",
                "--capacity",
                "48",
                "--served-model-name",
                "tiny",
                "--no-drain",
            ]
        )
        == 0
    )
    assert seen == {"name": "tiny", "slots": 3, "context": 48, "drain": False}


def test_serve_takes_a_drafter_with_options_and_a_tree_room(monkeypatch, model_dir, capsys):
    from specdec.cli import main as cli
    from specdec.serving import server as server_module

    seen = {}

    def fake_run(self):
        engine = self.engine
        seen.update(length=engine.plan.drafter.draft_length, capacity=engine.target.capacity)
        self.engine.close()

    monkeypatch.setattr(server_module.Server, "run", fake_run)
    common = [
        "serve",
        "--model",
        str(model_dir),
        "--backend",
        "numpy",
        "--slots",
        "1",
        "--capacity",
        "48",
    ]
    assert cli.main([*common, "--drafter", "lookup:k=5", "--tree-room", "5"]) == 0
    assert seen == {"length": 5, "capacity": 53}  # a chain of 5 and its root fill the room
    capsys.readouterr()
    assert cli.main([*common, "--drafter", "lookup:k=6", "--tree-room", "5"]) == 2
    err = capsys.readouterr().err.strip()
    # the start line says what loads; then the error, in one line
    lines = [line for line in err.splitlines() if "loading" not in line]
    assert len(lines) == 1 and "larger tree_room (now 5)" in lines[0], err
    assert cli.main([*common, "--drafter", "lookup:beam_width=2"]) == 2
    lines = [line for line in capsys.readouterr().err.splitlines() if "loading" not in line]
    assert len(lines) == 1 and "does not take option(s) ['beam_width']" in lines[0], lines


def test_a_request_that_fails_is_500_and_an_error_event_while_others_go_on(serve, gate_drafter):
    _, base = serve(gate_drafter(poison=13), slots=2)
    response = httpx.post(
        base + "/completions", json={"model": "tiny", "prompt": [13, 14], "max_tokens": 5}
    )
    assert response.status_code == 500
    error = error_of(response)
    assert (
        error["type"] == "server_error"
        and error["code"] == "request_failed"
        and "poisoned" in error["message"]
    )
    with httpx.stream(
        "POST",
        base + "/completions",
        json={"model": "tiny", "prompt": [13], "max_tokens": 5, "stream": True},
    ) as streamed:
        body = streamed.read().decode()
    events = [json.loads(e[6:]) for e in body.split("\n\n") if e.startswith("data: {")]
    assert events[-1]["error"]["code"] == "request_failed" and body.endswith("data: [DONE]\n\n")
    assert (
        client(base)
        .completions.create(model="tiny", prompt=[5, 6], max_tokens=5)
        .usage.completion_tokens
        == 5
    )
    metrics = metrics_of(base)
    assert (
        metrics["specdec_requests_finished_total{finish_reason=error}"] == 2
        and metrics["specdec_slots_free"] == 2
    )
