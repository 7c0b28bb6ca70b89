"""EAGLE-3 as the GGUF file llama.cpp loads (``specdec export --format gguf``, docs/scale-out.md).

Pinned to ggml-org/llama.cpp @ 0274f0fc7d7fbab69c33ccf757cf7f3d036c17aa: ``conversion/llama.py``
(``LlamaModel``'s EAGLE-3 branch: what its converter writes), ``src/models/eagle3.cpp`` (what the
loader requires and how the graph reads it), ``src/llama-arch.cpp`` and
``gguf-py/gguf/constants.py`` (the names). The ``gguf`` package on PyPI predates the ``eagle3``
architecture, so its names are written here as strings; ``gguf.GGUFWriter`` / ``GGUFReader``
handle the container.

One file, ``general.architecture = "eagle3"``:

- tensors ``fc.weight``, ``blk.0.{attn_norm, attn_norm_2, attn_q, attn_k, attn_v, attn_output,
  ffn_norm, ffn_gate, ffn_up, ffn_down}.weight``, ``output_norm.weight``, ``output.weight`` and
  ``d2t``; ``hidden_norm`` is ``attn_norm_2``; q and k rows are permuted for ggml's rotary
  layout (``LlamaModel.permute``: the architecture's rope type is NORM); ``d2t`` holds int64
  *absolute* target ids (``d2t + arange``; the graph scatters the draft logits to them), and
  ``t2d`` is not stored. Norms stay float32 whatever ``dtype``, as the converter keeps them.
- keys: the draft layer's shapes under ``eagle3.*`` (``block_count`` 1, ``embedding_length``,
  ``feed_forward_length``, ``attention.head_count``/``head_count_kv``/``key_length``/
  ``value_length``/``layer_norm_rms_epsilon``, ``rope.freq_base``, ``rope.dimension_count``,
  ``context_length``, ``vocab_size``), ``eagle3.extract_layers`` (llama.cpp's input-of-layer ids,
  specdec's output-of-layer ids + 1), ``eagle3.target_hidden_size``,
  ``eagle3.norm_before_residual``, and the target's vocabulary (``tokenizer.*``), which the
  converter takes from ``--target-model-dir``: llama.cpp sizes the scattered logits by it.
- ``specdec.eagle3``: a JSON string (tree settings, target record, layers as given, and the
  exact ``rope_theta`` and ``rms_norm_eps``, which the keys hold as float32) that llama.cpp
  ignores and that makes an export read back as the same checkpoint.

The draft takes the target's token embedding, as specdec's EAGLE-3 does: no ``token_embd``.

This module holds the format's names and its rotary row order; ``llamacpp_write`` writes the
file (with the target's vocabulary from ``llamacpp_vocab``) and ``llamacpp_read`` reads it back.
"""

from __future__ import annotations

import numpy as np

from specdec.errors import require
from specdec_eagle3.config import Eagle3Config, default_hidden_layers

__all__ = [
    "ARCH",
    "FILE_NAMES",
    "FILE_TYPES",
    "SPECDEC_KEY",
    "TENSOR_NAMES",
    "default_extract_layers",
    "gguf_module",
    "permute",
    "rotary_heads",
    "unpermute",
]

ARCH = "eagle3"  # LLM_ARCH_EAGLE3
SPECDEC_KEY = "specdec.eagle3"
TENSOR_NAMES = {  # specdec name -> llama.cpp name (conversion/llama.py, src/llama-arch.cpp)
    "fc.weight": "fc.weight",
    "midlayer.input_layernorm.weight": "blk.0.attn_norm.weight",
    "midlayer.hidden_norm.weight": "blk.0.attn_norm_2.weight",
    "midlayer.self_attn.q_proj.weight": "blk.0.attn_q.weight",
    "midlayer.self_attn.k_proj.weight": "blk.0.attn_k.weight",
    "midlayer.self_attn.v_proj.weight": "blk.0.attn_v.weight",
    "midlayer.self_attn.o_proj.weight": "blk.0.attn_output.weight",
    "midlayer.post_attention_layernorm.weight": "blk.0.ffn_norm.weight",
    "midlayer.mlp.gate_proj.weight": "blk.0.ffn_gate.weight",
    "midlayer.mlp.up_proj.weight": "blk.0.ffn_up.weight",
    "midlayer.mlp.down_proj.weight": "blk.0.ffn_down.weight",
    "norm.weight": "output_norm.weight",
    "lm_head.weight": "output.weight",
    "d2t": "d2t",
}
FILE_NAMES = {
    "float32": "eagle3-f32.gguf",
    "float16": "eagle3-f16.gguf",
    "bfloat16": "eagle3-bf16.gguf",
}
FILE_TYPES = {"float32": "ALL_F32", "float16": "MOSTLY_F16", "bfloat16": "MOSTLY_BF16"}


def gguf_module():
    """The ``gguf`` package (its container reader and writer), or the install line."""
    return require("gguf", extra="hf", feature="reading or writing llama.cpp's GGUF")


def permute(weights: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp's row order of a q (heads = query heads) or k (heads = key/value heads)
    projection: each head's two rotary halves interleaved (``LlamaModel.permute``)."""
    rows = weights.shape[0]
    return (
        weights.reshape(heads, 2, rows // heads // 2, *weights.shape[1:])
        .swapaxes(1, 2)
        .reshape(weights.shape)
    )


def unpermute(weights: np.ndarray, heads: int) -> np.ndarray:
    """The inverse of ``permute``: back to the Hugging Face row order."""
    rows = weights.shape[0]
    return (
        weights.reshape(heads, rows // heads // 2, 2, *weights.shape[1:])
        .swapaxes(1, 2)
        .reshape(weights.shape)
    )


def rotary_heads(config: Eagle3Config) -> dict[str, int]:
    """The projections whose rows ``permute`` reorders, with their head counts."""
    return {
        "midlayer.self_attn.q_proj.weight": config.num_heads,
        "midlayer.self_attn.k_proj.weight": config.num_kv_heads,
    }


def default_extract_layers(num_layers: int) -> list[int]:
    """llama.cpp's default ``extract_layers`` for a target of ``num_layers`` layers: specdec's
    default three as input-of-layer ids (the converter's ``[2, L//2, L-3]`` from 8 layers up)."""
    return [i + 1 for i in default_hidden_layers(num_layers)]
