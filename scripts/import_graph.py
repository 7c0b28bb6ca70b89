"""The import graph of specdec's packages, read with ``ast`` (nothing is imported).

    python scripts/import_graph.py [--root CHECKOUT] [specdec backends drafters]

prints, per folder: modules, arrows (distinct importer -> imported module pairs, imports inside
functions counted), import cycles (strongly connected groups of modules) with the modules in
each, and the import statements inside functions, naming each one that lacks its
``# optional: <dependency> (<extra>)`` comment; then the same graph with each package
directly under a folder drawn as one node (``specdec.decode.*`` as ``specdec.decode``).
``tests/plugins/test_layout.py`` holds the tree to no cycle with it. An import of ``a.b`` is an
arrow to module ``a.b`` (its ``__init__`` when a package); the parent packages it also runs are
not arrows, so a package's ``__init__`` that only carries a docstring adds none.

An import inside a function is there only to keep an optional dependency optional (torch,
mlx, transformers, matplotlib, starlette, ...: imported directly, or through a module that
imports one at module level), and says so on its line or on a comment line right above it,
e.g. ``import torch  # optional: torch (torch extra)``; every other import is at the top.
``tests/plugins/test_layout.py`` holds the tree to no unmarked import either.
"""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SKIPPED_PARTS = {"__pycache__", "build", "dist", ".venv", "tests"}
FUNCTIONS = (ast.FunctionDef, ast.AsyncFunctionDef)
# The comment an import inside a function carries: the dependency it keeps optional, then in
# parentheses where that comes from (``# optional: torch (torch extra)``).
OPTIONAL = re.compile(r"#\s*optional: [\w.-]+(?:, [\w.-]+)* \(.+\)")


def module_files(folder: Path) -> dict[str, Path]:
    """``dotted.name -> path`` of every module of every package directly under ``folder``, or of
    ``folder`` itself when it is a package (``specdec/``)."""
    roots = (
        [folder]
        if (folder / "__init__.py").is_file()
        else [p for p in sorted(folder.iterdir()) if (p / "__init__.py").is_file()]
    )
    found: dict[str, Path] = {}
    for package in roots:
        for path in sorted(package.rglob("*.py")):
            if SKIPPED_PARTS & set(path.relative_to(package).parts):
                continue
            parts = (package.name, *path.relative_to(package).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            found[".".join(parts)] = path
    return found


def imports_of(name: str, path: Path, known: set[str]) -> list[tuple[str, int, bool]]:
    """``(imported module, line, inside a function)`` for each import in ``path`` of a module in
    ``known``."""
    tree = ast.parse(path.read_text(), str(path))
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: list[tuple[str, int, bool]] = []

    def resolve(dotted: str) -> str | None:
        while dotted and dotted not in known:
            dotted = dotted.rpartition(".")[0]
        return dotted or None

    def visit(node: ast.AST, inside: bool) -> None:
        for child in ast.iter_child_nodes(node):
            nested = inside or isinstance(child, FUNCTIONS + (ast.Lambda,))
            if isinstance(child, ast.Import):
                targets = [alias.name for alias in child.names]
            elif isinstance(child, ast.ImportFrom):
                base = child.module or ""
                if child.level:
                    anchor = package.split(".")[: len(package.split(".")) - child.level + 1]
                    base = ".".join(anchor + ([base] if base else []))
                targets = [
                    f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base
                    for alias in child.names
                ]
            else:
                visit(child, nested)
                continue
            for target in targets:
                module = resolve(target)
                if module is not None and module != name:
                    found.append((module, child.lineno, inside))

    visit(tree, False)
    return found


def graph(
    folders: list[Path],
) -> tuple[dict[str, Path], dict[str, set[str]], list[tuple[str, int, str]]]:
    """Modules, arrows (importer -> imported) and imports inside functions
    (``(module, line, imported)``) of the packages in ``folders``."""
    modules: dict[str, Path] = {}
    for folder in folders:
        modules.update(module_files(folder))
    arrows: dict[str, set[str]] = {name: set() for name in modules}
    inner: list[tuple[str, int, str]] = []
    for name, path in modules.items():
        for target, line, inside in imports_of(name, path, set(modules)):
            arrows[name].add(target)
            if inside:
                inner.append((name, line, target))
    return modules, arrows, inner


def cycles(arrows: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected groups of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[list[str]] = []

    def connect(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in sorted(arrows[node]):
            if target not in index:
                connect(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            group = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                group.append(member)
                if member == node:
                    break
            if len(group) > 1:
                groups.append(sorted(group))

    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10_000))
    for node in sorted(arrows):
        if node not in index:
            connect(node)
    return sorted(groups)


def function_imports(text: str, filename: str = "<source>") -> list[tuple[int, str, bool]]:
    """``(line, statement, marked)`` for each import statement inside a function (or a lambda, a
    class in a function, ...) of the source ``text``; ``marked``: it carries the ``# optional:``
    comment on one of its lines or on a comment line directly above."""
    tree = ast.parse(text, filename)
    lines = text.splitlines()
    found: list[tuple[int, str, bool]] = []

    def visit(node: ast.AST, inside: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if inside and isinstance(child, (ast.Import, ast.ImportFrom)):
                own = lines[child.lineno - 1 : child.end_lineno]
                above = lines[child.lineno - 2].strip() if child.lineno > 1 else ""
                marked = any(
                    "#" in line and OPTIONAL.search(line[line.index("#") :]) for line in own
                ) or (above.startswith("#") and OPTIONAL.fullmatch(above) is not None)
                found.append((child.lineno, " ".join(ast.unparse(child).split()), marked))
            visit(child, inside or isinstance(child, FUNCTIONS + (ast.Lambda,)))

    visit(tree, False)
    return found


def imports_inside_functions(folder: Path) -> list[tuple[Path, int, str, bool]]:
    """``(path, line, statement, marked)`` for every import statement inside a function under
    ``folder``, of any module (``function_imports``)."""
    return [
        (path, line, statement, marked)
        for path in module_files(folder).values()
        for line, statement, marked in function_imports(path.read_text(), str(path))
    ]


def unmarked_imports(folder: Path) -> list[tuple[Path, int, str]]:
    """The imports inside functions under ``folder`` without their ``# optional:`` comment."""
    return [
        (path, line, statement)
        for path, line, statement, marked in imports_inside_functions(folder)
        if not marked
    ]


def packages(
    modules: dict[str, Path], arrows: dict[str, set[str]]
) -> tuple[set[str], dict[str, set[str]]]:
    """The graph with every module of a package two levels down drawn as that package."""

    def node(name: str) -> str:
        parts = name.split(".")
        package = len(parts) > 2 or (len(parts) == 2 and modules[name].name == "__init__.py")
        return ".".join(parts[:2]) if package else name

    outer: dict[str, set[str]] = {}
    for name, targets in arrows.items():
        here = node(name)
        outer.setdefault(here, set()).update(node(t) for t in targets if node(t) != here)
    return set(outer), outer


def main(argv: list[str]) -> int:
    root = ROOT
    if argv[:1] == ["--root"]:
        root, argv = Path(argv[1]), argv[2:]
    for folder in argv or ["specdec", "backends", "drafters"]:
        modules, arrows, inner = graph([root / folder])
        groups = cycles(arrows)
        inside = imports_inside_functions(root / folder)
        unmarked = [(path, line, text) for path, line, text, marked in inside if not marked]
        print(
            f"{folder}/: {len(modules)} modules, {sum(map(len, arrows.values()))} arrows, "
            f"{len(groups)} cycles, {len(inside)} imports inside functions, "
            f"{len(unmarked)} without '# optional:'"
        )
        for group in groups:
            print("  cycle: " + " <-> ".join(group))
        for path, line, text in unmarked:
            print(f"  unmarked: {path.relative_to(root)}:{line}: {text}")
        nodes, outer = packages(modules, arrows)
        groups = cycles(outer)
        print(
            f"  by package: {len(nodes)} nodes, {sum(map(len, outer.values()))} arrows, "
            f"{len(groups)} cycles"
        )
        for group in groups:
            print("  cycle: " + " <-> ".join(group))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
