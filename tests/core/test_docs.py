"""The docs a third party follows: their code snippets run, every citation of the design
document points at one of its sections, and every relative link at a file and heading that exist.

Snippets: in docs/writing-a-drafter.md and docs/writing-a-backend.md, a ```python block whose
first line is ``# file: NAME`` is written to that file, one whose first line is ``# signatures``
is only compiled, and the other blocks run in order as one script, in a folder holding the files.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BLOCK = re.compile(r"```python\n(.*?)```", re.S)


def snippets(doc: str) -> tuple[dict[str, str], list[str], list[str]]:
    files, compiled, script = {}, [], []
    for block in BLOCK.findall((ROOT / doc).read_text()):
        first = block.splitlines()[0]
        if first.startswith("# file: "):
            files[first.removeprefix("# file: ").strip()] = block
        elif first.startswith("# signatures"):
            compiled.append(block)
        else:
            script.append(block)
    return files, compiled, script


def run_snippets(doc: str, folder: Path) -> subprocess.CompletedProcess:
    files, compiled, script = snippets(doc)
    for block in compiled:
        compile(block, doc, "exec")
    for name, text in files.items():
        (folder / name).write_text(text)
    (folder / "snippets.py").write_text("\n".join(script))
    env = {**os.environ, "PYTHONPATH": str(folder), "SPECDEC_CACHE": str(folder / "cache")}
    return subprocess.run(
        [sys.executable, "snippets.py"],
        cwd=folder,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )


def test_writing_a_drafter_snippets_run(tmp_path):
    done = run_snippets("docs/writing-a-drafter.md", tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr


def test_writing_a_backend_snippets_run(tmp_path):
    try:
        metadata.version("specdec-example-backend")
    except metadata.PackageNotFoundError:
        message = (
            "the backend page tests examples/specdec-example-backend: pip install -e it "
            "(scripts/test.sh does)"
        )
        if os.environ.get("SPECDEC_TEST_EXAMPLES") == "1":
            pytest.fail(message)
        pytest.skip(message)
    done = run_snippets("docs/writing-a-backend.md", tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr


def tracked_text_files() -> list[Path]:
    names = subprocess.run(
        ["git", "ls-files"], cwd=ROOT, capture_output=True, text=True
    ).stdout.split()
    if not names:
        pytest.skip("not a git checkout")
    return [
        ROOT / n
        for n in names
        if n.endswith((".md", ".py", ".sh", ".toml")) and (ROOT / n).is_file()
    ]


def test_design_citations_name_existing_sections():
    sections = {
        int(n) for n in re.findall(r"^## (\d+)\. ", (ROOT / "docs/design.md").read_text(), re.M)
    }
    assert sections == set(range(1, len(sections) + 1)), sorted(sections)
    cited = re.compile(r"design\.md,?\s+sections?\s+(\d+)(?:\s*-\s*(\d+))?")
    bad = []
    for path in tracked_text_files():
        text = path.read_text(errors="replace")
        if path.name != "test_docs.py":
            bad += [
                f"{path.relative_to(ROOT)}: cites DESIGN"
                for _ in re.findall(r"DESIGN section", text)
            ]
            bad += [
                f"{path.relative_to(ROOT)}: cites {m}"
                for m in re.findall(r"/work/shared\S*|cpu-limits\.md", text)
            ]
        for first, last in cited.findall(text):
            for n in range(int(first), int(last or first) + 1):
                if n not in sections:
                    bad.append(
                        f"{path.relative_to(ROOT)}: docs/design.md section {n} does not exist"
                    )
    assert not bad, "\n".join(bad)


def heading_anchors(path: Path) -> set[str]:
    """The anchors GitHub gives a Markdown file's headings (lower case, punctuation dropped,
    spaces as hyphens, a repeated heading numbered)."""
    found, seen, fenced = set(), {}, False
    for line in path.read_text().splitlines():
        if line.startswith("```"):
            fenced = not fenced
        heading = None if fenced else re.match(r"#+ (.*)", line)
        if heading:
            slug = re.sub(r"[^\w\- ]", "", heading.group(1).strip().lower()).replace(" ", "-")
            count = seen.get(slug, 0)
            seen[slug] = count + 1
            found.add(slug if count == 0 else f"{slug}-{count}")
    return found


def test_every_relative_link_names_an_existing_file_and_heading():
    bad = []
    for path in tracked_text_files():
        if path.suffix != ".md":
            continue
        for target in re.findall(r"\]\(([^)\s]+)\)", path.read_text()):
            if re.match(r"\w+://|mailto:", target):
                continue
            name, _, anchor = target.partition("#")
            linked = (path.parent / name).resolve() if name else path
            where = f"{path.relative_to(ROOT)}: ({target})"
            if not linked.exists():
                bad.append(f"{where}: no such file")
            elif anchor and linked.suffix == ".md" and anchor not in heading_anchors(linked):
                bad.append(f"{where}: no such heading")
    assert not bad, "\n".join(bad)
