"""EAGLE-3 in llama.cpp's GGUF (docs/scale-out.md), pinned to ggml-org/llama.cpp @ 0274f0fc:
a file written here by hand from upstream's names (``conversion/llama.py``: q/k rows permuted by
``LlamaModel.permute``, ``hidden_norm`` as ``blk.0.attn_norm_2``, ``d2t`` as absolute target
ids, ``eagle3.extract_layers`` as input-of-layer ids; ``src/models/eagle3.cpp`` and
``src/llama-arch.cpp`` for the names the loader looks up) loads as a drafter and decodes
losslessly; export, import, export is bit-identical; the layer ids follow llama.cpp's
convention; what the file cannot hold, or specdec cannot run, is refused."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import specdec
from specdec.errors import IncompatibleDrafterError, InvalidInputError
from specdec.plugins.export import detect_layout, export, import_drafter
from specdec.testing import make_random_model
from specdec_eagle3.checkpoint import load_eagle3_checkpoint, make_random_eagle3
from specdec_eagle3.config import default_hidden_layers
from specdec_eagle3.llamacpp import default_extract_layers
from specdec_eagle3.llamacpp_read import read_gguf

gguf = pytest.importorskip("gguf", reason="llama.cpp's GGUF needs the 'hf' extra")

V, H, LAYERS, N = 96, 32, 6, 40
HEADS, KV_HEADS, HEAD_DIM, INNER = 4, 2, 8, 64
UPSTREAM = {  # llama.cpp name -> (specdec name, numpy shape)
    "fc.weight": ("fc.weight", (H, 3 * H)),
    "blk.0.attn_norm.weight": ("midlayer.input_layernorm.weight", (H,)),
    "blk.0.attn_norm_2.weight": ("midlayer.hidden_norm.weight", (H,)),
    "blk.0.attn_q.weight": ("midlayer.self_attn.q_proj.weight", (HEADS * HEAD_DIM, 2 * H)),
    "blk.0.attn_k.weight": ("midlayer.self_attn.k_proj.weight", (KV_HEADS * HEAD_DIM, 2 * H)),
    "blk.0.attn_v.weight": ("midlayer.self_attn.v_proj.weight", (KV_HEADS * HEAD_DIM, 2 * H)),
    "blk.0.attn_output.weight": ("midlayer.self_attn.o_proj.weight", (H, HEADS * HEAD_DIM)),
    "blk.0.ffn_norm.weight": ("midlayer.post_attention_layernorm.weight", (H,)),
    "blk.0.ffn_gate.weight": ("midlayer.mlp.gate_proj.weight", (INNER, H)),
    "blk.0.ffn_up.weight": ("midlayer.mlp.up_proj.weight", (INNER, H)),
    "blk.0.ffn_down.weight": ("midlayer.mlp.down_proj.weight", (H, INNER)),
    "output_norm.weight": ("norm.weight", (H,)),
    "output.weight": ("lm_head.weight", (N, H)),
}
PROMPTS = [[1, 2, 3, 1, 2, 3, 1], [9, 10], [40, 41, 42, 43, 44]]


@pytest.fixture(scope="module")
def deep_model(tmp_path_factory):
    return make_random_model(
        tmp_path_factory.mktemp("deep") / "llama",
        vocab_size=V,
        hidden_size=H,
        num_layers=LAYERS,
        num_heads=HEADS,
        num_kv_heads=KV_HEADS,
        intermediate_size=INNER,
        seed=1,
        with_tokenizer=True,
    )


def llama_permute(weights: np.ndarray, n_head: int, n_head_kv: int | None) -> np.ndarray:
    """conversion/llama.py ``LlamaModel.permute``, as upstream writes it."""
    if n_head_kv is not None and n_head != n_head_kv:
        n_head = n_head_kv
    return (
        weights.reshape(n_head, 2, weights.shape[0] // n_head // 2, *weights.shape[1:])
        .swapaxes(1, 2)
        .reshape(weights.shape)
    )


def hf_tensors(seed: int) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """Random float32 weights in Hugging Face order under the specdec names, and the draft
    vocabulary's (ascending) target ids."""
    rng = np.random.default_rng(seed)
    tensors = {}
    for name, shape in UPSTREAM.values():
        scale = 1.0 if len(shape) == 1 else 1.0 / np.sqrt(shape[-1])
        values = 1 + 0.1 * rng.normal(size=shape) if len(shape) == 1 else rng.normal(size=shape)
        tensors[name] = (scale * values).astype(np.float32)
    return tensors, np.sort(rng.choice(V, size=N, replace=False)).astype(np.int64)


def write_upstream_gguf(
    path: Path,
    seed: int = 0,
    *,
    extract=(1, 3, 6),
    arch: str = "eagle3",
    block_count: int = 1,
    d2t: str = "absolute",
    drop=(),
    extra=None,
    matrices: str = "F32",
) -> Path:
    """An EAGLE-3 head as llama.cpp's converter writes it (conversion/llama.py @ 0274f0fc);
    ``matrices``: the type its 2-D tensors are stored as (norms stay F32)."""
    tensors, ids = hf_tensors(seed)
    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_block_count(block_count)
    writer.add_context_length(2048)
    writer.add_embedding_length(H)
    writer.add_feed_forward_length(INNER)
    writer.add_head_count(HEADS)
    writer.add_head_count_kv(KV_HEADS)
    writer.add_key_length(HEAD_DIM)
    writer.add_value_length(HEAD_DIM)
    writer.add_rope_freq_base(10000.0)
    writer.add_layer_norm_rms_eps(1e-6)
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    writer.add_vocab_size(V)
    writer.add_rope_dimension_count(HEAD_DIM)
    writer.add_array(f"{arch}.extract_layers", list(extract))
    writer.add_uint32(f"{arch}.target_hidden_size", H)
    writer.add_bool(f"{arch}.norm_before_residual", False)
    writer.add_tokenizer_model("gpt2")
    writer.add_token_list([f"t{i}" for i in range(V)])
    writer.add_token_types([gguf.TokenType.NORMAL] * V)
    for gguf_name, (name, _) in UPSTREAM.items():
        if gguf_name in drop:
            continue
        array = tensors[name]
        if gguf_name == "blk.0.attn_q.weight":
            array = llama_permute(array, HEADS, HEADS)
        elif gguf_name == "blk.0.attn_k.weight":
            array = llama_permute(array, HEADS, KV_HEADS)
        if array.ndim == 2 and matrices != "F32":
            kind = gguf.GGMLQuantizationType[matrices]
            writer.add_tensor(gguf_name, gguf.quants.quantize(array, kind), raw_dtype=kind)
        else:
            writer.add_tensor(gguf_name, array)
    stored = ids if d2t == "absolute" else ids - np.arange(N)
    writer.add_tensor("d2t", stored, raw_dtype=gguf.GGMLQuantizationType.I64)
    for name, array in (extra or {}).items():
        writer.add_tensor(name, array)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def read(path: Path) -> tuple[dict, dict]:
    """(key -> (types, value)) and (tensor name -> (type name, numpy shape, raw bytes))."""
    reader = gguf.GGUFReader(str(path))
    fields = {
        name: (tuple(int(t) for t in field.types), field.contents())
        for name, field in reader.fields.items()
        if not name.startswith("GGUF.")
    }
    tensors = {
        t.name: (t.tensor_type.name, tuple(t.data.shape), t.data.tobytes()) for t in reader.tensors
    }
    return fields, tensors


def only_gguf(folder: Path) -> Path:
    (file,) = sorted(Path(folder).glob("*.gguf"))
    return file


def test_an_upstream_gguf_loads_and_decodes_losslessly(tmp_path, deep_model):
    folder = tmp_path / "head"
    folder.mkdir()
    file = write_upstream_gguf(folder / "eagle3.gguf")
    assert detect_layout(file) == ("eagle3", "gguf") == detect_layout(folder)
    config, weights = load_eagle3_checkpoint(file)
    # input-of-layer ids (1, 3, 6) are the outputs of layers (0, 2, 5); 6 = L is the last output
    assert config.hidden_layers == (0, 2, 5) == default_hidden_layers(LAYERS)
    assert (config.vocab_size, config.draft_vocab_size, config.hidden_size) == (V, N, H)
    assert (config.num_heads, config.num_kv_heads, config.head_dim) == (HEADS, KV_HEADS, HEAD_DIM)
    assert not config.norm_before_residual
    tensors, ids = hf_tensors(0)
    for name, array in tensors.items():  # q and k back in Hugging Face order, exactly
        np.testing.assert_array_equal(weights[name], array, err_msg=name)
    np.testing.assert_array_equal(weights["d2t"] + np.arange(N), ids)  # offsets again
    plain = specdec.generate(
        deep_model, PROMPTS, drafter="none", backend="numpy", max_new_tokens=12
    ).tokens
    runs = [("numpy", None, file), ("numpy", None, folder), ("torch", "float32", file)]
    for backend, dtype, drafter in runs:
        if backend == "torch":
            pytest.importorskip("torch")
        got = specdec.generate(
            deep_model,
            PROMPTS,
            drafter=str(drafter),
            backend=backend,
            dtype=dtype,
            max_new_tokens=12,
        )
        assert got.tokens == plain, f"{drafter.name} on {backend}"


def test_a_gguf_drafter_is_detected_once_per_version_of_the_file(tmp_path, deep_model, monkeypatch):
    """generate checks the path, resolves the drafter and loads it: one header read, not three;
    a file written again is read again."""
    import specdec_eagle3.llamacpp_read as llamacpp_read

    file = write_upstream_gguf(tmp_path / "eagle3.gguf")
    reads, real = [], llamacpp_read._architecture
    monkeypatch.setattr(llamacpp_read, "_architecture", lambda f: reads.append(f) or real(f))
    for _ in range(2):
        specdec.generate(
            deep_model, PROMPTS[0], drafter=str(file), backend="numpy", max_new_tokens=2
        )
    assert len(reads) == 1
    write_upstream_gguf(file, seed=1)  # another version of the file
    assert detect_layout(file) == ("eagle3", "gguf") and len(reads) == 2


@pytest.mark.parametrize("matrices", ["F16", "BF16", "Q8_0"])
def test_half_and_quantized_files_read_as_stored(tmp_path, deep_model, matrices):
    file = write_upstream_gguf(tmp_path / "head.gguf", matrices=matrices)
    config, weights, notes = read_gguf(file)
    kind = gguf.GGMLQuantizationType[matrices]
    tensors, _ = hf_tensors(0)
    for gguf_name, (name, shape) in UPSTREAM.items():
        heads = {"blk.0.attn_q.weight": HEADS, "blk.0.attn_k.weight": KV_HEADS}.get(gguf_name)
        expected, got = tensors[name], weights[name]
        if heads is not None:  # compared in llama.cpp's row order: the read undid it exactly
            expected, got = (llama_permute(x, heads, heads) for x in (expected, got))
        if len(shape) == 2:  # the stored values exactly
            expected = gguf.quants.dequantize(gguf.quants.quantize(expected, kind), kind)
        np.testing.assert_array_equal(got, expected, err_msg=name)
    assert bool(notes) == (matrices == "Q8_0")  # a dequantized file says so
    plain = specdec.generate(
        deep_model, PROMPTS, drafter="none", backend="numpy", max_new_tokens=8
    ).tokens
    got = specdec.generate(
        deep_model, PROMPTS, drafter=str(file), backend="numpy", max_new_tokens=8
    )
    assert got.tokens == plain


def test_layer_ids_are_llama_cpp_input_of_layer_ids(tmp_path, deep_model):
    # conversion/llama.py: extract_layers = [2, L // 2, L - 3] from the target's layer count
    for layers in (8, 16, 28, 32, 36, 48, 80):
        assert default_extract_layers(layers) == [2, layers // 2, layers - 3]
    source = make_random_eagle3(
        tmp_path / "ours", deep_model, seed=3, draft_vocab_size=50, hidden_layers=(1, 2, 4)
    )
    written = {
        layout: export(str(source), layout, tmp_path / layout, model=deep_model).path
        for layout in ("gguf", "speculators", "specforge")
    }
    fields, _ = read(only_gguf(written["gguf"]))
    extract = fields["eagle3.extract_layers"][1]
    vllm = json.loads((written["speculators"] / "config.json").read_text())
    sglang = json.loads((written["specforge"] / "config.json").read_text())
    sglang_ids = sglang["eagle_config"]["eagle_aux_hidden_state_layer_ids"]
    assert extract == [2, 3, 5] == vllm["eagle_aux_hidden_state_layer_ids"]
    assert extract == [i + 1 for i in sglang_ids]  # SGLang's output-of-layer ids + 1
    upstream = write_upstream_gguf(tmp_path / "upstream.gguf", extract=(2, 3, 5))
    assert load_eagle3_checkpoint(upstream)[0].hidden_layers == (1, 2, 4)


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_export_import_export_is_bit_identical(tmp_path, deep_model, dtype):
    overrides = (
        {"hidden_layers": (1, 2, 4), "norm_before_residual": True}
        if dtype == "float32"
        else {"hidden_layers": None}
    )
    source = make_random_eagle3(
        tmp_path / "ours", deep_model, seed=5, draft_vocab_size=50, **overrides
    )
    config, weights = load_eagle3_checkpoint(source)
    first = export(str(source), "gguf", tmp_path / "out", model=deep_model, dtype=dtype)
    file = only_gguf(first.path)
    assert detect_layout(file) == ("eagle3", "gguf")
    fields, tensors = read(file)
    assert fields["general.architecture"][1] == "eagle3"
    assert fields["eagle3.block_count"][1] == 1
    assert fields["eagle3.target_hidden_size"][1] == H
    assert fields["eagle3.norm_before_residual"][1] is (dtype == "float32")
    assert fields["eagle3.extract_layers"][1] == ([2, 3, 5] if dtype == "float32" else [1, 3, 6])
    assert len(fields["tokenizer.ggml.tokens"][1]) == V
    assert set(tensors) == set(UPSTREAM) | {"d2t"}
    matrix = "F32" if dtype == "float32" else "F16"
    for name, (kind, shape, _) in tensors.items():
        expected = "I64" if name == "d2t" else "F32" if len(shape) == 1 else matrix
        assert kind == expected, name
    reader = gguf.GGUFReader(str(file))
    stored = {t.name: np.asarray(t.data) for t in reader.tensors}
    q = weights["midlayer.self_attn.q_proj.weight"].astype(stored["blk.0.attn_q.weight"].dtype)
    np.testing.assert_array_equal(stored["blk.0.attn_q.weight"], llama_permute(q, HEADS, HEADS))
    np.testing.assert_array_equal(stored["d2t"], weights["d2t"] + np.arange(50))  # absolute ids

    back = import_drafter(file, tmp_path / "back")  # float32: the file's values exactly
    config2, weights2 = load_eagle3_checkpoint(back.path)
    assert config2 == config
    if dtype == "float32":
        for name in weights:
            np.testing.assert_array_equal(weights2[name], weights[name], err_msg=name)
    again = export(str(back.path), "gguf", tmp_path / "again", model=deep_model, dtype=dtype)
    fields2, tensors2 = read(only_gguf(again.path))
    assert fields2 == fields
    assert tensors2 == tensors  # every tensor: type, shape and bytes
    assert only_gguf(again.path).read_bytes() == file.read_bytes()
    direct = export(str(file), "gguf", tmp_path / "direct", model=deep_model, dtype=dtype)
    assert only_gguf(direct.path).read_bytes() == file.read_bytes()


def test_a_bfloat16_export_rounds_to_nearest_even_and_round_trips(tmp_path, deep_model):
    """Matrices stored as BF16 (norms float32, as upstream), each value the float32 weight
    rounded to the nearest bfloat16 (ties to even); import reads them exactly and exports the
    same bytes again. A layout that cannot store bfloat16 refuses it before writing anything."""
    torch = pytest.importorskip("torch")
    source = make_random_eagle3(tmp_path / "ours", deep_model, seed=6, draft_vocab_size=50)
    _, weights = load_eagle3_checkpoint(source)
    first = export(str(source), "gguf", tmp_path / "out", model=deep_model, dtype="bfloat16")
    file = only_gguf(first.path)
    assert file.name == "eagle3-bf16.gguf"
    _, tensors = read(file)
    for name, (kind, shape, _) in tensors.items():
        assert kind == ("I64" if name == "d2t" else "F32" if len(shape) == 1 else "BF16"), name
    back = import_drafter(file, tmp_path / "back")
    _, weights2 = load_eagle3_checkpoint(back.path)
    for name in ("midlayer.mlp.down_proj.weight", "fc.weight", "lm_head.weight"):
        rounded = torch.from_numpy(weights[name].astype(np.float32)).to(torch.bfloat16).float()
        np.testing.assert_array_equal(weights2[name], rounded.double().numpy(), err_msg=name)
    again = export(str(back.path), "gguf", tmp_path / "again", model=deep_model, dtype="bfloat16")
    assert read(only_gguf(again.path))[1] == tensors  # every tensor: type, shape and bytes
    with pytest.raises(InvalidInputError, match="stores float32 or float16, not 'bfloat16'.*gguf"):
        export(str(source), "specforge", tmp_path / "sf", dtype="bfloat16")
    assert not (tmp_path / "sf").exists()


def write_target_gguf(path: Path) -> Path:
    """The tokenizer keys and sizes of a target as llama.cpp holds it (no tensors needed)."""
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_block_count(LAYERS)
    writer.add_embedding_length(H)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("smollm")
    writer.add_token_list([f"piece{i}" for i in range(V)])
    writer.add_token_types([gguf.TokenType.CONTROL] + [gguf.TokenType.NORMAL] * (V - 1))
    writer.add_token_merges(["p i", "pi e"])
    writer.add_eos_token_id(3)
    writer.add_add_bos_token(False)
    writer.add_chat_template("{{ messages }}")
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def test_a_target_gguf_gives_its_vocabulary_as_it_is(tmp_path, deep_model):
    source = make_random_eagle3(tmp_path / "ours", deep_model, seed=2, draft_vocab_size=50)
    target = write_target_gguf(tmp_path / "target.gguf")
    result = export(str(source), "gguf", tmp_path / "out", model=str(target))
    fields, _ = read(only_gguf(result.path))
    target_fields, _ = read(target)
    tokenizer = {k: v for k, v in target_fields.items() if k.startswith("tokenizer.")}
    assert tokenizer and {k: fields[k] for k in tokenizer} == tokenizer
    assert any("copied as they are" in note for note in result.notes)
    assert fields["eagle3.extract_layers"][1] == [1, 3, 6]  # the target's 6 layers
    assert f"-m {target.resolve()} " in result.commands[0], result.commands  # llama-server's target


def test_the_cli_exports_and_imports_a_gguf(tmp_path, deep_model, capsys):
    from specdec.cli.main import main

    source = make_random_eagle3(tmp_path / "ours", deep_model, seed=4, draft_vocab_size=50)
    out = tmp_path / "out"
    argv = ["export", str(source), "--layout", "llama.cpp", "--model", str(deep_model)]
    assert main([*argv, "--out", str(out)]) == 0
    assert "--spec-type draft-eagle3" in capsys.readouterr().out
    assert main(["import", str(only_gguf(out)), "--out", str(tmp_path / "back")]) == 0
    assert load_eagle3_checkpoint(tmp_path / "back")[0] == load_eagle3_checkpoint(source)[0]


def test_refusals_name_the_problem_and_the_fix(tmp_path, deep_model):
    source = make_random_eagle3(tmp_path / "ours", deep_model, seed=1, draft_vocab_size=50)
    with pytest.raises(InvalidInputError, match="carries the target's vocabulary.*--model"):
        export(str(source), "gguf", tmp_path / "a")
    with pytest.raises(InvalidInputError, match="choices and drop_shortlist"):
        export(str(source), "gguf", tmp_path / "b", model=deep_model, choices="chain")
    other = make_random_model(
        tmp_path / "other",
        vocab_size=80,
        hidden_size=H,
        num_layers=2,
        num_heads=4,
        num_kv_heads=2,
        seed=2,
        with_tokenizer=True,
    )
    with pytest.raises(IncompatibleDrafterError, match="trained for another model"):
        export(str(source), "gguf", tmp_path / "c", model=other)
    bare = make_random_model(
        tmp_path / "bare",
        vocab_size=V,
        hidden_size=H,
        num_layers=LAYERS,
        num_heads=4,
        num_kv_heads=2,
        seed=3,
    )
    with pytest.raises(InvalidInputError, match="holds no tokenizer.*GGUF file"):
        export(str(source), "gguf", tmp_path / "d", model=bare)

    cases = {
        "another architecture": (dict(arch="llama"), "architecture 'llama', not an EAGLE-3"),
        "two layers": (dict(block_count=2), "2 draft layers"),
        "embedding": (
            dict(extra={"token_embd.weight": np.zeros((V, H), np.float32)}),
            "its own token embedding",
        ),
        "shared head": (dict(drop=("output.weight",)), "no output.weight"),
        "rope scaling": (
            dict(extra={"rope_freqs.weight": np.ones(HEAD_DIM // 2, np.float32)}),
            "rope_freqs",
        ),
        "EAGLE-3.1": (
            dict(extra={"fc_norm.weight": np.ones((3, H), np.float32)}),
            r"does not run: \['fc_norm.weight'\]",
        ),
        "embedding input": (dict(extract=(0, 3, 6)), "id 0 would be the token embedding"),
        "offsets": (dict(d2t="offsets"), "stores d2t as offsets.*convert_hf_to_gguf"),
    }
    for label, (options, message) in cases.items():
        file = write_upstream_gguf(tmp_path / f"{label}.gguf", **options)
        with pytest.raises(InvalidInputError, match=message):
            read_gguf(file)
    with pytest.raises(InvalidInputError, match="is a file"):
        specdec.generate(
            deep_model,
            PROMPTS,
            drafter=str(tmp_path / "another architecture.gguf"),
            backend="numpy",
            max_new_tokens=2,
        )
