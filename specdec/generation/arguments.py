"""Checks of ``generate`` / ``stream`` arguments made up front, before any model is loaded or
memory allocated, each naming the argument and what it accepts."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from specdec.generation.chat import is_messages
from specdec.errors import InvalidInputError
from specdec.plugins.export import is_checkpoint_file
from specdec.types import SamplingConfig

PROMPT_KINDS = (
    "a string, a list of token ids, a chat (a list of {'role', 'content'} messages), or a list of "
    "those"
)


def is_int(value) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, bool)


def sampling_config(temperature, top_k, top_p) -> SamplingConfig:
    if isinstance(temperature, bool) or not isinstance(temperature, (int, float, np.number)):
        raise InvalidInputError(
            f"temperature must be a number >= 0 (0 = greedy), got {temperature!r}"
        )
    if top_p is not None and (
        isinstance(top_p, bool) or not isinstance(top_p, (int, float, np.number))
    ):
        raise InvalidInputError(f"top_p must be a number in (0, 1] or None, got {top_p!r}")
    try:
        return SamplingConfig(temperature=temperature, top_k=top_k, top_p=top_p)
    except (ValueError, TypeError) as exc:
        raise InvalidInputError(str(exc)) from None


def check_max_new_tokens(max_new_tokens) -> int:
    if not is_int(max_new_tokens) or max_new_tokens < 1:
        raise InvalidInputError(f"max_new_tokens must be an integer >= 1, got {max_new_tokens!r}")
    return int(max_new_tokens)


def check_seed(seed, batch_size: int | None = None) -> None:
    """None, an integer >= 0, or (for a batch) one integer >= 0 per row."""
    if seed is None:
        return
    if is_int(seed):
        if seed < 0:
            raise InvalidInputError(
                f"seed must be an integer >= 0 or a list of them (one per row), got {seed!r}"
            )
        return
    if (
        not isinstance(seed, (Sequence, np.ndarray))
        or isinstance(seed, (str, bytes))
        or not all(is_int(s) and s >= 0 for s in seed)
    ):
        raise InvalidInputError(
            f"seed must be an integer >= 0 or a list of them (one per row), got {seed!r}"
        )
    if batch_size is not None and len(seed) != batch_size:
        raise InvalidInputError(
            f"seed lists {len(seed)} seeds for a batch of {batch_size} prompts: give one per row"
        )


def check_flag(value, name: str) -> bool:
    """``value`` as a bool, after checking it is one (True, False or a NumPy bool): a string such
    as "no" is refused, naming the argument."""
    if not isinstance(value, (bool, np.bool_)):
        raise InvalidInputError(f"{name} must be True or False, got {value!r}")
    return bool(value)


def check_text(text: str, where: str) -> str:
    """``text`` after checking it is Unicode text a tokenizer can encode: a lone surrogate (what
    Python makes of bytes that are not UTF-8 with errors="surrogateescape", as it reads the
    command line) is refused, naming where it is."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise InvalidInputError(
            f"{where} holds {text[exc.start]!r} at character {exc.start}, a lone surrogate that "
            "is not Unicode text (bytes that were not UTF-8, decoded with surrogateescape): "
            "give the text as UTF-8"
        ) from None
    return text


def token_array(prompt: np.ndarray, where: str) -> list:
    """A NumPy array prompt as token ids: 1-D integers are one prompt's ids, 2-D integers a batch
    of rows; anything else is refused, naming what it is."""
    if not np.issubdtype(prompt.dtype, np.integer):
        raise InvalidInputError(
            f"{where} is a NumPy array of {prompt.dtype}: token ids must be integers (or pass "
            "text as a str)"
        )
    if prompt.ndim not in (1, 2):
        raise InvalidInputError(
            f"{where} is a NumPy array of shape {prompt.shape}: give token ids as a 1-D array, "
            "or a batch as a 2-D array (one row per prompt)"
        )
    return prompt.tolist()


def plain_prompt(prompt):
    """``prompt`` with NumPy arrays (the prompt, or rows of a batch) made lists of ints
    (``token_array``)."""
    if isinstance(prompt, np.ndarray):
        return token_array(prompt, "the prompt")
    if isinstance(prompt, list) and any(isinstance(p, np.ndarray) for p in prompt):
        return [
            token_array(p, f"prompt {row} of the batch") if isinstance(p, np.ndarray) else p
            for row, p in enumerate(prompt)
        ]
    return prompt


def _check_one_prompt(prompt, where: str) -> None:
    if isinstance(prompt, bytes):
        raise InvalidInputError(
            f"{where} is bytes: decode it to a str for a text prompt, or pass a list of token ids"
        )
    if isinstance(prompt, str):
        check_text(prompt, where)
        return
    if is_messages(prompt):
        return
    if not isinstance(prompt, Sequence):
        raise InvalidInputError(
            f"{where} must be {PROMPT_KINDS}; got {type(prompt).__name__} {prompt!r:.60}"
        )


def check_prompt_type(prompt) -> None:
    """The prompt is one of the accepted kinds (contents are checked once encoded); NumPy arrays
    are token ids (``plain_prompt``)."""
    prompt = plain_prompt(prompt)
    _check_one_prompt(prompt, "the prompt")
    if (
        isinstance(prompt, Sequence)
        and not isinstance(prompt, str)
        and not is_messages(prompt)
        and len(prompt)
        and not is_int(prompt[0])
    ):
        for row, p in enumerate(prompt):
            _check_one_prompt(p, f"prompt {row} of the batch")


def context_length(target) -> int | None:
    """The number of positions the target's model holds, when it says."""
    value = getattr(target, "context_length", None) or getattr(
        getattr(target, "config", None), "max_position_embeddings", None
    )
    return int(value) if is_int(value) and value > 0 else None


def check_fits_context(
    prompts: list[list[int]], max_new_tokens: int, limit: int | None, *, batched: bool
) -> None:
    """Every prompt plus max_new_tokens fits in the model's context of ``limit`` positions
    (None: unknown)."""
    if limit is None:
        return
    limit = int(limit)
    for row, prompt in enumerate(prompts):
        where = f"prompt {row} of the batch" if batched else "the prompt"
        if len(prompt) >= limit:
            raise InvalidInputError(
                f"{where} has {len(prompt)} tokens; the model's context holds {limit}: shorten it"
            )
        if len(prompt) + max_new_tokens > limit:
            raise InvalidInputError(
                f"max_new_tokens={max_new_tokens} after {where} of {len(prompt)} tokens exceeds "
                f"the model's context of {limit} tokens: ask for at most {limit - len(prompt)}"
            )


def looks_like_path(value) -> bool:
    if isinstance(value, Path):
        return True
    return isinstance(value, str) and (
        os.sep in value or "/" in value or value.startswith((".", "~"))
    )


def check_drafter_path(drafter: Any, names: list[str] | None = None) -> None:
    """A drafter given as a path must be an existing checkpoint folder, or a file that a
    drafter's layout reads (``specdec.plugins.export.is_checkpoint_file``); ``names``: the
    installed drafters, offered instead."""
    if looks_like_path(drafter):
        path = Path(drafter).expanduser()
        if not path.exists():
            offered = f" ({', '.join(names)})" if names else ""
            raise InvalidInputError(
                f"drafter checkpoint folder {path} does not exist; pass a folder with config.json "
                f"and model.safetensors, or an installed drafter's name{offered}"
            )
        if not path.is_dir() and not is_checkpoint_file(path):
            raise InvalidInputError(
                f"drafter {path} is a file: pass the checkpoint folder that holds it"
            )
