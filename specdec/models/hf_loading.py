"""``transformers.AutoModelForCausalLM.from_pretrained`` without its progress bar: a library call
prints nothing of its own (the caller's bars and lines say what happens)."""

from __future__ import annotations

from typing import Any


def from_pretrained_quietly(transformers: Any, source, **kwargs):
    """The model ``from_pretrained(source, **kwargs)`` loads, with transformers' weight-loading bar
    off for the call (restored after, as it was)."""
    logging = transformers.utils.logging
    was_enabled = logging.is_progress_bar_enabled()
    logging.disable_progress_bar()
    try:
        return transformers.AutoModelForCausalLM.from_pretrained(source, **kwargs)
    finally:
        if was_enabled:
            logging.enable_progress_bar()
