"""Every damaged or hostile file a command reads, and every JSON argument, is refused in one line
on stderr that names it: never a traceback, never a hang. One test per class of input, each over
several inputs of its class: JSON nested deeper than Python's parser goes, a tokenizer_config.json
that is not a JSON object, a float where config.json needs an integer, safetensors whose tensors
overlap or leave gaps, damaged GGUF files, torch pickles that the safe unpickler refuses, a
published layout's config value of the wrong type."""

from __future__ import annotations

import importlib.util
import json
import shutil
import struct
from pathlib import Path

import pytest

from specdec.cli.main import main
from specdec.plugins.export import export
from specdec.testing import make_random_drafter
from specdec.testing.hostile import GGUF_CASES, hostile_ggufs

DEEP = "[" * 100_000 + "]" * 100_000  # deeper than Python's JSON parser recurses


def one_line(capsys, argv) -> str:
    """Run the command; its error is one line on stderr, exit 2, no traceback."""
    code = main([str(a) for a in argv])
    captured = capsys.readouterr()
    err = captured.err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and err.startswith("specdec: error: "), (
        code,
        err[-3000:],
    )
    assert "Traceback" not in captured.out + captured.err
    return err


def generate(model, *extra, drafter="none", backend="numpy"):
    return [
        "generate",
        "--model",
        model,
        "--prompt-ids",
        "[1, 2, 3]",
        "--drafter",
        drafter,
        "--backend",
        backend,
        "--max-new-tokens",
        "2",
        *extra,
    ]


def copy(folder: Path, to: Path) -> Path:
    shutil.copytree(folder, to)
    return to


@pytest.fixture(scope="module")
def drafters(model_dir, tmp_path_factory):
    root = tmp_path_factory.mktemp("drafters")
    return {
        kind: make_random_drafter(root / kind, model_dir, kind=kind, seed=1)
        for kind in ("redrafter", "medusa", "eagle3")
    }


def _deep_model_file(name):
    def case(model_dir, drafters, tmp_path):
        model = copy(model_dir, tmp_path / "model")
        (model / name).write_text(DEEP)
        return generate(model), str(model / name)

    return case


def _deep_drafter_config(kind):
    def case(model_dir, drafters, tmp_path):
        drafter = copy(drafters[kind], tmp_path / kind)
        (drafter / "config.json").write_text(DEEP)
        return generate(model_dir, drafter=drafter), str(drafter / "config.json")

    return case


def _deep_medusa_choices(model_dir, drafters, tmp_path):
    argv = ["export", drafters["medusa"], "--format", "fasterdecoding", "--out", tmp_path / "out"]
    return [*argv, "--medusa-choices", DEEP], "--medusa-choices"


def _deep_prompt_ids(model_dir, drafters, tmp_path):
    argv = generate(model_dir)
    argv[argv.index("--prompt-ids") + 1] = DEEP
    return argv, "--prompt-ids"


def _deep_prompt_file(model_dir, drafters, tmp_path):
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text('{"prompt": "hi"}\n' + DEEP + "\n")
    argv = ["bench", "--model", model_dir, "--prompts", prompts, "--methods", "plain"]
    return [*argv, "--backends", "numpy", "--out", tmp_path / "bench"], f"{prompts} line 2"


DEEP_JSON = {
    "model config.json": _deep_model_file("config.json"),
    "tokenizer_config.json": _deep_model_file("tokenizer_config.json"),
    "redrafter config.json": _deep_drafter_config("redrafter"),
    "medusa config.json": _deep_drafter_config("medusa"),
    "eagle3 config.json": _deep_drafter_config("eagle3"),
    "--medusa-choices": _deep_medusa_choices,
    "--prompt-ids": _deep_prompt_ids,
    "a bench prompt file": _deep_prompt_file,
}


@pytest.mark.parametrize("case", sorted(DEEP_JSON))
def test_json_nested_too_deep_is_one_line_naming_where(model_dir, drafters, tmp_path, capsys, case):
    argv, named = DEEP_JSON[case](model_dir, drafters, tmp_path)
    err = one_line(capsys, argv)
    assert named in err and "not valid JSON" in err, err


@pytest.mark.parametrize(
    "content",
    [b"{not json", b"[1, 2]", b'"a string"', b"\xff\xfe{\x00", DEEP.encode()],
    ids=["not JSON", "a list", "a string", "not UTF-8", "nested too deep"],
)
def test_a_tokenizer_config_that_is_not_a_json_object_is_named(
    model_dir, tmp_path, capsys, content
):
    model = copy(model_dir, tmp_path / "model")
    (model / "chat_template.jinja").unlink()  # the template is then read from tokenizer_config
    (model / "tokenizer_config.json").write_bytes(content)
    err = one_line(capsys, generate(model))
    assert f"tokenizer config {model / 'tokenizer_config.json'}" in err, err


BACKENDS = ["numpy"] + (["torch"] if importlib.util.find_spec("torch") else [])


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize(
    "key",
    [
        "hidden_size",
        "intermediate_size",
        "num_hidden_layers",
        "num_attention_heads",
        "num_key_value_heads",
        "max_position_embeddings",
    ],
)
def test_a_float_where_config_json_needs_an_integer_is_named(
    model_dir, tmp_path, capsys, backend, key
):
    """The same number as a float (32.0 for 32): refused naming the key, on every backend, not
    run silently by one and failing in its framework on another."""
    model = copy(model_dir, tmp_path / "model")
    config = json.loads((model / "config.json").read_text())
    config[key] = float(config[key])
    (model / "config.json").write_text(json.dumps(config))
    err = one_line(capsys, generate(model, backend=backend))
    assert f"{key} must be an integer, got {config[key]!r}" in err, err
    assert str(model / "config.json") in err, err


def _respan(weights: Path, change) -> None:
    """Rewrite a safetensors file's header after ``change(header, data) -> data``."""
    raw = weights.read_bytes()
    (size,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8 : 8 + size])
    data = change(header, raw[8 + size :])
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    weights.write_bytes(struct.pack("<Q", len(text)) + text + data)


def _tensors(header):
    return sorted(
        (name for name in header if name != "__metadata__"),
        key=lambda name: header[name]["data_offsets"][0],
    )


def _overlap(header, data):
    first, second = _tensors(header)[:2]
    start = header[first]["data_offsets"][0]
    length = header[second]["data_offsets"][1] - header[second]["data_offsets"][0]
    header[second]["data_offsets"] = [start, start + length]
    return data


def _gap(header, data):
    for name in _tensors(header)[1:]:
        header[name]["data_offsets"] = [n + 4 for n in header[name]["data_offsets"]]
    return data + bytes(4)


def _longer_than_its_shape(header, data):
    *_, last = _tensors(header)
    header[last]["data_offsets"][1] += 4
    return data + bytes(4)


@pytest.mark.parametrize("where", ["model", "drafter", "import"])
@pytest.mark.parametrize(
    "change",
    [_overlap, _gap, _longer_than_its_shape],
    ids=["two tensors overlap", "a gap between tensors", "a range longer than its shape"],
)
def test_safetensors_whose_ranges_do_not_tile_the_data_are_damaged(
    model_dir, drafters, tmp_path, capsys, where, change
):
    if where == "model":
        model = copy(model_dir, tmp_path / "model")
        weights, argv = model / "model.safetensors", generate(model)
    else:
        drafter = copy(drafters["redrafter"], tmp_path / "drafter")
        weights = drafter / "model.safetensors"
        argv = (
            generate(model_dir, drafter=drafter)
            if where == "drafter"
            else ["import", drafter, "--out", tmp_path / "out"]
        )
    _respan(weights, change)
    err = one_line(capsys, argv)
    assert f"weights file {weights} is damaged" in err, err


@pytest.fixture(scope="module")
def sound_gguf(tmp_path_factory):
    gguf = pytest.importorskip("gguf", reason="writing a GGUF file needs the 'hf' extra")
    import numpy as np

    path = tmp_path_factory.mktemp("gguf") / "sound.gguf"
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_block_count(1)
    writer.add_token_list(["<s>", "a", "b"])
    writer.add_tensor("token_embd.weight", np.arange(12, dtype=np.float32).reshape(3, 4))
    writer.add_tensor("output_norm.weight", np.ones(4, dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    from specdec.models.gguf_header import check_gguf

    check_gguf(path)  # sound: accepted
    return path


@pytest.mark.parametrize("given_as", ["model", "drafter"])
@pytest.mark.parametrize("case", sorted(GGUF_CASES))
def test_a_damaged_gguf_file_is_one_line_naming_it(
    model_dir, sound_gguf, tmp_path, capsys, monkeypatch, given_as, case
):
    """Checked before any GGUF reader trusts its counts and sizes (which hang or allocate by
    them), whether it is the target (converted once) or a drafter head."""
    monkeypatch.setenv("SPECDEC_CACHE", str(tmp_path / "cache"))
    file = hostile_ggufs(sound_gguf, tmp_path / "damaged")[case]
    argv = generate(file) if given_as == "model" else generate(model_dir, drafter=file)
    err = one_line(capsys, argv)
    assert f"GGUF file {file} is damaged" in err or f"{file} is not a GGUF file" in err, err


class _RunsCode:
    """Pickled as a call of ``Path.touch``: loading it unsafely would create ``marker``."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (Path.touch, (self.marker,))


LAYOUTS = {  # drafter, layout: the torch file it may hold in place of safetensors
    "medusa": ("fasterdecoding", "medusa_lm_head.safetensors", "medusa_lm_head.pt"),
    "redrafter": ("apple", "model.safetensors", "model.pt"),
    "eagle3": ("specforge", "model.safetensors", "pytorch_model.bin"),
}


@pytest.mark.parametrize("kind", sorted(LAYOUTS))
@pytest.mark.parametrize("payload", ["code", "garbage", "empty", "a list"])
def test_a_torch_pickle_the_safe_unpickler_refuses_is_named_without_an_unsafe_hint(
    model_dir, drafters, tmp_path, capsys, kind, payload
):
    torch = pytest.importorskip("torch", reason="writing a torch file needs torch")
    layout, safetensors, pickled = LAYOUTS[kind]
    folder = export(drafters[kind], layout, tmp_path / "published", model=model_dir).path
    (folder / safetensors).unlink()
    marker = tmp_path / "code-ran"
    if payload == "code":
        torch.save({"weight": _RunsCode(marker)}, folder / pickled)
    elif payload == "a list":
        torch.save([torch.zeros(2)], folder / pickled)
    else:
        (folder / pickled).write_bytes(b"not a pickle" if payload == "garbage" else b"")
    err = one_line(capsys, ["import", folder, "--out", tmp_path / "out"])
    assert str(folder / pickled) in err and "weights_only" not in err, err
    assert not marker.exists() and not (tmp_path / "out").exists()


@pytest.mark.parametrize("command", ["generate", "import"])
@pytest.mark.parametrize("value", ["one", [1], None, {"layers": 1}])
def test_a_config_value_a_layout_cannot_read_is_one_line_naming_the_folder(
    model_dir, drafters, tmp_path, capsys, command, value
):
    """A published layout's config.json with a value of the wrong type where the layout is told
    apart from the others (SpecForge's num_hidden_layers)."""
    folder = export(drafters["eagle3"], "specforge", tmp_path / "published", model=model_dir).path
    config = json.loads((folder / "config.json").read_text())
    config["num_hidden_layers"] = value
    (folder / "config.json").write_text(json.dumps(config))
    argv = (
        generate(model_dir, drafter=folder)
        if command == "generate"
        else ["import", folder, "--out", tmp_path / "out"]
    )
    err = one_line(capsys, argv)
    assert f"drafter checkpoint {folder} could not be read" in err, err
