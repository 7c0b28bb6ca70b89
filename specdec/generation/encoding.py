"""Prompts as token ids: text (tokenized), token ids, chats (rendered with the model's chat
template), or a batch of those, each checked for emptiness and its ids' range."""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from specdec.errors import InvalidInputError
from specdec.generation.arguments import check_prompt_type, check_text, is_int, plain_prompt
from specdec.generation.chat import is_messages, render_chat


def encode_prompts(
    prompt: Any, tokenizer, vocab_size: int, *, chat_template: str | None = None
) -> tuple[list[list[int]], bool]:
    """Token-id prompts and whether the input was a batch; checks emptiness and id range.

    A prompt is text, token ids, or a chat (a list of {"role", "content"} messages, rendered with
    the model's chat template); a batch is a list of prompts.
    """
    check_prompt_type(prompt)
    prompt = plain_prompt(prompt)  # NumPy arrays of token ids as lists
    if (
        isinstance(prompt, str)
        or is_messages(prompt)
        or (isinstance(prompt, Sequence) and prompt and is_int(prompt[0]))
    ):
        prompts, batched = [prompt], False
    elif isinstance(prompt, Sequence) and len(prompt) > 0:
        prompts, batched = list(prompt), True
    else:
        raise InvalidInputError(
            "the prompt is empty: give a string, a list of token ids, or a list of those"
        )
    encoded = []
    for row, p in enumerate(prompts):
        where = f"prompt {row} of the batch" if batched else "the prompt"
        if is_messages(p):
            p = check_text(render_chat(chat_template, p), f"{where} (the rendered chat)")
        if isinstance(p, str):
            if tokenizer is None:
                raise InvalidInputError(
                    "a text prompt needs a tokenizer, and this model has none (no tokenizer.json "
                    "in its folder): pass token ids instead"
                )
            p = tokenizer.encode(p).ids
        ids = list(p) if isinstance(p, (Sequence, np.ndarray)) else None
        if not ids:
            raise InvalidInputError(f"{where} is empty: it needs at least one token")
        if not all(is_int(t) for t in ids):
            raise InvalidInputError(f"{where} must hold integer token ids, got {ids[:8]!r}")
        bad = [int(t) for t in ids if not 0 <= int(t) < vocab_size]
        if bad:
            raise InvalidInputError(
                f"{where} has token ids outside the vocabulary [0, {vocab_size}): {bad[:8]}"
            )
        encoded.append([int(t) for t in ids])
    return encoded, batched
