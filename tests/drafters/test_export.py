"""Export to the engines' layouts and import from them (specdec.plugins.export, docs/scale-out.md).

The layout tests rebuild, from the upstream code cited in docs/scale-out.md, what each loader
looks up, and fail on any drift in names, shapes or config fields:

- Apple's ``Drafter`` (apple/ml-recurrent-drafter ``recurrent_drafting/modeling_drafter.py``) and
  TensorRT-LLM's ``hf_drafter`` / ``hf_redrafter_config``
  (``examples/redrafter/convert_checkpoint.py``);
- FasterDecoding's Medusa heads (``medusa/model/medusa_model.py``) and TensorRT-LLM's
  ``load_medusa_hf`` (``tensorrt_llm/models/medusa/weight.py``);
- vLLM's ``Medusa`` (``vllm/model_executor/models/medusa.py``) with its ``MedusaConfig``
  (``vllm/transformers_utils/configs/medusa.py``).

Round trips (export, then load the folder as a drafter) give bit-identical drafts on every
backend under test.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest

import specdec
from specdec.cli.main import main
from specdec.errors import InvalidInputError
from specdec.models.outfolder import WRITTEN
from specdec.plugins.export import detect_layout, export, import_drafter
from specdec.plugins.registry import default_registry
from specdec.types import DraftContext
from specdec_medusa.checkpoint import load_medusa_checkpoint, make_random_medusa, save_medusa
from specdec_redrafter.checkpoint import (
    load_redrafter_checkpoint,
    make_random_redrafter,
    save_redrafter,
)
from specdec_redrafter.export import materialise
from specdec_redrafter.reference import drafter_logits

BACKENDS = ["numpy", "torch", "mlx"]


def _safetensors(path: Path) -> tuple[dict[str, np.ndarray], dict]:
    from safetensors import safe_open
    from safetensors.numpy import load_file

    with safe_open(str(path), framework="np") as handle:
        metadata = handle.metadata() or {}
    return dict(load_file(str(path))), metadata


def _files(out: Path) -> list[str]:
    """The files an engine reads: all but specdec's record of what it wrote (a hidden file)."""
    return sorted(p.name for p in out.iterdir() if p.name != WRITTEN)


# ---------------------------------------------------------- upstream expectations, from their code


def apple_drafter_state(config: dict) -> dict[str, tuple]:
    """The state dict of Apple's ``Drafter(cfg)`` (modeling_drafter.py): names and shapes."""
    hidden, exit_dim, vocab, layers = (
        config["hidden_size"],
        config["exit_dim"],
        config["vocab_size"],
        config["num_draft_layers"],
    )
    state = {}
    if 2 * hidden != exit_dim:  # "Layer 1 is optional": Linear(2H, exit_dim, bias=True)
        state["input_proj.weight"], state["input_proj.bias"] = (exit_dim, 2 * hidden), (exit_dim,)
    for i in range(layers):  # Sequential(ResBlock * L, Linear(exit_dim, vocab, bias=False))
        state[f"lm_head.{i}.linear.weight"], state[f"lm_head.{i}.linear.bias"] = (
            (exit_dim, exit_dim),
            (exit_dim,),
        )
    state[f"lm_head.{layers}.weight"] = (vocab, exit_dim)
    if config["rnn"]:  # rnn_u: Linear(H, H, bias=True); rnn_w: Linear(H, H, bias=False)
        state["rnn_u.weight"], state["rnn_u.bias"], state["rnn_w.weight"] = (
            (hidden, hidden),
            (hidden,),
            (hidden, hidden),
        )
    return state


def trtllm_redrafter_lookups(config: dict) -> list[str]:
    """The tensor names TensorRT-LLM's ``hf_drafter`` takes (first of its candidate names)."""
    names = []
    if config["hidden_size"] * 2 != config["exit_dim"]:
        names += ["input_proj.weight", "input_proj.bias"]
    for i in range(config["num_draft_layers"]):
        names += [f"lm_head.{i}.linear.weight", f"lm_head.{i}.linear.bias"]
    names.append(f"lm_head.{config['num_draft_layers']}.weight")
    if config["rnn"]:
        names += ["rnn_u.weight", "rnn_u.bias", "rnn_w.weight"]
    return names


def fasterdecoding_state(
    num_heads: int, num_layers: int, hidden: int, vocab: int
) -> dict[str, tuple]:
    """``medusa_head.state_dict()`` of FasterDecoding's MedusaModel (ModuleList of
    Sequential(ResBlock * L, Linear(H, V, bias=False)); ResBlock.linear = Linear(H, H) with
    bias)."""
    state = {}
    for h in range(num_heads):
        for layer in range(num_layers):
            state[f"{h}.{layer}.linear.weight"], state[f"{h}.{layer}.linear.bias"] = (
                (hidden, hidden),
                (hidden,),
            )
        state[f"{h}.{num_layers}.weight"] = (vocab, hidden)
    return state


def vllm_medusa_params(config: dict) -> dict[str, tuple]:
    """``dict(Medusa.named_parameters())`` of vLLM's Medusa for a config.json, after vLLM's
    MedusaConfig.from_pretrained renames "num*heads" / "num*layers" keys."""
    config = dict(config)
    for key in list(config):
        if "num" in key:
            if "heads" in key:
                config["num_heads"] = config.pop(key)
            elif "layers" in key:
                config["num_hidden_layers"] = config.pop(key)
    hidden, vocab = config.get("hidden_size", 4096), config.get("vocab_size", 32001)
    truncated = config.get("truncated_vocab_size") or vocab
    params = {}
    for h in range(config.get("num_heads", 5)):
        for layer in range(config.get("num_hidden_layers", 1)):
            params[f"blocks.{h}.layers.{layer}.weight"] = (hidden, hidden)
            if config.get("medusa_fc_bias", False):
                params[f"blocks.{h}.layers.{layer}.bias"] = (hidden,)
        if not config.get("original_lm_head", False):
            params[f"lm_heads.{h}.weight"] = (truncated, hidden)
    if config.get("original_lm_head", False):
        params["lm_head.weight"] = (truncated, hidden)
    return params


# ---------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def drafters(model_dir, tmp_path_factory):
    """Random drafters for the session's random model: every head / shortlist combination."""
    root = tmp_path_factory.mktemp("drafters")
    return {
        "redrafter_full": make_random_redrafter(
            root / "rf",
            model_dir,
            seed=3,
            head="full",
            exit_dim=40,
            num_draft_layers=2,
            beam_width=3,
            beam_length=4,
        ),
        "redrafter_tied_shortlist": make_random_redrafter(
            root / "rt", model_dir, seed=4, shortlist_size=40, beam_width=3, beam_length=4
        ),
        "redrafter_norm": make_random_redrafter(
            root / "rn", model_dir, seed=5, head="full", rnn=False
        ),
        "medusa_full": make_random_medusa(
            root / "mf", model_dir, seed=6, head="full", num_layers=2, top_t=4, choices="small8"
        ),
        "medusa_tied": make_random_medusa(
            root / "mt", model_dir, seed=7, head="tied", choices="cpu16"
        ),
    }


# ---------------------------------------------------------- layouts pinned to upstream


@pytest.mark.parametrize("name", ["redrafter_full", "redrafter_tied_shortlist", "redrafter_norm"])
def test_apple_layout_is_what_apple_and_tensorrt_llm_load(name, drafters, model_dir, tmp_path):
    out = export(
        drafters[name], "apple", tmp_path / "out", model=model_dir, drop_shortlist=True
    ).path
    assert _files(out) == ["config.json", "model.safetensors"]
    config = json.loads((out / "config.json").read_text())
    # configuration_drafter.DrafterConfig fields, and AutoModel's registration key
    assert config["model_type"] == "recurrent_drafting_drafter"
    for key in (
        "vocab_size",
        "hidden_size",
        "exit_dim",
        "num_draft_layers",
        "num_lookback_tokens",
        "rnn",
    ):
        assert key in config, key
    assert isinstance(config["rnn"], bool)
    tensors, metadata = _safetensors(out / "model.safetensors")
    # transformers' from_pretrained refuses safetensors files without format pt/tf/flax/mlx metadata
    assert metadata.get("format") == "pt"
    assert {k: tuple(v.shape) for k, v in tensors.items()} == apple_drafter_state(config)
    assert sorted(trtllm_redrafter_lookups(config)) == sorted(tensors)
    assert all(v.dtype == np.float32 for v in tensors.values())
    # hf_redrafter_config reads exactly these four from the drafter's config.json
    source, _ = load_redrafter_checkpoint(drafters[name])
    assert (
        config["hidden_size"],
        config["exit_dim"],
        config["num_draft_layers"],
        config["rnn"],
    ) == (source.hidden_size, source.exit_dim, source.num_draft_layers, source.rnn)


def test_apple_layout_computes_apples_drafter(drafters, model_dir, tmp_path):
    """The exported tensors in Apple's forward (beam_search_candidates, one step, written from
    modeling_drafter.py) give the logits of our reference."""
    torch = pytest.importorskip("torch")
    config, weights = load_redrafter_checkpoint(drafters["redrafter_full"])
    out = export(drafters["redrafter_full"], "apple", tmp_path / "out").path
    tensors = {
        k: torch.tensor(v, dtype=torch.float64)
        for k, v in _safetensors(out / "model.safetensors")[0].items()
    }
    target = specdec.load(model_dir, backend="numpy")
    rng = np.random.default_rng(0)
    context = torch.tensor(rng.normal(size=(2, config.hidden_size)))
    tokens = torch.tensor(rng.integers(0, config.vocab_size, size=2))
    embeddings = torch.tensor(target.embed_tokens)
    silu = torch.nn.functional.silu
    linear = torch.nn.functional.linear
    state = torch.zeros(2, config.hidden_size, dtype=torch.float64)
    state = silu(
        linear(embeddings[tokens], tensors["rnn_w.weight"])
        + linear(state, tensors["rnn_u.weight"], tensors["rnn_u.bias"])
    )
    x = torch.cat([context, state], dim=-1)
    x = linear(x, tensors["input_proj.weight"], tensors["input_proj.bias"])
    for i in range(config.num_draft_layers):
        x = x + silu(
            linear(x, tensors[f"lm_head.{i}.linear.weight"], tensors[f"lm_head.{i}.linear.bias"])
        )
    apple = linear(x, tensors[f"lm_head.{config.num_draft_layers}.weight"]).numpy()
    from specdec_redrafter.reference import rnn_step

    ours_state = rnn_step(
        config,
        weights,
        np.zeros((2, config.hidden_size)),
        target.embed_tokens[tokens.numpy()],
        first=True,
    )
    ours = drafter_logits(config, weights, context.numpy(), ours_state)
    np.testing.assert_allclose(apple, ours, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("name", ["medusa_full", "medusa_tied"])
def test_fasterdecoding_layout_is_what_tensorrt_llm_loads(name, drafters, model_dir, tmp_path):
    out = export(drafters[name], "fasterdecoding", tmp_path / "out", model=model_dir).path
    assert _files(out) == ["config.json", "medusa_lm_head.safetensors"]
    config = json.loads((out / "config.json").read_text())
    source, _ = load_medusa_checkpoint(drafters[name])
    # FasterDecoding's MedusaConfig fields; TensorRT-LLM reads medusa_num_heads / medusa_num_layers
    assert (
        config["medusa_num_heads"] == source.num_heads
        and config["medusa_num_layers"] == source.num_layers
    )
    assert "base_model_name_or_path" in config
    tensors, metadata = _safetensors(out / "medusa_lm_head.safetensors")
    assert metadata.get("format") == "pt"
    expected = fasterdecoding_state(
        source.num_heads, source.num_layers, source.hidden_size, source.vocab_size
    )
    assert {k: tuple(v.shape) for k, v in tensors.items()} == expected
    # load_medusa_hf: f"{h}.{l}.linear.weight", f"{h}.{l}.linear.bias",
    # f"{h}.{num_medusa_layers}.weight"
    for h in range(config["medusa_num_heads"]):
        for layer in range(config["medusa_num_layers"]):
            assert f"{h}.{layer}.linear.weight" in tensors and f"{h}.{layer}.linear.bias" in tensors
        assert f"{h}.{config['medusa_num_layers']}.weight" in tensors
    if source.head == "tied":  # the copy is the target's LM head, bit for bit (as float32)
        lm_head = specdec.load(model_dir, backend="numpy").lm_head
        for h in range(source.num_heads):
            np.testing.assert_array_equal(
                tensors[f"{h}.{source.num_layers}.weight"], lm_head.astype(np.float32)
            )


@pytest.mark.parametrize("name", ["medusa_full", "medusa_tied"])
def test_vllm_layout_is_what_vllm_loads(name, drafters, model_dir, tmp_path):
    out = export(drafters[name], "vllm", tmp_path / "out", model=model_dir, choices="chain").path
    assert _files(out) == ["config.json", "model.safetensors"]
    config = json.loads((out / "config.json").read_text())
    source, _ = load_medusa_checkpoint(drafters[name])
    assert config["model_type"] == "medusa" and config["architectures"] == ["MedusaModel"]
    assert (config["hidden_size"], config["vocab_size"]) == (source.hidden_size, source.vocab_size)
    assert (config["num_heads"], config["num_hidden_layers"]) == (
        source.num_heads,
        source.num_layers,
    )
    assert (
        config["medusa_fc_bias"] is True
    )  # else vLLM builds bias-free blocks and drops the biases silently
    assert config["truncated_vocab_size"] == config["vocab_size"]  # no token_map
    tensors, _ = _safetensors(out / "model.safetensors")
    # Medusa.load_weights: every name must be a parameter (others are skipped without a word) and
    # every parameter must be loaded
    params = vllm_medusa_params(config)
    assert {k: tuple(v.shape) for k, v in tensors.items()} == params
    assert config["original_lm_head"] is (source.head == "tied")


def test_export_import_export_is_byte_stable(drafters, model_dir, tmp_path):
    for name, fmt, options in (
        ("redrafter_tied_shortlist", "apple", dict(drop_shortlist=True)),
        ("medusa_tied", "fasterdecoding", {}),
        ("medusa_tied", "vllm", dict(choices="chain")),
    ):
        first = export(drafters[name], fmt, tmp_path / f"{fmt}1", model=model_dir, **options).path
        again = export(first, fmt, tmp_path / f"{fmt}2", model=model_dir).path
        for path in first.iterdir():
            if path.suffix == ".safetensors":
                a, b = _safetensors(path)[0], _safetensors(again / path.name)[0]
                assert sorted(a) == sorted(b)
                for key in a:
                    np.testing.assert_array_equal(a[key], b[key], err_msg=f"{fmt} {key}")
            else:
                assert json.loads(path.read_text()) == json.loads((again / path.name).read_text())


# ---------------------------------------------------------- refusals


def test_refusals_name_the_problem_and_the_fix(drafters, model_dir, tmp_path):
    with pytest.raises(InvalidInputError, match="shortlist.*--drop-shortlist"):
        export(drafters["redrafter_tied_shortlist"], "apple", tmp_path / "a", model=model_dir)
    with pytest.raises(InvalidInputError, match="head='tied'.*--model"):
        export(drafters["redrafter_tied_shortlist"], "apple", tmp_path / "b", drop_shortlist=True)
    with pytest.raises(InvalidInputError, match="head='tied'.*--model"):
        export(drafters["medusa_tied"], "fasterdecoding", tmp_path / "c")
    with pytest.raises(InvalidInputError, match="argmax.*choices='chain'"):
        export(drafters["medusa_full"], "vllm", tmp_path / "d")
    with pytest.raises(InvalidInputError, match="no engine layout for the EAGLE.*'speculators'"):
        export("eagle", "vllm", tmp_path / "e")
    with pytest.raises(InvalidInputError, match="exports to apple"):
        export(drafters["redrafter_full"], "vllm", tmp_path / "f")
    config, weights = load_redrafter_checkpoint(drafters["redrafter_full"])
    for variant in ("trtllm", "paper"):
        variant_config = type(config).from_dict({**config.to_dict(), "rnn_variant": variant})
        folder = save_redrafter(tmp_path / variant, variant_config, weights)
        with pytest.raises(
            InvalidInputError, match=f"rnn_variant='{variant}'.*rnn_variant='apple'"
        ):
            export(folder, "apple", tmp_path / f"{variant}-out")
    (tmp_path / "busy").mkdir()
    (tmp_path / "busy" / "x").write_text("x")
    with pytest.raises(InvalidInputError, match="not empty.*--overwrite"):
        export(drafters["redrafter_full"], "apple", tmp_path / "busy")


def test_notes_name_every_conversion(drafters, model_dir, tmp_path):
    notes = " ".join(
        export(
            drafters["redrafter_tied_shortlist"],
            "apple",
            tmp_path / "a",
            model=model_dir,
            drop_shortlist=True,
        ).notes
    )
    assert "shortlist" in notes and "materialised" in notes and "top 50" in notes
    notes = " ".join(
        export(drafters["medusa_tied"], "fasterdecoding", tmp_path / "b", model=model_dir).notes
    )
    assert "copy of the target's LM head" in notes


# ---------------------------------------------------------- round trips: bit-identical drafts


def _drafts(backend_name, model_dir, kind, folder, rng_seed=0):
    registry = default_registry()
    target = specdec.load(
        model_dir, backend=backend_name, **({} if backend_name == "numpy" else {"dtype": "float32"})
    )
    backend = registry.get("backend", backend_name).factory()
    drafter = registry.get("drafter", kind, backend_name).factory(target, checkpoint=folder)
    rng = np.random.default_rng(rng_seed)
    hidden = rng.normal(size=(3, target.hidden_size)).astype(np.float32).astype(np.float64)
    roots = rng.integers(0, target.vocab_size, size=3)
    convert = (
        (lambda a: a) if backend_name == "numpy" else (lambda a: backend.from_numpy(a, target))
    )
    hidden_in = convert(hidden.astype(np.float32)) if backend_name != "numpy" else hidden
    context = DraftContext(root_tokens=convert(roots), hidden=hidden_in, want_draft_probs=True)
    draft = drafter.propose(context)
    to_numpy = (lambda a: np.asarray(a)) if backend_name == "numpy" else backend.to_numpy
    if kind == "redrafter":
        return to_numpy(draft.beams), to_numpy(draft.draft_probs)
    return to_numpy(draft.head_tokens), None


def _backend_or_skip(name):
    if name == "torch":
        pytest.importorskip("torch")
    if name == "mlx":
        pytest.importorskip("mlx.core")


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize(
    "name,fmt,options",
    [
        ("redrafter_full", "apple", {}),
        ("redrafter_norm", "apple", {}),
        ("redrafter_tied_shortlist", "apple", {"drop_shortlist": True}),
        ("medusa_full", "fasterdecoding", {}),
        ("medusa_tied", "fasterdecoding", {}),
        ("medusa_full", "vllm", {"choices": "chain"}),
        ("medusa_tied", "vllm", {"choices": "chain"}),
    ],
)
def test_round_trip_drafts_are_bit_identical(
    backend, name, fmt, options, drafters, model_dir, tmp_path
):
    """The exported folder, loaded as a drafter, drafts bit for bit what the specdec drafter drafts
    (after the conversions export names in its notes, done here in specdec)."""
    _backend_or_skip(backend)
    source = drafters[name]
    exported = export(source, fmt, tmp_path / "exported", model=model_dir, **options).path
    kind = "redrafter" if name.startswith("redrafter") else "medusa"
    if kind == "redrafter":
        config, weights = load_redrafter_checkpoint(source)
        lm_head = specdec.load(model_dir, backend="numpy").lm_head
        converted, full, _ = materialise(config, weights, lm_head=lm_head, drop_shortlist=True)
        source = save_redrafter(tmp_path / "converted", converted, full)
    elif options.get("choices"):
        config, weights = load_medusa_checkpoint(source)
        from specdec_medusa.export import chain_choices

        converted = type(config).from_dict(
            {**config.to_dict(), "choices": chain_choices(config.num_heads)}
        )
        source = save_medusa(tmp_path / "converted", converted, weights)
    expected = _drafts(backend, model_dir, kind, source)
    actual = _drafts(backend, model_dir, kind, exported)
    np.testing.assert_array_equal(actual[0], expected[0])
    if expected[1] is not None:
        np.testing.assert_array_equal(actual[1], expected[1])
    # the import command writes a specdec checkpoint that drafts the same
    imported = import_drafter(exported, tmp_path / "imported").path
    np.testing.assert_array_equal(_drafts(backend, model_dir, kind, imported)[0], expected[0])


def test_a_full_head_drafter_needs_no_conversion(drafters, model_dir, tmp_path):
    """No tied head, no shortlist: the export holds the very float32 weights of the checkpoint, and
    the imported config equals the original (the specdec entry carries beams, top-k, target)."""
    exported = export(drafters["redrafter_full"], "apple", tmp_path / "a").path
    original, weights = load_redrafter_checkpoint(drafters["redrafter_full"])
    imported, again = load_redrafter_checkpoint(exported)
    assert imported == original
    for key in weights:
        np.testing.assert_array_equal(again[key], weights[key])


def test_the_materialised_head_drafts_what_the_tied_head_drafts(drafters, model_dir):
    """Same map, different rounding: logits agree to float64 rounding (float32 storage aside)."""
    config, weights = load_redrafter_checkpoint(drafters["redrafter_tied_shortlist"])
    target = specdec.load(model_dir, backend="numpy")
    converted, full, _ = materialise(config, weights, lm_head=target.lm_head, drop_shortlist=True)
    rng = np.random.default_rng(1)
    hidden, state = (
        rng.normal(size=(4, config.hidden_size)),
        rng.normal(size=(4, config.hidden_size)),
    )
    tied = drafter_logits(
        type(config).from_dict({**config.to_dict(), "shortlist_size": None}),
        {k: v for k, v in weights.items() if k != "vocab_shortlist"},
        hidden,
        state,
        lm_head=target.lm_head,
    )
    np.testing.assert_allclose(
        drafter_logits(converted, full, hidden, state), tied, rtol=1e-10, atol=1e-10
    )


# ---------------------------------------------------------- published layouts load


def test_published_layout_variants_import(drafters, model_dir, tmp_path):
    """What published folders carry: no specdec entry, TensorRT-LLM's alternate names, .pt files,
    Medusa-2 heads without projections, configs that miscount heads, vLLM without biases."""
    torch = pytest.importorskip("torch")
    exported = export(drafters["redrafter_full"], "apple", tmp_path / "apple").path
    config = json.loads((exported / "config.json").read_text())
    config.pop("specdec")
    tensors, _ = _safetensors(exported / "model.safetensors")
    bare = tmp_path / "bare"
    bare.mkdir()
    (bare / "config.json").write_text(json.dumps(config))
    torch.save(
        {re.sub(r"^lm_head\.", "lm_heads.", k): torch.from_numpy(v) for k, v in tensors.items()},
        bare / "model.pt",
    )
    imported, weights = load_redrafter_checkpoint(bare)
    assert (
        imported.draft_top_k == 50 and imported.rnn_variant == "apple" and imported.head == "full"
    )
    assert detect_layout(bare) == ("redrafter", "apple")

    medusa = export(
        drafters["medusa_tied"], "fasterdecoding", tmp_path / "fd", model=model_dir
    ).path
    heads, _ = _safetensors(medusa / "medusa_lm_head.safetensors")
    v2 = tmp_path / "v2"
    v2.mkdir()
    (v2 / "config.json").write_text(
        json.dumps(
            {"medusa_num_heads": 2, "medusa_num_layers": 1, "version": "2", "vocab_size": 96}
        )
    )
    torch.save(
        {k: torch.from_numpy(v) for k, v in heads.items() if "linear" in k},
        v2 / "medusa_lm_head.pt",
    )
    config2, _ = load_medusa_checkpoint(v2)
    assert (
        config2.head == "tied" and config2.num_heads == 4
    )  # the file's 4 heads, not the config's 2
    result = import_drafter(v2, tmp_path / "v2-imported")
    assert any("medusa_num_heads=2" in note for note in result.notes)


@pytest.mark.parametrize(
    "name,fmt,options",
    [
        ("redrafter_full", "apple", {}),
        ("medusa_full", "fasterdecoding", {}),
        ("medusa_tied", "vllm", {"choices": "chain"}),
    ],
)
def test_generate_runs_an_exported_folder(name, fmt, options, drafters, model_dir, tmp_path):
    exported = export(drafters[name], fmt, tmp_path / "out", model=model_dir, **options).path
    plain = specdec.generate(
        model_dir, [1, 2, 3, 4], drafter="none", backend="numpy", max_new_tokens=8
    )
    result = specdec.generate(
        model_dir, [1, 2, 3, 4], drafter=str(exported), backend="numpy", max_new_tokens=8
    )
    assert result.tokens == plain.tokens


# ---------------------------------------------------------- command line


def test_cli_export_and_import(drafters, model_dir, tmp_path, capsys):
    out = tmp_path / "cli"
    assert (
        main(
            [
                "export",
                str(drafters["medusa_tied"]),
                "--format",
                "tensorrt-llm",
                "--out",
                str(out),
                "--model",
                str(model_dir),
            ]
        )
        == 0
    )
    captured = capsys.readouterr()
    assert "convert_checkpoint.py" in captured.out and "--medusa_choices" in captured.out
    assert "note:" in captured.err
    assert detect_layout(out) == ("medusa", "fasterdecoding")
    assert main(["import", str(out), "--out", str(tmp_path / "back")]) == 0
    assert detect_layout(tmp_path / "back") == ("medusa", "specdec")
    assert (
        main(
            [
                "export",
                str(drafters["redrafter_tied_shortlist"]),
                "--format",
                "apple",
                "--out",
                str(tmp_path / "refused"),
                "--model",
                str(model_dir),
            ]
        )
        == 2
    )
    assert "--drop-shortlist" in capsys.readouterr().err
    assert main(["export", "eagle", "--format", "vllm", "--out", str(tmp_path / "eagle")]) == 2
    assert "no engine layout for the EAGLE drafter" in capsys.readouterr().err


def test_an_eagle_folder_in_no_known_layout_is_told_which_ones_are_read(target, tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "eagle3"}))
    with pytest.raises(InvalidInputError, match="model_type 'eagle3'.*SpecForge.*speculators"):
        specdec.generate(target, [1], drafter=tmp_path, backend="numpy")


def test_an_eagle_drafter_is_not_exported_and_the_eagle3_formats_are_named(model_dir, tmp_path):
    from specdec.testing import make_random_drafter

    eagle = make_random_drafter(tmp_path / "eagle", model_dir, kind="eagle", seed=0)
    with pytest.raises(InvalidInputError, match="eagle drafter has no layout.*eagle3: specforge"):
        export(eagle, "speculators", tmp_path / "a")
    redrafter = make_random_redrafter(tmp_path / "redrafter", model_dir, seed=0)
    with pytest.raises(InvalidInputError, match="format 'specforge'.*'speculators'"):
        export(redrafter, "eagle", tmp_path / "b")
