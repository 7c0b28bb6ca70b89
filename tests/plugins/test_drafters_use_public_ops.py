"""Drafters reach a backend only through its public array operations: every module under drafters/
and examples/ imports no module of a backend package (backends/) but ``<backend>.ops``, names no
other one in a string (lazy factories), and takes from ``ops`` only names in its ``__all__``.

Read with ``ast`` (nothing is imported), so the check runs without torch or mlx installed.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BACKENDS = sorted(p.name for p in (ROOT / "backends").iterdir() if (p / "__init__.py").is_file())
SKIPPED_PARTS = {"__pycache__", "build", "dist", ".venv"}


def public_names(backend: str) -> set[str]:
    """The ``__all__`` of ``backends/<backend>/ops.py``, read from its source."""
    path = ROOT / "backends" / backend / "ops.py"
    for node in ast.parse(path.read_text(), str(path)).body:
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets
        ):
            return set(ast.literal_eval(node.value))
    raise AssertionError(f"{path.relative_to(ROOT)} has no __all__ = [...]")


def drafter_sources() -> list[Path]:
    return sorted(
        path
        for folder in ("drafters", "examples")
        for path in (ROOT / folder).rglob("*.py")
        if not SKIPPED_PARTS & set(path.parts)
        and not any(p.endswith(".egg-info") for p in path.parts)
    )


def private_uses(source: str, filename: str, public: dict[str, set[str]]) -> list[str]:
    """``filename:line: why`` for each use of a backend other than the names of its public ops."""
    tree = ast.parse(source, filename)
    backends = "|".join(map(re.escape, public))
    dotted = re.compile(rf"^({backends})\.(\w+)")
    found: list[tuple[int, str]] = []
    bound: dict[str, set[str]] = {}  # local name of an ops module -> the backends it was bound to

    def refuse(node: ast.AST, why: str) -> None:
        found.append((node.lineno, f"{filename}:{node.lineno}: {why}"))

    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                package, *rest = alias.name.split(".")
                if package not in public:
                    continue
                if rest != ["ops"]:
                    refuse(node, f"imports {alias.name} (only {package}.ops is public)")
                elif alias.asname:
                    bound.setdefault(alias.asname, set()).add(package)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            package, *rest = node.module.split(".")
            if package not in public:
                continue
            if rest == ["ops"]:
                for alias in node.names:
                    if alias.name != "*" and alias.name not in public[package]:
                        refuse(
                            node,
                            f"takes {alias.name} from {package}.ops, which is not in its __all__",
                        )
            elif not rest:
                for alias in node.names:
                    if alias.name == "ops":
                        bound.setdefault(alias.asname or "ops", set()).add(package)
                    else:
                        refuse(
                            node,
                            f"imports {alias.name} from {package} (only {package}.ops is public)",
                        )
            else:
                refuse(node, f"imports from {node.module} (only {package}.ops is public)")
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            match = dotted.match(node.value)
            if match and match.group(2) != "ops":
                refuse(
                    node,
                    f"names {match.group(0)} in a string (only {match.group(1)}.ops is public)",
                )
    for node in ast.walk(tree):
        if not isinstance(node, ast.Attribute):
            continue
        if isinstance(node.value, ast.Name) and node.value.id in bound:
            packages = bound[node.value.id]
        elif (
            isinstance(node.value, ast.Attribute)
            and node.value.attr == "ops"
            and isinstance(node.value.value, ast.Name)
            and node.value.value.id in public
        ):
            packages = {node.value.value.id}  # import specdec_torch.ops; specdec_torch.ops.NAME
        else:
            continue
        for package in sorted(packages):
            if node.attr not in public[package]:
                refuse(node, f"uses {package}.ops.{node.attr}, which is not in its __all__")
    return [why for _, why in sorted(found)]


def test_every_backend_has_a_public_ops_module():
    assert {"specdec_torch", "specdec_mlx"} <= set(BACKENDS)
    for backend in BACKENDS:
        assert public_names(backend), f"backends/{backend}/ops.py: __all__ is empty"


def test_the_backends_offer_the_same_operations():
    """Functions share names across backends; only the backends' own classes
    (e.g. a DraftTree subclass) differ."""
    names = {backend: public_names(backend) for backend in BACKENDS}
    shared = set.intersection(*names.values())
    for backend, own in names.items():
        extra = sorted(name for name in own - shared if not name[:1].isupper())
        assert not extra, f"{backend}.ops offers {extra}, which another backend's ops lacks"


def test_drafters_and_examples_use_only_public_backend_ops():
    public = {backend: public_names(backend) for backend in BACKENDS}
    sources = drafter_sources()
    assert any(path.parent.name == "specdec_redrafter" for path in sources)
    assert any("examples" in path.parts for path in sources)
    found = [
        problem
        for path in sources
        for problem in private_uses(path.read_text(), str(path.relative_to(ROOT)), public)
    ]
    assert not found, "drafter code reaches past the backends' public ops:\n" + "\n".join(found)


def test_the_check_finds_each_kind_of_private_use():
    public = {"specdec_torch": {"target_probs"}, "specdec_mlx": {"as_array"}}
    source = "\n".join(
        [
            "from specdec_torch.sampling import target_probs",  # 1: a private module
            "import specdec_mlx.backend",  # 2
            "from specdec_mlx import tree",  # 3: a private module by from-import
            "from specdec_torch.ops import target_probs, top",  # 4: a name outside __all__
            "from specdec_mlx import ops",
            "x = ops.as_array(1) + ops.to_mx(2)",  # 6: an attribute outside __all__
            "import specdec_torch.ops",
            "y = specdec_torch.ops.target_probs + specdec_torch.ops.greedy",  # 8
            "F = 'specdec_mlx.tree:PrefixTreeBuilder'",  # 9: a lazy factory's string
            "from specdec_torch import ops as tops",
            "z = tops.target_probs(1)",  # fine
            "import numpy",
        ]
    )
    found = private_uses(source, "x.py", public)
    assert [line.split(":")[1] for line in found] == ["1", "2", "3", "4", "6", "8", "9"], found
    assert "to_mx" in found[4] and "greedy" in found[5]
