"""Chat templates render within a budget (``specdec.generation.template_budget``): a template
that would loop for hours or take all memory is refused, at load when a sample chat shows it,
else when it renders; every template failure is one line naming the template's file; real
templates render as Jinja's own sandbox renders them."""

from __future__ import annotations

import shutil
import subprocess
import sys
import time

import pytest
from jinja2.sandbox import ImmutableSandboxedEnvironment

from specdec.generation.chat import ChatTemplate, ChatTemplateError, load_chat_template, render_chat
from specdec.testing.models import CHAT_TEMPLATE

CHAT = [{"role": "user", "content": "hello"}]
LOOPING = "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}"
# templates that would run for hours: loops, recursion, calls
HANGING = [
    LOOPING,
    "{% for i in range(99999) %}{% for j in range(99999) %}{{ '' }}{% endfor %}{% endfor %}",
    "{% for i in range(100000) %}{% for m in messages * 100000 %}{% endfor %}{% endfor %}",
    (
        "{% for x in range(300) recursive %}{% if loop.depth < 5 %}{{ loop(range(300)) }}"
        "{% endif %}{% endfor %}"
    ),
    "{% macro f(n) %}{% if n %}{{ f(n - 1) }}{{ f(n - 1) }}{% endif %}{% endmacro %}{{ f(60) }}",
    "{% set s = 'x' * 1000000 %}{% for i in range(100000) %}{{ s.count('y') }}{% endfor %}",
    (
        "{% set s = range(100000)|list %}{% for i in range(100000) %}{% if -1 in s %}{% endif %}"
        "{% endfor %}"
    ),
    "{% for i in range(100000) %}{% set l = range(100000)|list %}{% endfor %}",
]
# templates that would take all memory: products, widths, doublings, expansions
HUGE = [
    "{{ 'x' * 50000000 }}",
    "{{ [0] * 50000000 }}",
    "{{ 'x'|center(50000000) }}",
    "{{ 'x'.ljust(50000000) }}",
    "{{ '%050000000d' % 1 }}",
    "{{ '{:>50000000}'.format('x') }}",
    "{{ 10 ** (10 ** 9) }}",
    (
        "{% set ns = namespace(s='x') %}{% for i in range(60) %}{% set ns.s = ns.s ~ ns.s %}"
        "{% endfor %}"
    ),
    (
        "{% set ns = namespace(s=['x']) %}{% for i in range(60) %}{% set ns.s = [ns.s, ns.s] %}"
        "{% endfor %}{{ ns.s }}"
    ),
    (
        "{% set ns = namespace(s='x') %}{% for i in range(60) %}{% set ns.s %}{{ ns.s }}{{ ns.s }}"
        "{% endset %}{% endfor %}"
    ),
    "{% set s = 'x' * 10000 %}{{ s.replace('', s) }}",
    "{% set s = '\n' * 10000 %}{{ s|indent(10000) }}",
    "{{ range(100000)|join('x' * 10000) }}",
    "{{ ('\t' * 10000).expandtabs(10000) }}",
    "{{ ([[[[1]]]] * 10000)|tojson(indent=10000) }}",
]


def folder_with(model_dir, tmp_path, template: str):
    folder = tmp_path / "model"
    shutil.copytree(model_dir, folder)
    (folder / "chat_template.jinja").write_text(template)
    return folder


def one_line_naming(error: ChatTemplateError, source: str, *words: str) -> None:
    message = str(error)
    assert "\n" not in message and message.startswith(f"{source}: "), message
    for word in words:
        assert word in message, (word, message)


def test_a_looping_template_is_refused_at_load_within_seconds(model_dir, tmp_path):
    folder = folder_with(model_dir, tmp_path, LOOPING)
    started = time.monotonic()
    with pytest.raises(ChatTemplateError) as info:
        load_chat_template(folder)
    assert time.monotonic() - started < 30  # a hang check: refused at once, never in hours
    one_line_naming(info.value, str(folder / "chat_template.jinja"), "budget", "sample chat")


def test_a_memory_template_is_refused_at_load(model_dir, tmp_path):
    folder = folder_with(model_dir, tmp_path, "{{ 'x' * 20000000000 }}")
    with pytest.raises(ChatTemplateError) as info:
        load_chat_template(folder)
    one_line_naming(info.value, str(folder / "chat_template.jinja"), "budget", "sample chat")


@pytest.mark.parametrize("template", HANGING)
def test_templates_that_would_hang_are_refused_within_seconds(template):
    started = time.monotonic()
    with pytest.raises(ChatTemplateError) as info:
        render_chat(ChatTemplate(template, "model/chat_template.jinja"), CHAT)
    assert time.monotonic() - started < 30
    one_line_naming(info.value, "model/chat_template.jinja", "budget")


@pytest.mark.parametrize("template", HUGE)
def test_templates_that_would_take_all_memory_are_refused(template):
    with pytest.raises(ChatTemplateError) as info:
        render_chat(ChatTemplate(template, "model/chat_template.jinja"), CHAT)
    one_line_naming(info.value, "model/chat_template.jinja", "budget")


def test_a_template_that_overruns_only_on_long_chats_passes_load_and_is_refused_when_used(
    model_dir, tmp_path
):
    template = "{% if messages|length > 8 %}" + LOOPING + "{% endif %}" + CHAT_TEMPLATE
    folder = folder_with(model_dir, tmp_path, template)
    loaded = load_chat_template(folder)
    assert render_chat(loaded, CHAT) == "user hello assistant "
    with pytest.raises(ChatTemplateError) as info:
        render_chat(loaded, CHAT * 9)
    one_line_naming(info.value, str(folder / "chat_template.jinja"), "budget")


@pytest.mark.parametrize(
    ("template", "words"),
    [
        ("{{ messages.append(1) }}", ["unsafe", "line 1"]),
        ("{{ ''.__class__.__mro__[1].__subclasses__() }}", []),
        ("{% for m in messages %}\n{{ 1 // 0 }}{% endfor %}", ["division", "line 2"]),
        ("{% for %}", ["line 1"]),
        ("{{ raise_exception('roles must alternate') }}", ["roles must alternate"]),
    ],
)
def test_template_failures_are_one_line_naming_the_file(model_dir, tmp_path, template, words):
    folder = folder_with(model_dir, tmp_path, template)
    loaded = load_chat_template(folder)  # a template that fails a sample is not refused at load
    with pytest.raises(ChatTemplateError) as info:
        render_chat(loaded, CHAT)
    one_line_naming(info.value, str(folder / "chat_template.jinja"), "refused", *words)


def test_generate_chat_with_a_looping_template_is_one_line_on_stderr(model_dir, tmp_path):
    folder = folder_with(model_dir, tmp_path, LOOPING)
    argv = ["generate", "--model", str(folder), "--prompt", "hello", "--chat", "--drafter", "none"]
    done = subprocess.run(
        [sys.executable, "-m", "specdec.cli.main", *argv, "--backend", "numpy"],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1, done.stderr
    assert lines[0].startswith(f"specdec: error: {folder / 'chat_template.jinja'}: "), lines


CHATML = (
    "{% for message in messages %}{% if loop.first and message['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n' }}{% endif %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] | trim + '<|im_end|>' }}"
    "{{ '\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


@pytest.mark.parametrize("template", [CHAT_TEMPLATE, CHATML], ids=["random-model", "chatml"])
def test_real_templates_render_as_jinja_renders_them(template):
    jinja = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    chats = [
        CHAT,
        [{"role": "system", "content": "Be brief."}, *CHAT],
        [{"role": ["user", "assistant"][i % 2], "content": f"turn {i} " * 50} for i in range(2000)],
    ]
    for chat in chats:
        expected = jinja.from_string(template).render(messages=chat, add_generation_prompt=True)
        assert render_chat(template, chat) == expected
