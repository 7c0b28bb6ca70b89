"""Each request's speculation: ``Completion.steps``, ``drafted_tokens``, ``accepted_tokens`` and
``tokens_per_step``, and the server's ``usage["speculation"]`` (plain and streamed replies).

Greedy requests on the numpy reference with ``speculation="always"``: the random target repeats
its last token, so prompt lookup drafts and the target accepts. Every token but the first (from
the prompt's forward) comes from a decode step, one of the target's own per step plus the
accepted drafted tokens kept: ``completion_tokens == 1 + steps + accepted_tokens``, whatever
ends the request (its length, a stop string cutting a step short).
"""

from __future__ import annotations

import json

import httpx

PROMPTS = ([1, 2, 3], [4, 5], [6, 7, 8, 6, 7], [9])


def consistent(completion):
    steps, accepted = completion.steps, completion.accepted_tokens
    assert 0 <= completion.drafting_steps <= steps, completion
    assert completion.completion_tokens == 1 + steps + accepted, completion
    assert 0 <= accepted <= completion.drafted_tokens, completion
    assert completion.tokens_per_step == (steps + accepted) / steps
    # every step that did not draft, counted once by why
    assert sum(completion.plain_reasons.values()) == steps - completion.drafting_steps, completion


def test_speculative_requests_count_their_steps_and_accepted_tokens(make_engine):
    engine = make_engine("lookup", slots=2, speculation="always")
    handles = [engine.submit(p, max_new_tokens=n) for p, n in zip(PROMPTS, (20, 13, 9, 17))]
    completions = [h.result(timeout=60) for h in handles]
    for completion in completions:
        consistent(completion)
    assert sum(c.accepted_tokens for c in completions) > 0, "lookup drafted and the target accepted"
    assert any(c.tokens_per_step > 1 for c in completions)
    counters = engine.metrics.snapshot()["counters"]
    # the engine's counters sum the same rows: every step of every request, every drafted token
    assert sum(c.steps for c in completions) == counters["decode_row_steps"]
    assert sum(c.drafted_tokens for c in completions) == counters["draft_tokens"]
    # the counter also counts accepted tokens that a request's end cut
    assert sum(c.accepted_tokens for c in completions) <= counters["accepted_tokens"]


def test_plain_decoding_takes_a_step_per_token(make_engine):
    engine = make_engine("none", slots=2, speculation="always")
    completion = engine.generate([1, 2, 3], max_new_tokens=7)
    assert (completion.steps, completion.drafted_tokens, completion.accepted_tokens) == (6, 0, 0)
    assert completion.drafting_steps == 0
    assert completion.plain_reasons == {"no draft": 6}  # "always", but the drafter drafts nothing
    assert completion.tokens_per_step == 1.0
    one = engine.generate([1, 2, 3], max_new_tokens=1)  # its token comes from the prompt's forward
    assert (one.steps, one.completion_tokens, one.tokens_per_step) == (0, 1, 0.0)


def test_a_stop_string_keeps_the_counts_consistent(make_engine):
    engine = make_engine("lookup", slots=1, speculation="always")
    completion = engine.generate([1, 2, 3], max_new_tokens=40, stop="goba")  # its second token
    assert completion.finish_reason == "stop" and completion.completion_tokens == 2
    consistent(completion)


def test_the_server_reports_speculation_in_usage(serve):
    _, base = serve("lookup", speculation="always")
    body = {"model": "tiny", "prompt": [1, 2, 3], "max_tokens": 20, "temperature": 0}
    usage = httpx.post(base + "/completions", json=body, timeout=60).json()["usage"]
    speculation = usage["speculation"]
    assert set(speculation) == {
        "steps",
        "drafting_steps",
        "drafted_tokens",
        "accepted_tokens",
        "plain_reasons",
    }
    assert 0 < speculation["drafting_steps"] <= speculation["steps"]  # "always": it drafted
    plain = speculation["steps"] - speculation["drafting_steps"]
    assert sum(speculation["plain_reasons"].values()) == plain
    assert usage["completion_tokens"] == 1 + speculation["steps"] + speculation["accepted_tokens"]
    assert 0 < speculation["accepted_tokens"] <= speculation["drafted_tokens"]
    events = []
    with httpx.stream(
        "POST",
        base + "/completions",
        timeout=60,
        json={**body, "stream": True, "stream_options": {"include_usage": True}},
    ) as response:
        events = [line[6:] for line in response.iter_lines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    last = json.loads(events[-2])
    assert last["choices"] == [] and last["usage"] == usage, "the same request, the same counts"
    chat = httpx.post(
        base + "/chat/completions",
        timeout=60,
        json={
            "model": "tiny",
            "messages": [{"role": "user", "content": "daba deba"}],
            "max_tokens": 6,
            "temperature": 0,
        },
    ).json()["usage"]
    counts = chat["speculation"]
    assert chat["completion_tokens"] == 1 + counts["steps"] + counts["accepted_tokens"]
