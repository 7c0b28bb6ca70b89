"""Chat prompts: render a list of messages with the model's own chat template (Jinja, in the
sandbox of ``specdec.generation.template_budget``: every render within a budget of steps and
sizes, so that a model folder's template can neither hang nor take all memory)."""

from __future__ import annotations

import functools
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from jinja2 import Template

from specdec.errors import InvalidInputError
from specdec.generation.template_budget import Budget, TemplateOverrun
from specdec.generation.template_sandbox import BudgetedEnvironment

# chats a template is rendered with once at load: one that runs over its budget on them is refused
SAMPLE_CHATS = (
    [{"role": "user", "content": "Hello!"}],
    [
        {"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": "What is 2 + 2?"},
        {"role": "assistant", "content": "4."},
        {"role": "user", "content": "And 3 + 3?"},
    ],
)
_ENVIRONMENT = BudgetedEnvironment(trim_blocks=True, lstrip_blocks=True)


class ChatTemplate(str):
    """A chat template's Jinja text; ``source`` names the file it came from."""

    source: str | None

    def __new__(cls, text: str, source: str | None = None):
        template = super().__new__(cls, text)
        template.source = source
        return template


class ChatTemplateError(InvalidInputError):
    """A chat template failed on the messages or ran over its budget. The message names the
    template's file (when known); ``detail`` says what happened without it (for a server's
    clients)."""

    def __init__(self, source: str | None, detail: str):
        super().__init__(f"{source}: {detail}" if source else detail)
        self.detail = detail


def load_chat_template(folder) -> ChatTemplate | None:
    """The chat template of a Hugging Face-format folder (``chat_template.jinja`` or
    ``tokenizer_config.json``), or None; refused (ChatTemplateError) when it runs over its
    budget on a sample chat."""
    folder = Path(folder)
    if (folder / "chat_template.jinja").is_file():
        path = folder / "chat_template.jinja"
        template = ChatTemplate(path.read_text(), str(path))
    else:
        config = folder / "tokenizer_config.json"
        if not config.is_file():
            return None
        text = json.loads(config.read_text()).get("chat_template")
        if not isinstance(text, str):
            return None
        template = ChatTemplate(text, f"{config} (chat_template)")
    check_chat_template(template)
    return template


def check_chat_template(template: str) -> None:
    """Render ``template`` with each of ``SAMPLE_CHATS``; raise ChatTemplateError when it runs over
    its budget (a template that refuses a sample, or does not compile, fails when used)."""
    for chat in SAMPLE_CHATS:
        try:
            render_chat(template, chat)
        except ChatTemplateError as error:
            if isinstance(error.__cause__, TemplateOverrun):
                raise ChatTemplateError(
                    _source(template),
                    f"the chat template {error.__cause__} on a sample chat of {len(chat)} "
                    "messages; fix or remove the template (real templates stay far within it)",
                ) from None


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
    it, within a budget). A template that fails or runs over its budget raises ChatTemplateError
    (one line, naming the template's file)."""
    if template is None:
        raise InvalidInputError(
            "a chat prompt needs the model's chat template, and this model has none; "
            "pass the prompt as text instead"
        )
    variables = {"messages": list(messages), "add_generation_prompt": add_generation_prompt}
    try:
        compiled = _compile(str(template))
        return _ENVIRONMENT.render(compiled, Budget.for_input(variables), **variables)
    except TemplateOverrun as error:
        raise ChatTemplateError(
            _source(template),
            f"the chat template {error} on these messages; fix the template or pass the prompt "
            "as text",
        ) from error
    except Exception as error:  # whatever a template raises is the template's failure
        raise ChatTemplateError(
            _source(template), f"the chat template refused these messages: {_describe(error)}"
        ) from error


@functools.lru_cache(maxsize=16)
def _compile(text: str) -> Template:
    return _ENVIRONMENT.from_string(text)


def _source(template: str) -> str | None:
    return getattr(template, "source", None)


def _describe(error: BaseException) -> str:
    """One line: the error's message and the template line it came from, when known."""
    message = getattr(error, "message", None) or str(error) or type(error).__name__
    line = getattr(error, "lineno", None)
    traceback = error.__traceback__
    while traceback is not None:
        if traceback.tb_frame.f_code.co_filename == "<template>":
            line = traceback.tb_lineno
        traceback = traceback.tb_next
    text = " ".join(str(message).split())
    if len(text) > 300:
        text = text[:300] + "..."
    return f"{text} (line {line})" if line else text
