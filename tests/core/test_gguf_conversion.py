"""The GGUF conversion's success path: a small llama written as GGUF (as llama.cpp's converter
writes one: renamed tensors, q/k rows permuted for its rotary layout) converts back to exactly
the original tensors, config and vocabulary, and decodes the same tokens."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import specdec
from specdec.testing import make_random_model

gguf = pytest.importorskip("gguf", reason="GGUF conversion needs the 'hf' extra")
pytest.importorskip("transformers", reason="GGUF conversion needs the 'hf' extra")

LAYER_NAMES = {
    "input_layernorm.weight": "attn_norm.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.o_proj.weight": "attn_output.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
}


def _permute(weights: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp's row order for q (heads = query heads) and k (heads = key/value heads)."""
    return (
        weights.reshape(heads, 2, weights.shape[0] // heads // 2, *weights.shape[1:])
        .swapaxes(1, 2)
        .reshape(weights.shape)
    )


def write_gguf(folder: Path, out: Path, *, eos: int) -> None:
    """``folder`` (a llama with a WordLevel tokenizer.json) as a float32 GGUF file."""
    from safetensors.numpy import load_file

    config = json.loads((folder / "config.json").read_text())
    vocab = json.loads((folder / "tokenizer.json").read_text())["model"]["vocab"]
    tokens = [token for token, _ in sorted(vocab.items(), key=lambda item: item[1])]
    writer = gguf.GGUFWriter(str(out), "llama")
    writer.add_block_count(config["num_hidden_layers"])
    writer.add_context_length(config["max_position_embeddings"])
    writer.add_embedding_length(config["hidden_size"])
    writer.add_feed_forward_length(config["intermediate_size"])
    writer.add_head_count(config["num_attention_heads"])
    writer.add_head_count_kv(config["num_key_value_heads"])
    writer.add_layer_norm_rms_eps(config["rms_norm_eps"])
    writer.add_rope_freq_base(config["rope_theta"])
    writer.add_vocab_size(config["vocab_size"])
    writer.add_tokenizer_model("gpt2")
    writer.add_token_list(tokens)
    writer.add_token_types([1] * len(tokens))
    writer.add_token_scores([0.0] * len(tokens))
    writer.add_eos_token_id(eos)
    for name, array in load_file(str(folder / "model.safetensors")).items():
        array = array.astype(np.float32)
        if name == "model.embed_tokens.weight":
            writer.add_tensor("token_embd.weight", array)
        elif name == "model.norm.weight":
            writer.add_tensor("output_norm.weight", array)
        else:
            _, _, layer, rest = name.split(".", 3)
            if rest == "self_attn.q_proj.weight":
                array = _permute(array, config["num_attention_heads"])
            elif rest == "self_attn.k_proj.weight":
                array = _permute(array, config["num_key_value_heads"])
            writer.add_tensor(f"blk.{layer}.{LAYER_NAMES[rest]}", array)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def test_a_gguf_file_converts_back_to_the_model_it_came_from(tmp_path, monkeypatch, capfd):
    """... and prints no bar of transformers' own: its GGUF reader's bar, outside transformers'
    switch for bars, wrote a line of carriage returns into every first run's log."""
    from safetensors.numpy import load_file

    monkeypatch.setenv("SPECDEC_CACHE", str(tmp_path / "cache"))
    original = make_random_model(
        tmp_path / "llama",
        vocab_size=96,
        hidden_size=32,
        num_layers=2,
        num_heads=4,
        num_kv_heads=2,
        seed=5,
        with_tokenizer=True,
        eos_token_id=3,
    )
    write_gguf(Path(original), tmp_path / "tiny.gguf", eos=3)
    capfd.readouterr()
    converted = specdec.models.bundled.resolve_model(str(tmp_path / "tiny.gguf"))
    err = capfd.readouterr().err
    assert "GGUF tensors" not in err and "\r" not in err
    assert f"specdec: converting {tmp_path / 'tiny.gguf'} to a float32 model folder" in err
    assert Path(converted).parent == tmp_path / "cache" / "models"
    before = load_file(str(Path(original) / "model.safetensors"))
    after = load_file(str(Path(converted) / "model.safetensors"))
    assert sorted(after) == sorted(before)
    for name, array in before.items():
        np.testing.assert_array_equal(after[name], array, err_msg=name)  # q/k un-permuted exactly
    config = json.loads((Path(converted) / "config.json").read_text())
    assert {
        k: config[k]
        for k in ("num_attention_heads", "num_key_value_heads", "hidden_size", "vocab_size")
    } == {"num_attention_heads": 4, "num_key_value_heads": 2, "hidden_size": 32, "vocab_size": 96}
    assert specdec.models.bundled.resolve_model(str(tmp_path / "tiny.gguf")) == converted, (
        "converted once, then reused"
    )
    prompt = [5, 6, 7, 8]
    plain = specdec.generate(
        original, prompt, drafter="none", backend="numpy", max_new_tokens=8, stop_at_eos=False
    )
    again = specdec.generate(
        converted, prompt, drafter="none", backend="numpy", max_new_tokens=8, stop_at_eos=False
    )
    assert again.tokens == plain.tokens
