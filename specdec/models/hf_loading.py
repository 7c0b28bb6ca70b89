"""``transformers.AutoModelForCausalLM.from_pretrained`` without its progress bars: a library call
prints nothing of its own (the caller's bars and lines say what happens)."""

from __future__ import annotations

import contextlib
import functools
import importlib
from typing import Any

# transformers' GGUF reader draws its own tqdm bar ("Converting and de-quantizing GGUF
# tensors..."), outside the switch that turns its other bars off; in a log file it is a line of
# carriage returns
_GGUF_READER = "transformers.modeling_gguf_pytorch_utils"


@contextlib.contextmanager
def quiet_loading(transformers: Any):
    """Within the block, transformers' loading bars are off (restored after, as they were)."""
    logging = transformers.utils.logging
    was_enabled = logging.is_progress_bar_enabled()
    logging.disable_progress_bar()
    try:
        reader = importlib.import_module(_GGUF_READER)
    except ImportError:  # a transformers without GGUF support draws no such bar
        reader = None
    bar = getattr(reader, "tqdm", None)
    if bar is not None:
        reader.tqdm = functools.partial(bar, disable=True)
    try:
        yield
    finally:
        if bar is not None:
            reader.tqdm = bar
        if was_enabled:
            logging.enable_progress_bar()


def from_pretrained_quietly(transformers: Any, source, **kwargs):
    """The model ``from_pretrained(source, **kwargs)`` loads, with transformers' bars off for the
    call (``quiet_loading``)."""
    with quiet_loading(transformers):
        return transformers.AutoModelForCausalLM.from_pretrained(source, **kwargs)
