"""The plugin host: entry points, registration, listing, clear errors. Fresh registries per test."""

from __future__ import annotations

import re
import subprocess
import sys
import types

import numpy as np
import pytest

import specdec
from specdec.errors import install_command
from specdec.plugins.registry import PluginRegistry
from specdec.plugins import builtin as numpy_plugin


def test_builtins_register_through_entry_points():
    registry = PluginRegistry(entry_points=True)
    assert "numpy" in registry.names("backend")
    assert {"none", "redrafter", "medusa"} <= set(registry.names("drafter", "numpy"))
    assert {"prefix_tree", "medusa_tree"} <= set(registry.names("tree_builder", "numpy"))
    verifiers = {
        r.name: r.lossless
        for r in registry.registrations
        if r.kind == "verifier" and r.backend == "numpy"
    }
    assert verifiers == {
        "greedy": True,
        "exact": True,
        "rejection": True,
        "redrafter_published": False,
        "typical": False,
    }
    packages = {row["package"] for row in registry.describe()}
    assert any(p.startswith("specdec ") for p in packages), packages


def test_third_party_plugin_adds_a_drafter():
    """A module with hookimpls is all a plugin needs; its drafter then works in generate()."""

    class RepeatRootDrafter:
        caps = specdec.DrafterCaps()

        def propose(self, context):
            roots = context.root_tokens
            return specdec.Draft(
                root_tokens=roots, beams=np.repeat(roots[:, None, None], 3, axis=2)
            )

    plugin = types.ModuleType("repeat_plugin")

    @specdec.hookimpl
    def specdec_register_drafters(register):
        register("repeat", "numpy", lambda target, checkpoint=None: RepeatRootDrafter())

    plugin.specdec_register_drafters = specdec_register_drafters
    registry = PluginRegistry([numpy_plugin, plugin])
    assert registry.names("drafter", "numpy") == ["lookup", "none", "repeat"]
    assert registry.distribution("repeat_plugin") == "local"
    assert "repeat" not in PluginRegistry([numpy_plugin]).names("drafter")


def test_unknown_and_unavailable_names():
    plugin = types.ModuleType("other_backend_plugin")

    @specdec.hookimpl
    def specdec_register_drafters(register):
        register("special", "otherbackend", lambda target, checkpoint=None: None)

    plugin.specdec_register_drafters = specdec_register_drafters
    registry = PluginRegistry([numpy_plugin, plugin])
    with pytest.raises(specdec.UnknownPluginError, match="installed backends: numpy"):
        registry.get("backend", "jax")
    with pytest.raises(
        specdec.UnknownPluginError,
        match="not available on backend 'numpy'; it is installed for: otherbackend",
    ):
        registry.get("drafter", "special", "numpy")


def test_verifier_must_declare_lossless():
    plugin = types.ModuleType("sloppy")

    @specdec.hookimpl
    def specdec_register_verifiers(register):
        register("sloppy", "numpy", object)

    plugin.specdec_register_verifiers = specdec_register_verifiers
    with pytest.raises(TypeError, match="without lossless"):
        PluginRegistry([plugin])


def test_import_loads_neither_torch_nor_mlx():
    code = (
        "import sys, specdec, specdec.plugins.builtin, specdec_redrafter.plugin, "
        "specdec_medusa.plugin;"
        "specdec.default_registry();"
        "bad = [m for m in ('torch', 'mlx', 'transformers', 'mlx_lm') if m in sys.modules];"
        "print(bad); sys.exit(1 if bad else 0)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, f"import specdec loaded {done.stdout.strip()} {done.stderr[-500:]}"


def test_cli_lists_plugins():
    done = subprocess.run(
        [sys.executable, "-m", "specdec.cli.main", "plugins"], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    for expected in (
        r"^backends:$",
        r"^  numpy  \(specdec ",
        r"^  redrafter \[numpy(, \w+)*\]  \(specdec [^,]+, plugin redrafter\)$",
        r"^  typical \[(\w+, )*numpy(, \w+)*\] LOSSY  \(",
        r"^  exact \[(\w+, )*numpy(, \w+)*\] lossless  \(",
    ):
        assert re.search(expected, done.stdout, re.M), (
            f"`specdec plugins` output lacks {expected!r}:\n{done.stdout}"
        )
    # one line per drafter a package registers for several backends (one per backend before)
    assert len(re.findall(r"^  redrafter ", done.stdout, re.M)) == 1


def test_cli_reports_unknown_backend_cleanly(tmp_path):
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "specdec.cli.main",
            "generate",
            "--model",
            str(tmp_path),
            "--prompt-ids",
            "[1]",
            "--backend",
            "nope",
        ],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 2 and "unknown backend 'nope'; installed backends:" in done.stderr, (
        done.stderr
    )


def test_ready_backends_leave_out_those_whose_framework_is_missing(monkeypatch):
    """``PluginRegistry.ready_backends`` lists the backends a kit run can use here; a backend
    whose framework does not import is left out, and building it says which extra to install in
    one plain sentence."""
    from specdec.plugins import support

    registry = specdec.default_registry()
    monkeypatch.setitem(support.FRAMEWORKS, "torch", (("no_such_framework_xyz",), "torch"))
    ready = registry.ready_backends()
    assert (
        "numpy" in ready and "torch" not in ready and set(ready) <= set(registry.names("backend"))
    )
    with pytest.raises(specdec.MissingDependencyError) as caught:
        support.backend_class("torch", {"torch": "x:Y"}, feature="the torch backend")
    message = str(caught.value)
    assert message.startswith("the torch backend needs the 'no_such_framework_xyz' package")
    assert "on the torch backend" not in message and install_command("torch") in message


def test_a_plugin_module_installed_and_passed_in_too_registers_once():
    """The kit's pre-install recipe, ``PluginRegistry([module], entry_points=True)``, run again
    after the module is installed: the module is one plugin, not a conflict."""
    from specdec.plugins import builtin

    registry = PluginRegistry([builtin], entry_points=True)
    assert registry.get("backend", "numpy").factory().name == "numpy"
    assert sum(r.kind == "backend" and r.name == "numpy" for r in registry.registrations) == 1


def test_a_folder_named_like_a_drafter_leaves_the_name_to_the_plugin(tmp_path, monkeypatch):
    """A plugin author's own folder ``copy/`` (no config.json) in the working folder does not hide
    the installed drafter ``copy``; a folder that is a checkpoint still reads as one."""
    from specdec.generation.resolve import resolve

    registry = specdec.default_registry()
    monkeypatch.chdir(tmp_path)
    (tmp_path / "lookup").mkdir()
    (tmp_path / "lookup" / "pyproject.toml").write_text("[project]\n")
    named = resolve("drafter", "lookup", registry, "numpy")
    assert named.name == "lookup" and named.checkpoint is None


def test_a_plugins_own_option_is_not_taken_for_a_short_name(monkeypatch):
    """A plugin whose factory takes ``k`` (or ``w``) was handed ``draft_length`` (``beam_width``)
    from ``--drafter bigram:k=6`` and ``--methods bigram:k=6``, and refused it."""
    from specdec.bench.methods import parse_method
    from specdec.generation import options

    plugin = types.ModuleType("bigram_plugin")

    @specdec.hookimpl
    def specdec_register_drafters(register):
        register("bigram", "*", lambda target, checkpoint=None, *, backend, k=2, w=1: None)

    plugin.specdec_register_drafters = specdec_register_drafters
    registry = PluginRegistry([numpy_plugin, plugin])
    monkeypatch.setattr(options, "default_registry", lambda: registry)
    monkeypatch.setattr("specdec.bench.methods.default_registry", lambda: registry)
    assert options.parse_options("bigram:k=6,w=3") == ("bigram", {"k": 6, "w": 3})
    assert parse_method("bigram:k=6").options == {"k": 6}
    # a drafter that takes no k of its own still reads k as the lookup chain's length
    assert options.parse_options("lookup:k=6") == ("lookup", {"draft_length": 6})
    assert options.parse_options("redrafter:w=4,l=5")[1] == {"beam_width": 4, "beam_length": 5}
