"""Nothing under specdec/ imports or names a drafter or backend package: the core reaches its
plugins through the registry and the drafter specs only."""

from __future__ import annotations

import re
from pathlib import Path

import specdec

ROOT = Path(specdec.__file__).parent.parent
PLUGIN_PACKAGES = sorted(
    p.name
    for folder in ("drafters", "backends")
    for p in (ROOT / folder).iterdir()
    if (p / "__init__.py").is_file()
)


def test_the_plugin_packages_are_found():
    assert {"specdec_redrafter", "specdec_medusa", "specdec_torch", "specdec_mlx"} <= set(
        PLUGIN_PACKAGES
    )


def test_no_core_module_imports_or_names_a_plugin_package():
    pattern = re.compile(r"\b(" + "|".join(PLUGIN_PACKAGES) + r")\b")
    found = [
        f"{path.relative_to(ROOT)}:{number}: {line.strip()}"
        for path in sorted((ROOT / "specdec").rglob("*.py"))
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if pattern.search(line)
    ]
    assert not found, "the core names plugin packages:\n" + "\n".join(found)
