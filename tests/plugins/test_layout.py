"""The core, the backends and the drafters import without cycles, the core names no drafter
plugin in its code, and no line of the Python code is longer than 100 characters.

The import graph is ``scripts/import_graph.py``'s (read with ``ast``, nothing imported; imports
inside functions count), so a cycle dodged by an import inside a function still fails here.
An import inside a function is there only to keep an optional dependency optional, and says
which in an ``# optional:`` comment.
"""

from __future__ import annotations

import ast
import importlib.util
import re
import subprocess
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def load_import_graph():
    path = ROOT / "scripts" / "import_graph.py"
    spec = importlib.util.spec_from_file_location("import_graph", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_no_import_cycle_in_the_core_backends_or_drafters():
    graph = load_import_graph()
    modules, arrows, _ = graph.graph([ROOT / "specdec", ROOT / "backends", ROOT / "drafters"])
    assert {"specdec.decode.loop", "specdec_torch.backend"} <= set(modules), sorted(modules)[:10]
    groups = graph.cycles(arrows)
    assert not groups, "import cycles:\n" + "\n".join(" <-> ".join(group) for group in groups)


def test_no_import_cycle_between_packages():
    """Each package directly under a folder drawn as one node (``specdec.decode.*`` as
    ``specdec.decode``): no two packages import each other, even through different modules."""
    graph = load_import_graph()
    bad, nodes = [], set()
    for folder in ("specdec", "backends", "drafters"):
        modules, arrows, _ = graph.graph([ROOT / folder])
        here, outer = graph.packages(modules, arrows)
        nodes |= here
        bad += [" <-> ".join(group) for group in graph.cycles(outer)]
    assert {"specdec.decode", "specdec.plugins", "specdec_torch"} <= nodes, sorted(nodes)[:10]
    assert not bad, "import cycles between packages:\n" + "\n".join(bad)


def test_the_cycle_finder_finds_a_planted_cycle():
    graph = load_import_graph()
    arrows = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert graph.cycles(arrows) == [["a", "b", "c"]]


def test_imports_inside_functions_name_the_optional_dependency_they_keep_optional():
    graph = load_import_graph()
    inside, unmarked = [], []
    for folder in ("specdec", "backends", "drafters"):
        inside += graph.imports_inside_functions(ROOT / folder)
        unmarked += graph.unmarked_imports(ROOT / folder)
    assert inside, "found no import inside a function: the checker reads nothing"
    found = [f"{path.relative_to(ROOT)}:{line}: {statement}" for path, line, statement in unmarked]
    assert not found, (
        "imports inside functions without '# optional: <dependency> (<extra>)' on their line or "
        "the line above; move each to the top of its module unless it keeps an optional "
        "dependency (torch, mlx, transformers, matplotlib, starlette, ...) optional:\n"
        + "\n".join(found)
    )


def test_the_import_checker_finds_a_planted_unmarked_import(tmp_path):
    graph = load_import_graph()
    package = tmp_path / "planted"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "mod.py").write_text(
        textwrap.dedent(
            """\
            import os


            def marked():
                import torch  # optional: torch (torch extra)

                # optional: matplotlib (bench extra)
                import matplotlib.pyplot as plt
                from specdec_torch.ops import (  # optional: torch (torch extra)
                    top_k_lowest_index,
                )
                return torch, plt, top_k_lowest_index


            def unmarked():
                import json

                def inner():
                    from pathlib import Path  # optional torch

                return json, inner, lambda: __import__("os")


            class Holder:
                import re  # a class body runs at import: not inside a function

                def method(self):
                    # optional: torch (torch extra)

                    import numpy  # the comment above is not directly above
                    return numpy
            """
        )
    )
    found = [(path.name, line) for path, line, _ in graph.unmarked_imports(package)]
    assert found == [("mod.py", 16), ("mod.py", 19), ("mod.py", 30)], found
    inside = graph.imports_inside_functions(package)
    assert len(inside) == 6, inside


def test_each_core_folder_says_in_one_line_what_lives_there():
    faces = {
        "specdec/bench/__init__.py",
        "specdec/testing/__init__.py",  # public faces
        "specdec/training/__init__.py",
        "specdec/serving/__init__.py",
    }
    bad = []
    for init in sorted((ROOT / "specdec").glob("*/__init__.py")):
        name = str(init.relative_to(ROOT))
        text = init.read_text()
        if name in faces:
            continue
        tree = ast.parse(text)
        if len(text.splitlines()) != 1 or len(tree.body) != 1 or ast.get_docstring(tree) is None:
            bad.append(f"{name}: not a one-line docstring")
    assert not bad, "\n".join(bad)


def drafter_plugin_names() -> set[str]:
    """The entry-point names of the drafter packages (``drafters/``) in pyproject.toml."""
    text = (ROOT / "pyproject.toml").read_text()
    section = text.split("[project.entry-points.specdec]", 1)[1].split("\n[", 1)[0]
    points = dict(re.findall(r'^(\w+)\s*=\s*"([\w.]+)"', section, re.M))
    return {
        name
        for name, target in points.items()
        if (ROOT / "drafters" / target.split(".")[0]).is_dir()
    }


# Where the core names a drafter plugin today: the public default drafter and the CLI's shipped
# choices. Each is a site to move behind the registry; a new one fails the test.
KNOWN = {
    ("specdec/generation/api.py", "redrafter"): "generate's and stream's default drafter",
    ("specdec/serving/engine.py", "redrafter"): "Engine's default drafter",
    ("specdec/cli/decode.py", "redrafter"): "the CLI's default drafter and the demo's drafters",
    ("specdec/cli/decode.py", "medusa"): "the demo's second drafter",
    ("specdec/cli/decode.py", "eagle"): "the demo's third drafter",
    ("specdec/cli/measure.py", "redrafter"): "bench's and plan's default drafter",
    ("specdec/cli/measure.py", "medusa"): "bench's second default method",
    ("specdec/cli/serve.py", "redrafter"): "specdec serve's default drafter",
    ("specdec/plugins/export.py", "eagle"): "the message that EAGLE has no export layout",
    ("specdec/bench/methods.py", "draft_model"): "bench's draft-model method",
    ("specdec/generation/options.py", "draft_model"): "the short name draft= of draft_model=",
    ("specdec/bench/peers.py", "draft_model"): "transformers' assisted generation beside it",
}


def test_no_core_module_names_a_drafter_plugin_in_its_code():
    names = drafter_plugin_names()
    assert {"redrafter", "medusa"} <= names, names
    found = set()
    for path in sorted((ROOT / "specdec").rglob("*.py")):
        tree = ast.parse(path.read_text(), str(path))
        holders = (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)
        docstrings = {
            id(node.body[0].value)
            for node in ast.walk(tree)
            if isinstance(node, holders) and ast.get_docstring(node, clean=False) is not None
        }
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Constant)
                and isinstance(node.value, str)
                and id(node) not in docstrings
            ):
                hits = {n for n in names if node.value.lower() == n}
            elif isinstance(node, ast.Name):
                hits = {n for n in names if node.id == n}
            else:
                continue
            found |= {(str(path.relative_to(ROOT)), n, node.lineno) for n in hits}
    new = sorted(
        f"{file}:{line}: {name!r}" for file, name, line in found if (file, name) not in KNOWN
    )
    assert not new, "the core names drafter plugins (reach them through the registry):\n" + (
        "\n".join(new)
    )
    named = {(file, name) for file, name, _ in found}
    gone = sorted(f"{file}: {name!r}" for file, name in KNOWN if (file, name) not in named)
    assert not gone, "no longer named, drop from KNOWN:\n" + "\n".join(gone)


LINE_LIMIT = 100  # characters, as pyproject.toml's [tool.ruff] line-length
LINE_FOLDERS = ("specdec", "backends", "drafters", "tests", "benchmarks", "examples", "scripts")
NOT_SOURCE = {".git", ".venv", "venv", "build", "dist", "__pycache__", ".pytest_cache", ".tox"}


def python_files() -> list[Path]:
    """The .py files git tracks under ``LINE_FOLDERS``; without git (or outside a checkout) every
    .py file under them, less virtual environments, build outputs and caches."""
    try:
        listed = subprocess.run(
            ["git", "ls-files", "-z", "--", *LINE_FOLDERS],
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.split("\0")
    except (OSError, subprocess.CalledProcessError):
        listed = []
    files = [ROOT / name for name in listed if name.endswith(".py") and (ROOT / name).is_file()]
    if files:
        return files
    return [
        path
        for folder in LINE_FOLDERS
        for path in sorted((ROOT / folder).rglob("*.py"))
        if not any(
            part in NOT_SOURCE or part.endswith(".egg-info")
            for part in path.relative_to(ROOT).parts
        )
    ]


def long_lines(paths, limit: int = LINE_LIMIT) -> list[str]:
    """``file:line: N characters`` for every line of ``paths`` longer than ``limit`` characters."""
    found = []
    for path in map(Path, paths):
        text = path.read_text(encoding="utf-8")
        for number, line in enumerate(text.split("\n"), 1):
            line = line.rstrip("\r")
            if len(line) > limit:
                name = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path
                found.append(f"{name}:{number}: {len(line)} characters")
    return found


def test_no_python_line_is_longer_than_the_limit():
    files = python_files()
    assert ROOT / "specdec" / "decode" / "loop.py" in files, f"{len(files)} files found"
    found = long_lines(files)
    assert not found, f"lines longer than {LINE_LIMIT} characters (wrap them):\n" + "\n".join(found)


def test_the_line_check_names_a_planted_long_line(tmp_path):
    fits = "# " + "é" * (LINE_LIMIT - 2)  # counted in characters, not UTF-8 bytes
    over = "y = 2  # " + "w" * (LINE_LIMIT - 8)
    path = tmp_path / "planted.py"
    path.write_text(f"x = 1\n{fits}\n{over}\n", encoding="utf-8")
    assert long_lines([path]) == [f"{path}:3: {LINE_LIMIT + 1} characters"]


def test_without_git_the_line_check_walks_the_folders(monkeypatch):
    def no_git(*args, **kwargs):
        raise OSError("git is not installed")

    monkeypatch.setattr(subprocess, "run", no_git)
    files = python_files()
    assert ROOT / "specdec" / "decode" / "loop.py" in files, f"{len(files)} files found"
    assert not [p for p in files if {".venv", "build", "__pycache__"} & set(p.parts)]


def test_no_tracked_file_is_one_the_repository_ignores():
    """Run records under ``runs/`` (ignored) were committed with a blanket add: a file git
    tracks though ``.gitignore`` names it is a stray."""
    try:
        done = subprocess.run(
            ["git", "-C", str(ROOT), "ls-files", "--cached", "--ignored", "--exclude-standard"],
            capture_output=True,
            text=True,
            check=True,
        )
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout (or no git)")
    assert done.stdout.split() == [], done.stdout
