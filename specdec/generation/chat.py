"""Chat prompts: render a list of messages with the model's own chat template (Jinja)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Sequence

from specdec.errors import InvalidInputError


def load_chat_template(folder) -> str | None:
    """The chat template of a Hugging Face-format folder (``chat_template.jinja`` or
    ``tokenizer_config.json``), or None."""
    folder = Path(folder)
    if (folder / "chat_template.jinja").is_file():
        return (folder / "chat_template.jinja").read_text()
    config = folder / "tokenizer_config.json"
    if config.is_file():
        template = json.loads(config.read_text()).get("chat_template")
        return template if isinstance(template, str) else None
    return None


def is_messages(value: Any) -> bool:
    """True for a chat: a non-empty list of {"role": ..., "content": ...} dicts."""
    return (
        isinstance(value, Sequence)
        and not isinstance(value, str)
        and len(value) > 0
        and all(isinstance(m, dict) and "role" in m and "content" in m for m in value)
    )


def render_chat(
    template: str | None, messages: Sequence[dict], *, add_generation_prompt: bool = True
) -> str:
    """The prompt text of ``messages`` under ``template`` (sandboxed Jinja, as transformers renders
    it)."""
    if template is None:
        raise InvalidInputError(
            "a chat prompt needs the model's chat template, and this model has none; "
            "pass the prompt as text instead"
        )
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    return env.from_string(template).render(
        messages=list(messages), add_generation_prompt=add_generation_prompt
    )
