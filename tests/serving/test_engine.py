"""specdec.Engine: requests submitted from threads at any time decode exactly as each would
alone; cancellations, stop strings, failures and a full queue touch no other request.

Exact by construction (as tests/core/test_requests.py explains): each request draws from its own
generator, the float64 reference runs every tree row alone, and the drafters compared here are
integer-exact on the host (none, lookup) or greedy (ReDrafter, whose float drafts depend on the
batch but whose greedy output is the target's). The reference answer is ``specdec.generate`` of
the request alone on a one-slot target with the same drafter and seed (its default verifier is
``exact`` for sampled decoding with these drafters, ``greedy`` at temperature 0, which the
engine's ``exact`` equals). The float32 ``numpy32`` example backend is compared the same way:
its rows are computed one by one too.
"""

from __future__ import annotations

import asyncio
import itertools
import threading
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import specdec
from specdec.decode.budget import Speculation, StepBudgets
from specdec.serving.engine import Engine
from specdec.testing import make_random_drafter

SAMPLINGS = [
    dict(temperature=0.0),
    dict(temperature=0.8),
    dict(temperature=1.2, top_k=20),
    dict(temperature=0.9, top_p=0.9),
]


@pytest.fixture(scope="module")
def redrafter(model_dir, tmp_path_factory):
    return make_random_drafter(
        tmp_path_factory.mktemp("engine") / "redrafter", model_dir, kind="redrafter", seed=3
    )


_alone_cache: dict = {}


def alone(model_dir, backend, drafter, prompt, settings_, seed, max_new_tokens):
    """Tokens of the request decoded alone by ``specdec.generate`` (memoised per test session)."""
    key = (
        str(model_dir),
        backend,
        str(drafter),
        tuple(prompt),
        tuple(sorted(settings_.items())),
        seed,
        max_new_tokens,
    )
    if key not in _alone_cache:
        if (str(model_dir), backend) not in _targets:
            _targets[(str(model_dir), backend)] = specdec.load(
                model_dir, backend=backend, slots=1, capacity=96
            )
        target = _targets[(str(model_dir), backend)]
        _alone_cache[key] = specdec.generate(
            target,
            list(prompt),
            drafter=drafter,
            backend=backend,
            max_new_tokens=max_new_tokens,
            seed=seed,
            **settings_,
        ).tokens
    return _alone_cache[key]


_targets: dict = {}

requests = st.fixed_dictionaries(
    {
        "prompt": st.one_of(
            st.lists(st.integers(1, 95), min_size=1, max_size=6),
            st.lists(st.integers(1, 95), min_size=1, max_size=3).map(lambda p: p * 3),
        ),
        "sampling": st.sampled_from(range(len(SAMPLINGS))),
        "seed": st.integers(0, 2**31),
        "max_new_tokens": st.integers(1, 12),
        "delay": st.sampled_from([0.0, 0.0, 0.001, 0.004]),  # seconds before it is submitted
        "cancel_after": st.one_of(
            st.none(), st.none(), st.integers(0, 6)
        ),  # tokens received, then cancel
    }
)


def run_schedule(engine: Engine, schedule: list[dict]) -> list[tuple[list[int], str]]:
    """Submit each request after its delay, from this thread, while a thread per request reads
    its tokens (and cancels it after ``cancel_after`` of them); (tokens, finish reason) of each."""
    out: list = [None] * len(schedule)
    readers = []

    def read(index, handle, cancel_after):
        tokens = []
        if cancel_after == 0:
            handle.cancel()
        for token in handle.tokens(timeout=60):
            tokens.append(token)
            if cancel_after is not None and len(tokens) >= cancel_after:
                handle.cancel()
        out[index] = (tokens, handle.finish_reason)

    for index, item in enumerate(schedule):
        time.sleep(item["delay"])
        handle = engine.submit(
            item["prompt"],
            max_new_tokens=item["max_new_tokens"],
            seed=item["seed"],
            **SAMPLINGS[item["sampling"]],
        )
        reader = threading.Thread(target=read, args=(index, handle, item["cancel_after"]))
        reader.start()
        readers.append(reader)
    for reader in readers:
        reader.join(60)
    return out


def check_against_alone(model_dir, backend, drafter, schedule, results):
    for item, (tokens, reason) in zip(schedule, results, strict=True):
        expected = alone(
            model_dir,
            backend,
            drafter,
            item["prompt"],
            SAMPLINGS[item["sampling"]],
            item["seed"],
            item["max_new_tokens"],
        )
        if reason == "cancelled":
            assert tokens == expected[: len(tokens)], (
                f"cancelled request {item} got tokens decoding alone does not"
            )
        else:
            assert reason in ("length", "stop") and tokens == expected, (
                f"request {item} in schedule {[(i['delay'], i['cancel_after']) for i in schedule]} "
                "differs from decoding it alone"
            )


def engine_settings(fn):
    return settings(
        max_examples=12,
        deadline=None,
        suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    )(fn)


@pytest.mark.parametrize("backend", ["numpy", "numpy32"])
@pytest.mark.parametrize("drafter", ["none", "lookup"])
@engine_settings
@given(
    schedule=st.lists(requests, min_size=1, max_size=6),
    slots=st.integers(1, 3),
    budget=st.sampled_from([None, 4, 512]),
)
def test_each_request_decodes_as_it_would_alone(
    model_dir, backend, drafter, schedule, slots, budget
):
    if backend not in specdec.default_registry().names("backend"):
        pytest.skip(f"the {backend} backend (examples/specdec-example-backend) is not installed")
    target = _targets.setdefault(
        (str(model_dir), backend, slots),
        specdec.load(model_dir, backend=backend, slots=slots, capacity=96),
    )
    with Engine(
        target, drafter=drafter, backend=backend, tree_room=32, max_prefill_tokens=budget
    ) as engine:
        results = run_schedule(engine, schedule)
        check_against_alone(model_dir, backend, drafter, schedule, results)
        assert engine.stats()["free_slots"] == slots and engine.stats()["waiting"] == 0


@engine_settings
@given(
    schedule=st.lists(requests.map(lambda r: {**r, "sampling": 0}), min_size=1, max_size=5),
    slots=st.integers(1, 3),
)
def test_greedy_requests_with_redrafter_decode_as_alone(model_dir, redrafter, schedule, slots):
    target = _targets.setdefault(
        (str(model_dir), "numpy", slots),
        specdec.load(model_dir, backend="numpy", slots=slots, capacity=96),
    )
    with Engine(target, drafter=redrafter, backend="numpy", tree_room=32) as engine:
        results = run_schedule(engine, schedule)
        check_against_alone(model_dir, "numpy", redrafter, schedule, results)
    assert not target.cache.admitted.any()


class DrawnBudgets(Speculation):
    """Tree budgets drawn by Hypothesis (0: plain, None: the whole tree), in turn per row per
    step."""

    def __init__(self, budgets):
        super().__init__("always")
        self.draws = itertools.cycle(budgets)

    def step_budgets(self, request_ids, chunk_tokens=0):
        return StepBudgets({i: next(self.draws) for i in request_ids}, len(request_ids), 0)


@pytest.fixture(scope="module")
def eagle(model_dir, tmp_path_factory):
    return make_random_drafter(
        tmp_path_factory.mktemp("engine") / "eagle", model_dir, kind="eagle", seed=3
    )


@pytest.mark.parametrize("drafter", ["lookup", "redrafter", "eagle"])
@engine_settings
@given(
    schedule=st.lists(requests, min_size=1, max_size=5),
    slots=st.integers(1, 3),
    budgets=st.lists(st.sampled_from([0, 0, 1, 2, 4, None]), min_size=1, max_size=10),
    prefill=st.sampled_from([None, 4, "auto"]),
)
def test_budgets_drawn_by_hypothesis_never_change_a_requests_tokens(
    model_dir, redrafter, eagle, drafter, schedule, slots, budgets, prefill
):
    """Whatever each request drafts in each step (drawn here, mixed with plain rows in one
    forward), greedy and sampled requests get plain decoding's tokens alone: budgets change what
    is verified, never what is accepted (the exact walk's uniforms are keyed by position)."""
    source = {"redrafter": redrafter, "eagle": eagle}.get(drafter, drafter)
    target = _targets.setdefault(
        (str(model_dir), "numpy", slots),
        specdec.load(model_dir, backend="numpy", slots=slots, capacity=96),
    )
    with Engine(
        target,
        drafter=source,
        backend="numpy",
        tree_room=32,
        max_prefill_tokens=prefill,
        speculation=DrawnBudgets(budgets),
    ) as engine:
        results = run_schedule(engine, schedule)
        check_against_alone(model_dir, "numpy", "none", schedule, results)
    assert not target.cache.admitted.any()


def framework_backend(name):
    module = {"torch": "torch", "mlx": "mlx.core"}[name]
    pytest.importorskip(module, reason=f"{name} is not installed")
    if name not in specdec.default_registry().names("backend"):
        pytest.skip(f"the {name} backend is not registered")


@pytest.mark.parametrize("backend", ["torch", "mlx"])
@pytest.mark.parametrize("drafter", ["none", "lookup"])
@settings(
    max_examples=6,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    schedule=st.lists(requests.map(lambda r: {**r, "sampling": 0}), min_size=1, max_size=5),
    budget=st.sampled_from([None, 3]),
)
def test_framework_backends_greedy_requests_decode_as_alone(
    model_dir, backend, drafter, schedule, budget
):
    """torch and mlx in float32: batched rows may round differently from a row alone, so these
    compare greedy decoding (the tiny model's logits are decisive, so the argmax is robust).
    A budget of 3 prompt tokens per step packs prompt chunks beside the trees of running requests.
    The engine loads its target on its own thread, as MLX needs."""
    framework_backend(backend)
    with Engine(
        model_dir,
        drafter=drafter,
        backend=backend,
        slots=3,
        capacity=80,
        tree_room=32,
        dtype="float32",
        max_prefill_tokens=budget,
    ) as engine:
        results = run_schedule(engine, schedule)
        check_against_alone(model_dir, backend, drafter, schedule, results)
        assert engine.stats()["free_slots"] == 3


def test_the_exact_verifier_is_greedy_at_temperature_zero(model_dir, redrafter, make_engine):
    engine = make_engine(redrafter, slots=2)
    prompts = [[5, 6, 7], [8, 9], [10, 11, 10, 11]]
    handles = [engine.submit(p, max_new_tokens=10) for p in prompts]
    for prompt, handle in zip(prompts, handles, strict=True):
        assert list(handle.result(timeout=60).tokens) == alone(
            model_dir, "numpy", redrafter, prompt, {}, None, 10
        )


def test_handles_stream_tokens_text_and_async(make_engine):
    engine = make_engine("lookup")
    handle = engine.submit("daba deba", max_new_tokens=6)
    chunks = list(handle.chunks(timeout=30))
    completion = handle.result()
    assert [t for c in chunks for t in c.tokens] == list(completion.tokens) and len(
        completion.tokens
    ) == 6
    assert (
        "".join(c.text for c in chunks)
        == completion.text
        == " " + engine.tokenizer.decode(list(completion.tokens))
    )
    assert chunks[-1].finish_reason == "length" and all(
        c.finish_reason is None for c in chunks[:-1]
    )
    assert completion.prompt_tokens == 2 and completion.time_to_first_token <= completion.time_total

    async def consume():
        second = engine.submit([5, 6], max_new_tokens=4)
        tokens = [token async for token in second]
        return tokens, await engine.submit([5, 6], max_new_tokens=4).aresult()

    tokens, again = asyncio.run(consume())
    assert tokens == list(again.tokens) and len(tokens) == 4
    assert list(engine.submit([5, 6], max_new_tokens=4)) == tokens


def test_chat_prompts_use_the_chat_template(make_engine):
    engine = make_engine("lookup")
    messages = [{"role": "user", "content": "daba deba"}]
    completion = engine.generate(messages, max_new_tokens=3)
    expected = engine.encode("user daba deba assistant")
    assert completion.prompt_tokens == len(expected) == len(engine.encode(messages))


def test_stop_strings_end_the_request_and_are_not_in_its_text(model_dir, make_engine):
    engine = make_engine("lookup", slots=1)
    full = engine.generate([5, 6, 7], max_new_tokens=12)
    words = full.text.split()
    stop = words[3]
    cut = full.text.index(stop)
    stopped = engine.generate([5, 6, 7], max_new_tokens=12, stop=[stop, "never there"])
    assert stopped.finish_reason == "stop" and stopped.text == full.text[:cut]
    assert (
        list(stopped.tokens) == list(full.tokens[: len(stopped.tokens)])
        and len(stopped.tokens) <= 5
    )
    assert engine.stats()["free_slots"] == 1 and not engine.target.cache.admitted.any()


def test_stop_token_ids_end_the_request_and_are_not_in_its_text(make_engine):
    engine = make_engine("lookup")
    full = engine.generate([5, 6, 7], max_new_tokens=10)
    stop_token = full.tokens[4]
    first = full.tokens.index(stop_token)
    stopped = engine.generate([5, 6, 7], max_new_tokens=10, stop_token_ids=[stop_token])
    assert stopped.tokens == full.tokens[: first + 1] and stopped.finish_reason == "stop"
    assert (
        stopped.text == " " + engine.tokenizer.decode(list(full.tokens[:first]))
        if first
        else stopped.text == ""
    )


def test_cancel_frees_the_slot_at_once_and_the_queue_moves_on(make_engine, gate):
    engine = make_engine(gate, slots=1)
    gate.open.clear()
    first = engine.submit([5, 6], max_new_tokens=40)
    assert gate.proposing.wait(10)
    second = engine.submit([7, 8], max_new_tokens=3)
    third = engine.submit([9], max_new_tokens=3)
    assert engine.stats()["waiting"] == 2 and engine.stats()["running"] == 1
    third.cancel()  # waiting: leaves the queue
    first.cancel()
    gate.open.set()
    assert first.result(timeout=30).finish_reason == "cancelled" and len(first.result().tokens) >= 1
    assert third.result(timeout=30).finish_reason == "cancelled" and third.result().tokens == ()
    assert second.result(timeout=30).finish_reason == "length"
    snapshot = engine.metrics.snapshot()
    assert snapshot["finished"]["cancelled"] == 2 and snapshot["finished"]["length"] == 1
    assert engine.stats() == {
        "slots": 1,
        "running": 0,
        "waiting": 0,
        "free_slots": 1,
        "closing": False,
        "alive": True,
        "step_seconds": 0.0,
    }


def test_a_full_queue_refuses_with_queue_full_error(make_engine, gate):
    engine = make_engine(gate, slots=1, max_queue=2)
    gate.open.clear()
    running = engine.submit([5], max_new_tokens=5)
    assert gate.proposing.wait(10)
    waiting = [engine.submit([6], max_new_tokens=2), engine.submit([7], max_new_tokens=2)]
    with pytest.raises(specdec.QueueFullError, match="max_queue=2"):
        engine.submit([8], max_new_tokens=2)
    gate.open.set()
    assert all(h.result(timeout=30).finish_reason == "length" for h in [running, *waiting])
    assert engine.submit([8], max_new_tokens=2).result(timeout=30).finish_reason == "length"
    assert engine.metrics.snapshot()["counters"]["requests_rejected"] == 1


def test_requests_that_do_not_fit_are_refused_up_front(make_engine):
    engine = make_engine("lookup", capacity=20)
    assert engine.context_length == 20
    with pytest.raises(
        specdec.InvalidInputError, match="the prompt has 20 tokens; this engine's context holds 20"
    ):
        engine.submit([5] * 20, max_new_tokens=1)
    with pytest.raises(specdec.InvalidInputError, match="ask for at most 10"):
        engine.submit([5] * 10, max_new_tokens=11)
    with pytest.raises(specdec.InvalidInputError, match="outside the vocabulary"):
        engine.submit([500], max_new_tokens=1)
    with pytest.raises(specdec.InvalidInputError, match="temperature"):
        engine.submit([5], temperature=-1)
    with pytest.raises(specdec.InvalidInputError, match="Request carries its own settings"):
        engine.submit(specdec.Request(prompt=[5]), temperature=0.5)
    assert engine.generate([5] * 10, max_new_tokens=10).finish_reason == "length"
    assert engine.stats()["waiting"] == 0


def test_a_request_that_fails_late_fails_alone(model_dir, make_engine, gate_drafter):
    """A drafter that raises for one row: the group is run again row by row, so only the row
    holding the poison token fails; the others decode exactly as alone."""
    poison = gate_drafter(poison=13)
    engine = make_engine(poison, slots=3)
    good = [engine.submit(p, max_new_tokens=8) for p in ([5, 6], [7, 8, 9])]
    bad = engine.submit([13, 14], max_new_tokens=8)
    with pytest.raises(specdec.RequestFailedError, match="poisoned row") as info:
        bad.result(timeout=30)
    assert isinstance(info.value.__cause__, RuntimeError) and bad.finish_reason == "error"
    with pytest.raises(specdec.RequestFailedError):
        list(bad)
    for handle, prompt in zip(good, ([5, 6], [7, 8, 9]), strict=True):
        assert list(handle.result(timeout=30).tokens) == alone(
            model_dir, "numpy", "none", prompt, {}, None, 8
        )
    assert engine.stats()["free_slots"] == 3 and not engine.target.cache.admitted.any()
    assert engine.generate([5, 6], max_new_tokens=8).tokens == good[0].result().tokens


def test_an_error_no_request_explains_fails_those_running_and_the_engine_goes_on(
    model_dir, make_engine, gate
):
    engine = make_engine(gate, slots=1)
    gate.open.clear()
    running = engine.submit([5, 6], max_new_tokens=6)
    assert gate.proposing.wait(10)
    waiting = engine.submit([7, 8], max_new_tokens=6)
    real_step = engine._dispatch.decoder.step
    calls = []

    def broken_step(**kwargs):
        if not calls:
            calls.append(1)
            raise MemoryError("the device ran out of memory")
        return real_step(**kwargs)

    engine._dispatch.decoder.step = broken_step  # the next step raises outside any request
    gate.open.set()
    with pytest.raises(specdec.RequestFailedError, match="ran out of memory"):
        running.result(timeout=30)
    # the waiting request had no part in it: it is decoded by the engine's fresh state
    assert list(waiting.result(timeout=30).tokens) == alone(
        model_dir, "numpy", "none", [7, 8], {}, None, 6
    )
    assert engine.metrics.snapshot()["counters"]["engine_resets"] == 1
    assert engine.stats()["free_slots"] == 1 and not engine.target.cache.admitted.any()


def test_an_error_in_the_scheduling_itself_fails_the_waiting_requests_instead_of_looping(
    model_dir, make_engine, monkeypatch
):
    engine = make_engine("none", slots=1)

    def broken(*args, **kwargs):
        raise ValueError("no budget for you")

    monkeypatch.setattr(engine._dispatch.decoder.speculation, "prefill_tokens", broken)
    waiting = engine.submit([7, 8], max_new_tokens=4)
    with pytest.raises(specdec.RequestFailedError, match="no budget for you"):
        waiting.result(timeout=30)  # requeued once (it had no part), then failed: no loop
    assert engine.metrics.snapshot()["counters"]["engine_resets"] == 2
    monkeypatch.undo()  # the scheduling mended: the engine goes on serving
    assert list(engine.generate([7, 8], max_new_tokens=4).tokens) == alone(
        model_dir, "numpy", "none", [7, 8], {}, None, 4
    )


def test_the_target_is_leased_for_the_engines_lifetime(model_dir):
    target = specdec.load(model_dir, backend="numpy", slots=2, capacity=64)
    engine = Engine(target, drafter="lookup", backend="numpy", tree_room=16)
    with pytest.raises(specdec.TargetBusyError):
        specdec.generate(target, [5, 6], drafter="none", backend="numpy", max_new_tokens=2)
    with pytest.raises(specdec.TargetBusyError):
        Engine(target, drafter="lookup", backend="numpy", tree_room=16)
    engine.close()
    assert specdec.generate(
        target, [5, 6], drafter="none", backend="numpy", max_new_tokens=2
    ).tokens


def test_close_drains_or_cancels(make_engine, gate):
    engine = make_engine(gate, slots=1)
    handles = [engine.submit([5 + i], max_new_tokens=4) for i in range(3)]
    engine.close(drain=True)
    assert [h.finish_reason for h in handles] == ["length"] * 3
    with pytest.raises(specdec.EngineClosedError):
        engine.submit([5])

    engine = make_engine(gate, slots=1)
    gate.open.clear()
    handles = [engine.submit([5 + i], max_new_tokens=40) for i in range(3)]
    assert gate.proposing.wait(10)
    closer = threading.Thread(target=engine.close, kwargs={"drain": False})
    closer.start()
    time.sleep(0.05)
    gate.open.set()
    closer.join(30)
    assert [h.finish_reason for h in handles] == ["cancelled"] * 3
    assert not engine.target.cache.admitted.any() and engine.closed


def test_decoder_prefill_budget_admits_prompts_up_to_the_budget(model_dir):
    from specdec.decode.loop import Decoder
    from specdec.generation.api import prepare

    target = specdec.load(model_dir, backend="numpy", slots=4, capacity=64)
    plan, *_ = prepare(
        target,
        [1],
        "none",
        "numpy",
        max_new_tokens=1,
        temperature=0.0,
        top_k=None,
        top_p=None,
        dtype=None,
        device=None,
        registry=None,
        options={},
    )
    decoder = Decoder(plan)
    for prompt in ([1] * 20, [2] * 5, [3] * 5, [4] * 3):
        decoder.submit(specdec.Request(prompt=prompt, max_new_tokens=3))
    admitted = []
    while not decoder.idle:
        for result in decoder.step(max_prefill_tokens=10):
            if result.is_prefill:
                admitted.append(list(result.requests))
    decoder.close()
    # prompts that fit the budget whole go first (5 + 5), then the 3 and the long prompt's first
    # chunk of 7; the long one (20) finishes two steps later: a short prompt never waits behind it
    assert admitted == [[1, 2], [3], [0]]


def test_an_engine_from_a_plan(model_dir):
    from specdec.generation.api import prepare

    target = specdec.load(model_dir, backend="numpy", slots=2, capacity=80)
    plan, *_ = prepare(
        target,
        [1],
        "lookup",
        "numpy",
        max_new_tokens=1,
        temperature=0.0,
        top_k=None,
        top_p=None,
        dtype=None,
        device=None,
        registry=None,
        options={"verifier": "exact"},
    )
    with Engine.from_plan(plan, tree_room=16, max_new_tokens=5) as engine:
        assert engine.context_length == 64
        completion = engine.generate([5, 6, 7], temperature=0.8, seed=9)
        assert len(completion.tokens) == 5
    assert list(completion.tokens) == alone(
        model_dir, "numpy", "lookup", [5, 6, 7], dict(temperature=0.8), 9, 5
    )


def test_bad_engine_settings_are_refused(model_dir):
    for settings_, match in (
        ({"max_queue": -1}, "max_queue"),
        ({"max_prefill_tokens": 0}, "max_prefill_tokens"),
        ({"capacity": 1}, "capacity"),
        ({"tree_room": 200}, "no room"),
    ):
        with pytest.raises(specdec.InvalidInputError, match=match):
            Engine(
                model_dir, drafter="none", backend="numpy", slots=1, **{"capacity": 64, **settings_}
            ) if "tree_room" not in settings_ else Engine(
                specdec.load(model_dir, backend="numpy", capacity=64),
                drafter="none",
                backend="numpy",
                **settings_,
            )


EXITING_SCRIPT = """
import sys
import specdec
engine = specdec.Engine(
    sys.argv[1], drafter="none", backend=sys.argv[2], slots=2, capacity=512, max_new_tokens=400
)
handle = engine.submit([1, 2, 3], max_new_tokens=400)
next(iter(handle))
raise RuntimeError("the script fails before closing the engine")
"""


@pytest.mark.parametrize("backend", ["numpy", "torch"])
def test_a_script_that_exits_with_an_engine_running_exits_cleanly(model_dir, backend, tmp_path):
    """An engine left running when the interpreter exits is cancelled first: the process ends with
    the script's own error, not an abort from a framework torn down under the scheduler thread.
    (Not mlx: a process whose engine ran MLX on its thread can abort at exit even after a clean
    close, docs/serving.md "Limits".)"""
    import subprocess
    import sys

    if backend != "numpy":
        framework_backend(backend)
    script = tmp_path / "exits.py"
    script.write_text(EXITING_SCRIPT)
    done = subprocess.run(
        [sys.executable, str(script), str(model_dir), backend],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 1, done.stderr[-2000:]
    assert "the script fails before closing the engine" in done.stderr
    assert "terminate called" not in done.stderr


@pytest.fixture(scope="module")
def wide_model(tmp_path_factory):
    """Heads of 64 and four layers: wide enough that bfloat16 rows round differently with the
    rows beside them unless the target runs in exact mode."""
    from specdec.testing import make_random_model

    return make_random_model(
        tmp_path_factory.mktemp("engine-exact") / "llama",
        vocab_size=96,
        hidden_size=256,
        intermediate_size=768,
        num_layers=4,
        num_heads=4,
        num_kv_heads=2,
        seed=4,
    )


@pytest.mark.parametrize("backend", ["torch", "mlx"])
@pytest.mark.parametrize("drafter", ["none", "lookup"])
@settings(
    max_examples=6,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(schedule=st.lists(requests, min_size=1, max_size=5), budget=st.sampled_from([None, 3]))
def test_bfloat16_requests_decode_bit_for_bit_as_alone(
    wide_model, backend, drafter, schedule, budget
):
    """torch and mlx in bfloat16, exact mode: a request's tokens, greedy or sampled with its seed,
    are those of decoding it alone, however the schedule packs its rows and prompt chunks (exact
    equality, where this machine's kernels pass exact mode's self-test)."""
    framework_backend(backend)
    key = (str(wide_model), backend)
    if key not in _targets:
        probe = specdec.load(
            wide_model, backend=backend, dtype="bfloat16", slots=1, capacity=96, exact=False
        )
        check = probe.check_row_invariance()
        if not check.holds:
            pytest.skip(f"exact mode does not hold on this machine: {check.failed}")
        probe.exact = True
        _targets[key] = probe
    with Engine(
        wide_model,
        drafter=drafter,
        backend=backend,
        slots=3,
        capacity=80,
        tree_room=16,
        dtype="bfloat16",
        exact=True,
        max_prefill_tokens=budget,
    ) as engine:
        assert engine.target.exact
        results = run_schedule(engine, schedule)
        check_against_alone(wide_model, backend, drafter, schedule, results)


@pytest.mark.parametrize(
    "arguments, named",
    [
        ({"stop": 5}, "stop must be a string"),
        ({"stop": ["ok", 3]}, "stop must be a string"),
        ({"stop_token_ids": [1.5]}, "stop_token_ids must hold token ids"),
        ({"stop_token_ids": [True]}, "stop_token_ids must hold token ids"),
        ({"stop_token_ids": [-1]}, "stop_token_ids must hold token ids"),
        ({"stop_token_ids": 7}, "stop_token_ids must be a list"),
    ],
)
def test_submit_refuses_bad_stops_naming_the_argument(make_engine, arguments, named):
    engine = make_engine("none", slots=1)
    with pytest.raises(specdec.InvalidInputError, match=named):
        engine.submit([1, 2, 3], max_new_tokens=2, **arguments)
