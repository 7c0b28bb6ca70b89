"""Snippets of one corpus document each (a function, a paragraph, lines of a play) and the
``Prompt`` they become: shared by the corpus's templates (``specdec.training.corpus``) and its
open questions (``specdec.training.instructions``). Cached: a prompt re-reads only the
documents it draws."""

from __future__ import annotations

import ast
import functools
import re
import tarfile
from pathlib import Path
from typing import Sequence

import attrs
import numpy as np

MAX_CHARS = 600  # snippet length cap: keeps prompts around 200 tokens or fewer (prefill is costly)


@attrs.frozen(kw_only=True)
class Prompt:
    """One training prompt: ``messages`` (a one-turn chat), the ``source`` document and the
    ``template`` name it came from."""

    messages: tuple
    source: str
    template: str

    @property
    def text(self) -> str:
        return self.messages[-1]["content"]


@functools.lru_cache(maxsize=512)
def _functions(path: str) -> tuple[tuple[str, str, str, str], ...]:
    """(name, source, first docstring line, signature + docstring stub) of the functions in a file
    that fit in 4..30 lines and MAX_CHARS characters."""
    try:
        source = Path(path).read_text(encoding="utf-8")
        tree = ast.parse(source)
    except (SyntaxError, UnicodeDecodeError, ValueError, OSError):
        return ()
    lines = source.splitlines()
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) or node.end_lineno is None:
            continue
        span = lines[node.lineno - 1 - len(node.decorator_list) : node.end_lineno]
        if not 4 <= len(span) <= 30:
            continue
        indent = min(len(s) - len(s.lstrip()) for s in span if s.strip())
        code = "\n".join(s[indent:] for s in span)
        if len(code) > MAX_CHARS or node.name.startswith("__"):
            continue
        doc = (ast.get_docstring(node) or "").strip().split("\n")[0].strip().rstrip(".")
        stub = ""
        if doc and node.body and isinstance(node.body[0], ast.Expr):
            header = lines[node.lineno - 1 : node.body[0].end_lineno]
            stub = "\n".join(s[indent:] for s in header)
        found.append((node.name, code, doc, stub))
    return tuple(found)


_DIRECTIVE = re.compile(r"^\s*(\.\.|:|\+[-=+]|\|)")


_UNDERLINE = re.compile(r"^([=\-~^*#])\1{3,}\s*$")


@functools.lru_cache(maxsize=512)
def _paragraphs(path: str) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(prose paragraphs, section titles) of one reST file; directives, tables, literal blocks
    dropped."""
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except (UnicodeDecodeError, OSError):
        return (), ()
    titles = [
        lines[i - 1].strip()
        for i in range(1, len(lines))
        if _UNDERLINE.match(lines[i]) and lines[i - 1].strip()
    ]
    paragraphs, current = [], []
    for line in lines + [""]:
        if line.strip():
            current.append(line)
            continue
        text = " ".join(s.strip() for s in current)
        plain = current and not any(_DIRECTIVE.match(s) or _UNDERLINE.match(s) for s in current)
        if plain and not current[0].startswith(" ") and 120 <= len(text) <= MAX_CHARS:
            paragraphs.append(text)
        current = []
    titles = [t for t in titles if 3 <= len(t) <= 60 and not t.startswith((":", "."))]
    return tuple(paragraphs), tuple(titles)


@functools.lru_cache(maxsize=64)
def _play_lines(sdist: str, member: str) -> tuple[str, ...]:
    with tarfile.open(sdist) as archive:
        data = archive.extractfile(member).read().decode("utf-8", errors="replace")
    return tuple(line.rstrip() for line in data.splitlines())


def _play_title(lines: Sequence[str], fallback: str) -> str:
    first = next((s.strip() for s in lines if s.strip()), fallback)
    return first.title() if len(first) < 60 else fallback


def as_task(doc: str) -> str:
    """A docstring's summary line as the end of "... a function that <task>"."""
    return doc[:1].lower() + doc[1:] + "."


def _choose(rng: np.random.Generator, options: Sequence):
    return options[int(rng.integers(len(options)))]
