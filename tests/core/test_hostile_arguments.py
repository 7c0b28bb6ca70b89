"""Every argument out of its domain is refused up front by a SpecdecError naming the argument,
through the Python API (``generate``, ``stream``, ``load``, ``Engine``) and the command line
(one line on stderr): never a raw exception, a misleading message, or a silent run. One test per
class of argument, each over several values of its class."""

from __future__ import annotations

import importlib.util
import os

import numpy as np
import pytest

import specdec
from specdec.cli.main import main
from specdec.decode.requests import Request
from specdec.serving.engine import Engine
from specdec.testing import make_random_drafter


def one_line(capsys, argv) -> str:
    code = main([str(a) for a in argv])
    captured = capsys.readouterr()
    err = captured.err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and err.startswith("specdec: error: "), (
        code,
        err[-3000:],
    )
    return err


def run_generate(target, prompt, **options):
    return specdec.generate(
        target, prompt, drafter="none", backend="numpy", max_new_tokens=2, **options
    )


def run_stream(target, prompt, **options):
    return list(
        specdec.stream(target, prompt, drafter="none", backend="numpy", max_new_tokens=2, **options)
    )


@pytest.fixture(scope="module")
def engine(model_dir):
    with Engine(model_dir, drafter="none", backend="numpy", slots=2, max_new_tokens=2) as running:
        yield running


@pytest.mark.parametrize("how", ["generate", "stream", "engine"])
@pytest.mark.parametrize(
    "prompt, where",
    [
        ("hi\udcff", "the prompt holds '\\udcff' at character 2"),
        ("\ud800 there", "the prompt holds '\\ud800' at character 0"),
        ([{"role": "user", "content": "a\udcffb"}], "the prompt (the rendered chat) holds"),
    ],
    ids=["an escaped byte", "a lone high surrogate", "in a chat message"],
)
def test_a_lone_surrogate_in_a_text_prompt_is_refused(target, engine, how, prompt, where):
    with pytest.raises(specdec.InvalidInputError, match=r"lone surrogate") as refused:
        if how == "engine":
            engine.generate(prompt, max_new_tokens=2)
        else:
            {"generate": run_generate, "stream": run_stream}[how](target, prompt)
    assert where in str(refused.value)


@pytest.mark.parametrize("raw", [b"hi \xff", b"caf\xe9", b"\xc3(", b"\xed\xa0\x80"])
@pytest.mark.parametrize("chat", [False, True])
def test_a_prompt_byte_that_is_not_utf8_on_the_command_line_is_one_line(
    model_dir, capsys, raw, chat
):
    """As Python hands argv over: bytes that are not UTF-8 become lone surrogates."""
    text = os.fsdecode(raw)
    argv = ["generate", "--model", model_dir, "--prompt", text, "--drafter", "none"]
    err = one_line(capsys, [*argv, "--backend", "numpy", *(["--chat"] if chat else [])])
    assert "--prompt is not UTF-8 text: byte 0x" in err, err


needs_torch = pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="needs torch")


@needs_torch
@pytest.mark.parametrize("device", ["meta", "meta:0", "hpu", "not-a-device"])
def test_a_device_the_torch_backend_does_not_run_on_is_refused(model_dir, capsys, device):
    with pytest.raises(specdec.InvalidInputError, match="is not a device the torch backend runs"):
        specdec.load(model_dir, backend="torch", device=device, dtype="float32")
    argv = ["generate", "--model", model_dir, "--prompt-ids", "[1, 2]", "--drafter", "none"]
    err = one_line(capsys, [*argv, "--backend", "torch", "--device", device])
    assert f"device={device!r} is not a device the torch backend runs on" in err, err


@pytest.mark.parametrize("port", ["99999", "65536", "-1", "http"])
def test_a_serve_port_out_of_range_is_an_argument_error(tmp_path, capsys, port):
    with pytest.raises(SystemExit) as exited:
        main(["serve", "--model", str(tmp_path / "no-model"), "--port", port])
    err = capsys.readouterr().err
    assert exited.value.code == 2 and "argument --port: expected a TCP port" in err, err
    assert "Traceback" not in err


BACKENDS = ["numpy"] + (["torch"] if importlib.util.find_spec("torch") else [])


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize(
    "sizes",
    [{"capacity": 10**12}, {"slots": 10**9}, {"slots": 10**5, "capacity": 10**6}],
    ids=["capacity", "slots", "both"],
)
def test_a_kv_cache_that_cannot_fit_memory_is_refused_naming_its_size(model_dir, backend, sizes):
    with pytest.raises(
        specdec.InvalidInputError, match=r"need a KV cache of \d+ bytes .*more than"
    ) as refused:
        specdec.load(
            model_dir, backend=backend, dtype="float32" if backend != "numpy" else None, **sizes
        )
    for name, value in sizes.items():
        assert f"{name}={value}" in str(refused.value)


def test_numpy_arrays_of_token_ids_are_prompts(target):
    one = run_generate(target, np.array([1, 2, 3], dtype=np.int32))
    assert one.tokens == run_generate(target, [1, 2, 3]).tokens
    batch = run_generate(target, np.array([[1, 2, 3], [4, 5, 6]]))
    assert batch.tokens == run_generate(target, [[1, 2, 3], [4, 5, 6]]).tokens
    rows = run_generate(target, [np.array([1, 2, 3]), np.array([4, 5])])
    assert rows.tokens == run_generate(target, [[1, 2, 3], [4, 5]]).tokens


@pytest.mark.parametrize(
    "prompt, message",
    [
        (
            np.array([1.0, 2.0]),
            "the prompt is a NumPy array of float64: token ids must be integers",
        ),
        (np.array(["a", "b"]), "the prompt is a NumPy array of <U1"),
        (np.array(3), r"the prompt is a NumPy array of shape \(\): give token ids as a 1-D"),
        (np.zeros((1, 2, 2), dtype=int), r"a NumPy array of shape \(1, 2, 2\)"),
        (np.zeros(0, dtype=int), "the prompt is empty"),
        ([np.array([1, 2]), np.array([0.5])], "prompt 1 of the batch is a NumPy array of float64"),
    ],
    ids=["floats", "strings", "0-d", "3-d", "empty", "a float row"],
)
def test_numpy_arrays_that_are_not_token_ids_are_refused_saying_why(target, prompt, message):
    with pytest.raises(specdec.InvalidInputError, match=message):
        run_generate(target, prompt)


@pytest.fixture(scope="module")
def drafters(model_dir, tmp_path_factory):
    root = tmp_path_factory.mktemp("drafters")
    return {
        kind: make_random_drafter(root / kind, model_dir, kind=kind, seed=1)
        for kind in ("redrafter", "medusa")
    }


@pytest.mark.parametrize(
    "kind, option, value",
    [
        ("redrafter", "beam_width", -1),
        ("redrafter", "beam_width", 2.5),
        ("redrafter", "beam_width", "2"),
        ("redrafter", "beam_length", 1),
        ("redrafter", "sample", "no"),
        ("medusa", "top_t", 2.5),
        ("medusa", "top_t", 0),
    ],
)
def test_a_drafter_option_of_the_wrong_type_or_range_is_named(
    target, drafters, capsys, kind, option, value
):
    """Blamed on the argument given, not on the checkpoint's config.json, and never run with."""
    with pytest.raises(specdec.InvalidInputError) as refused:
        specdec.generate(
            target,
            [1, 2],
            drafter=drafters[kind],
            backend="numpy",
            max_new_tokens=2,
            **{option: value},
        )
    message = str(refused.value)
    assert f"{option}" in message and repr(value) in message, message
    assert "config.json" not in message, message


@pytest.mark.parametrize("value", ["no", 1, None, "False"])
def test_stop_at_eos_takes_a_bool(target, value):
    with pytest.raises(specdec.InvalidInputError, match="stop_at_eos must be True or False"):
        run_generate(target, [1, 2], stop_at_eos=value)


@pytest.mark.parametrize("ids", [[-1], [3, -7], 5, "3", [1.5], [True]])
def test_stop_token_ids_must_be_token_ids(engine, ids):
    with pytest.raises(specdec.InvalidInputError, match="stop_token_ids must be a list of token"):
        Request(prompt=[1, 2], max_new_tokens=2, stop_token_ids=ids)
    if isinstance(ids, list) and all(type(i) is int for i in ids):  # through the engine
        with pytest.raises(specdec.InvalidInputError, match="stop_token_ids"):
            engine.generate([1, 2], max_new_tokens=2, stop_token_ids=ids)
