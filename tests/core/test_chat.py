"""Chat prompts are rendered with the model's own template before tokenising."""

from __future__ import annotations

import shutil

import pytest

import specdec
from specdec.generation.chat import load_chat_template, render_chat

TEMPLATE = (
    "{% for m in messages %}{{ m['role'] }} says {{ m['content'] }} {% endfor %}"
    "{% if add_generation_prompt %}assistant says{% endif %}"
)


def test_render_chat():
    text = render_chat(TEMPLATE, [{"role": "user", "content": "hello"}])
    assert text == "user says hello assistant says"
    with pytest.raises(specdec.InvalidInputError, match="needs the model's chat template"):
        render_chat(None, [{"role": "user", "content": "hello"}])


def test_generate_renders_messages(model_dir, tmp_path):
    folder = tmp_path / "chat-model"
    shutil.copytree(model_dir, folder)
    (folder / "chat_template.jinja").write_text(TEMPLATE)
    assert load_chat_template(folder) == TEMPLATE
    messages = [{"role": "user", "content": "hello"}]
    chat = specdec.generate(folder, messages, drafter="none", backend="numpy", max_new_tokens=4)
    target = specdec.load(folder, backend="numpy")
    text = specdec.generate(
        target, render_chat(TEMPLATE, messages), drafter="none", backend="numpy", max_new_tokens=4
    )
    assert chat.tokens == text.tokens
    batch = specdec.generate(
        target, [messages, messages], drafter="none", backend="numpy", max_new_tokens=4
    )
    assert batch.tokens == [text.tokens, text.tokens]
