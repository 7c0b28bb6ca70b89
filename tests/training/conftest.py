"""Fixtures for the training tests: a tiny random target, token-id prompts and its teacher data."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="training needs the 'train' extra (torch)")
pytest.importorskip("transformers", reason="training needs the 'train' extra (transformers)")

VOCAB, HIDDEN = 128, 32


def token_prompts(split: str, start: int, count: int, vocab: int = VOCAB) -> list[list[int]]:
    """Deterministic random token-id prompts of 3..11 tokens, independent per (split, index)."""
    prompts = []
    for i in range(start, start + count):
        rng = np.random.default_rng([11, 0 if split == "train" else 1, i])
        prompts.append([int(t) for t in rng.integers(4, vocab, size=int(rng.integers(3, 12)))])
    return prompts


UNPREDICTABLE_VOCAB = 64


def unpredictable_prompts(split: str, start: int, count: int) -> list[list[int]]:
    """``token_prompts`` for the vocabulary of ``unpredictable_model``."""
    return token_prompts(split, start, count, vocab=UNPREDICTABLE_VOCAB)


@pytest.fixture(autouse=True)
def seeded_torch():
    """Every test starts from the same global torch seed (random inputs are replayable)."""
    torch.manual_seed(0)


@pytest.fixture(scope="session")
def prompt_source():
    """``token_prompts``, for tests that build teacher data themselves."""
    return token_prompts


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory):
    """A random 2-layer llama folder (vocab 128, hidden 32, eos id 3), float32 weights."""
    from specdec.testing import make_random_model

    return make_random_model(
        tmp_path_factory.mktemp("train-model") / "llama",
        vocab_size=VOCAB,
        hidden_size=HIDDEN,
        num_layers=2,
        num_heads=4,
        num_kv_heads=2,
        seed=3,
        eos_token_id=3,
        with_tokenizer=True,
    )


@pytest.fixture(scope="session")
def tiny_target(tiny_model):
    from specdec.training.teacher import load_teacher_target

    torch.manual_seed(0)
    return load_teacher_target(tiny_model, dtype="float32")


@pytest.fixture(scope="session")
def tiny_data(tiny_target, tmp_path_factory):
    """Teacher data of both splits (float32 hidden states so acceptance checks are exact)."""
    from specdec.training.run import build_teacher_data

    datasets, stats, _ = build_teacher_data(
        tiny_target,
        prompts=48,
        heldout_prompts=8,
        max_new_tokens=20,
        top_k=8,
        seed=0,
        cache=tmp_path_factory.mktemp("train-cache"),
        prompt_source=token_prompts,
        hidden_dtype="float32",
        progress=False,
    )
    return datasets


@pytest.fixture(scope="session")
def unpredictable_prompt_source():
    """``unpredictable_prompts``, for training runs on ``unpredictable_model``."""
    return unpredictable_prompts


@pytest.fixture(scope="session")
def unpredictable_model(tmp_path_factory):
    """A random 1-layer llama (vocab 64, untied LM head) whose greedy text rarely repeats a token.

    With tied embeddings a random model mostly repeats its input token, which an untrained drafter
    (it starts out reading the target's distribution) predicts for free; with an independent head
    the next token is a fresh function of the context, so only a trained drafter predicts it.
    """
    from specdec.testing import make_random_model

    return make_random_model(
        tmp_path_factory.mktemp("unpredictable") / "llama",
        vocab_size=UNPREDICTABLE_VOCAB,
        hidden_size=HIDDEN,
        num_layers=1,
        num_heads=4,
        num_kv_heads=2,
        seed=3,
        eos_token_id=3,
        tie_word_embeddings=False,
        with_tokenizer=True,
    )
