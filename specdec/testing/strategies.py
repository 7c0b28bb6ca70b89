"""Hypothesis strategies for small worlds: prompts, beams, sampling settings, model shapes."""

from __future__ import annotations

import numpy as np
from hypothesis import strategies as st

from specdec.types import SamplingConfig


def prompts(
    vocab_size: int, *, max_batch: int = 3, max_length: int = 8
) -> st.SearchStrategy[list[list[int]]]:
    """A ragged batch of token-id prompts."""
    return st.lists(
        st.lists(st.integers(0, vocab_size - 1), min_size=1, max_size=max_length),
        min_size=1,
        max_size=max_batch,
    )


@st.composite
def beams(
    draw, *, max_batch: int = 3, max_width: int = 4, max_length: int = 5, alphabet: int = 3
) -> np.ndarray:
    """(B, W, L) int64 beams whose rows share their root; a small alphabet makes prefixes repeat."""
    batch = draw(st.integers(1, max_batch))
    width = draw(st.integers(1, max_width))
    length = draw(st.integers(1, max_length))
    flat = draw(
        st.lists(
            st.integers(0, alphabet - 1),
            min_size=batch * width * length,
            max_size=batch * width * length,
        )
    )
    out = np.array(flat, dtype=np.int64).reshape(batch, width, length)
    out[:, :, 0] = out[:, :1, 0]
    return out


@st.composite
def beam_lengths(draw, shape: tuple[int, int, int]) -> np.ndarray:
    """(B, W) int64 lengths in [1, L] for beams of ``shape`` (B, W, L) (``Draft.beam_lengths``)."""
    batch, width, length = shape
    flat = draw(st.lists(st.integers(1, length), min_size=batch * width, max_size=batch * width))
    return np.array(flat, dtype=np.int64).reshape(batch, width)


def sampling_configs(*, greedy: bool = True) -> st.SearchStrategy[SamplingConfig]:
    """Greedy (optionally) and temperature / top-k / top-p combinations."""
    sampled = st.builds(
        SamplingConfig,
        temperature=st.sampled_from([0.5, 0.8, 1.0, 1.5]),
        top_k=st.one_of(st.none(), st.integers(1, 8)),
        top_p=st.one_of(st.none(), st.sampled_from([0.5, 0.9, 1.0])),
    )
    return st.one_of(st.just(SamplingConfig()), sampled) if greedy else sampled


def model_shapes() -> st.SearchStrategy[dict]:
    """Keyword arguments for ``make_random_model`` describing tiny Llama-family models."""
    return st.fixed_dictionaries(
        {
            "vocab_size": st.sampled_from([48, 64, 96]),
            "hidden_size": st.sampled_from([16, 32]),
            "num_layers": st.integers(1, 2),
            "num_heads": st.sampled_from([2, 4]),
            "num_kv_heads": st.sampled_from([1, 2]),
            "architecture": st.sampled_from(["llama", "qwen2"]),
        }
    )
