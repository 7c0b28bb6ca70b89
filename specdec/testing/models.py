"""Random Llama-family model folders in Hugging Face format, for tests and plugin authors.

The folders load in ``transformers.AutoModelForCausalLM.from_pretrained``, in the float64
reference (``specdec.reference.model.load_target``) and in any backend that reads that format.
Weights are scaled so that the next-token logits are decisive (standard deviation around 4),
which keeps float32 backends on the same argmax as the float64 reference.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np

from specdec.errors import InvalidInputError

_ARCHITECTURES = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM"}
LOGIT_SCALE = 4.0  # target standard deviation of the logits at a position
_CONSONANTS = "bdfgklmnprstvz"
_VOWELS = "aeiou"


def _made_up_word(index: int) -> str:
    """A unique lowercase pseudo-word for ``index``: its base-70 digits as consonant-vowel
    syllables."""
    syllables = [c + v for c in _CONSONANTS for v in _VOWELS]
    word, rest = "", index
    while True:
        word += syllables[rest % len(syllables)]
        rest //= len(syllables)
        if rest == 0 and len(word) >= 4:
            return word


def _write_tokenizer(folder: Path, vocab_size: int, eos_token_id: int | None) -> None:
    """A WordLevel tokenizer over made-up words; id 0 is ``<unk>``, the eos id (if any) ``</s>``."""
    from tokenizers import AddedToken, Tokenizer, models, pre_tokenizers

    vocab = {_made_up_word(i): i for i in range(vocab_size)}
    vocab = {word: i for word, i in vocab.items() if i != 0 and i != eos_token_id}
    vocab["<unk>"] = 0
    special = ["<unk>"]
    if eos_token_id is not None and eos_token_id != 0:
        vocab["</s>"] = eos_token_id
        special.append("</s>")
    tokenizer = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.add_special_tokens([AddedToken(token, special=True) for token in special])
    tokenizer.save(str(folder / "tokenizer.json"))
    (folder / "chat_template.jinja").write_text(CHAT_TEMPLATE)


# A plain "role: content" chat template, so chat prompts work on random models too.
CHAT_TEMPLATE = (
    "{% for message in messages %}{{ message['role'] }} {{ message['content'] }} {% endfor %}"
    "{% if add_generation_prompt %}assistant {% endif %}"
)


def make_random_model(
    path: str | os.PathLike,
    *,
    vocab_size: int,
    hidden_size: int,
    num_layers: int,
    num_heads: int,
    num_kv_heads: int,
    seed: int,
    intermediate_size: int | None = None,
    architecture: str = "llama",
    tie_word_embeddings: bool = True,
    eos_token_id: int | None = None,
    with_tokenizer: bool = False,
    max_position_embeddings: int = 4096,
) -> Path:
    """Write a random ``architecture`` ("llama" or "qwen2") model folder at ``path``.

    Files: ``config.json``, ``model.safetensors`` (float32), ``generation_config.json`` and,
    with ``with_tokenizer``, a WordLevel ``tokenizer.json`` and a plain chat template. Same
    arguments, same bytes. ``intermediate_size`` defaults to twice ``hidden_size``. Returns the
    folder.
    """
    from safetensors.numpy import save_file

    if architecture not in _ARCHITECTURES:
        raise InvalidInputError(
            f"architecture {architecture!r} is not supported; choose one of "
            f"{', '.join(_ARCHITECTURES)}"
        )
    if hidden_size % num_heads or num_heads % num_kv_heads or (hidden_size // num_heads) % 2:
        raise InvalidInputError(
            f"hidden_size ({hidden_size}) must split into num_heads ({num_heads}) heads of even "
            f"size, and num_heads must be a multiple of num_kv_heads ({num_kv_heads})"
        )
    if eos_token_id is not None and not 0 <= eos_token_id < vocab_size:
        raise InvalidInputError(
            f"eos_token_id {eos_token_id} is outside the vocabulary [0, {vocab_size})"
        )
    intermediate_size = intermediate_size or 2 * hidden_size
    head_dim = hidden_size // num_heads
    folder = Path(path)
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)

    def normal(*shape, std):
        return (rng.standard_normal(shape) * std).astype(np.float32)

    def norm_weight():
        return (1.0 + 0.1 * rng.standard_normal(hidden_size)).astype(np.float32)

    # Hidden states leave the final norm with unit RMS, so a head of std s gives logits of std
    # about s * sqrt(H); projections of std 1/sqrt(fan_in) keep every activation near unit scale.
    head_std = LOGIT_SCALE / np.sqrt(hidden_size)
    tensors = {
        "model.embed_tokens.weight": normal(
            vocab_size, hidden_size, std=head_std if tie_word_embeddings else 1.0
        )
    }
    q_out, kv_out = num_heads * head_dim, num_kv_heads * head_dim
    for i in range(num_layers):
        prefix = f"model.layers.{i}."
        tensors[prefix + "input_layernorm.weight"] = norm_weight()
        for name, rows in (("q_proj", q_out), ("k_proj", kv_out), ("v_proj", kv_out)):
            tensors[prefix + f"self_attn.{name}.weight"] = normal(
                rows, hidden_size, std=1 / np.sqrt(hidden_size)
            )
            if architecture == "qwen2":
                tensors[prefix + f"self_attn.{name}.bias"] = normal(rows, std=0.5)
        tensors[prefix + "self_attn.o_proj.weight"] = normal(
            hidden_size, q_out, std=1 / np.sqrt(q_out)
        )
        tensors[prefix + "post_attention_layernorm.weight"] = norm_weight()
        tensors[prefix + "mlp.gate_proj.weight"] = normal(
            intermediate_size, hidden_size, std=1 / np.sqrt(hidden_size)
        )
        tensors[prefix + "mlp.up_proj.weight"] = normal(
            intermediate_size, hidden_size, std=1 / np.sqrt(hidden_size)
        )
        tensors[prefix + "mlp.down_proj.weight"] = normal(
            hidden_size, intermediate_size, std=1 / np.sqrt(intermediate_size)
        )
    tensors["model.norm.weight"] = norm_weight()
    if not tie_word_embeddings:
        tensors["lm_head.weight"] = normal(vocab_size, hidden_size, std=head_std)
    save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})

    config = {
        "architectures": [_ARCHITECTURES[architecture]],
        "model_type": architecture,
        "vocab_size": vocab_size,
        "hidden_size": hidden_size,
        "intermediate_size": intermediate_size,
        "num_hidden_layers": num_layers,
        "num_attention_heads": num_heads,
        "num_key_value_heads": num_kv_heads,
        "head_dim": head_dim,
        "hidden_act": "silu",
        "max_position_embeddings": max_position_embeddings,
        "rms_norm_eps": 1e-6,
        "rope_theta": 10000.0,
        "rope_scaling": None,
        "tie_word_embeddings": tie_word_embeddings,
        "initializer_range": 0.02,
        "use_cache": True,
        "bos_token_id": None,
        "eos_token_id": eos_token_id,
        "torch_dtype": "float32",
    }
    if architecture == "llama":
        config.update(attention_bias=False, mlp_bias=False, pretraining_tp=1)
    else:
        config.update(use_sliding_window=False, sliding_window=None, max_window_layers=num_layers)
    (folder / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    generation = {"_from_model_config": True}
    if eos_token_id is not None:
        generation["eos_token_id"] = eos_token_id
    (folder / "generation_config.json").write_text(json.dumps(generation, indent=2) + "\n")
    if with_tokenizer:
        _write_tokenizer(folder, vocab_size, eos_token_id)
    return folder
