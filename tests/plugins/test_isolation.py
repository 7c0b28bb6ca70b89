"""Installed plugins are isolated: a broken one is skipped and listed, a name registered twice is an
error naming both distributions, a misspelt hook is rejected, and any plugin can be disabled.

Each test installs small distributions into a temporary folder on sys.path (a ``*.dist-info``
with ``entry_points.txt``, which is all ``importlib.metadata`` reads) and builds a fresh registry.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import types

import pytest

import specdec
from specdec.errors import PluginConflictError, PluginError
from specdec.plugins.loading import PluginWarning
from specdec.plugins.registry import PluginRegistry


def hooks(body: str) -> str:
    """A plugin module's source: ``body`` after the hookimpl import."""
    return "from specdec.plugins.hookspecs import hookimpl\n" + textwrap.dedent(body)


def install(
    site, dist: str, version: str, entry_points: dict[str, str], modules: dict[str, str]
) -> None:
    """A distribution ``dist`` in folder ``site``: its modules and its ``specdec`` entry points."""
    info = site / f"{dist.replace('-', '_')}-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n")
    lines = "".join(f"{name} = {module}\n" for name, module in entry_points.items())
    (info / "entry_points.txt").write_text(f"[specdec]\n{lines}")
    for module, code in modules.items():
        (site / f"{module}.py").write_text(code)


@pytest.fixture
def site(tmp_path, monkeypatch):
    folder = tmp_path / "site"
    folder.mkdir()
    monkeypatch.syspath_prepend(str(folder))
    monkeypatch.delenv("SPECDEC_DISABLE_PLUGINS", raising=False)
    return folder


def run_cli(site, *args, env=None):
    environ = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), *sys.path]), **(env or {})}
    environ.pop("SPECDEC_DISABLE_PLUGINS", None) if not env else None
    return subprocess.run(
        [sys.executable, "-m", "specdec.cli.main", *args],
        capture_output=True,
        text=True,
        env=environ,
    )


def test_a_plugin_that_fails_to_import_is_skipped_and_listed(site):
    install(
        site,
        "broken-plugin",
        "1.0",
        {"broken": "broken_mod"},
        {"broken_mod": "import no_such_module_here\n"},
    )
    with pytest.warns(
        PluginWarning,
        match=r"'broken' from broken-plugin 1.0: ModuleNotFoundError: .*no_such_module",
    ):
        registry = PluginRegistry(entry_points=True)
    assert "numpy" in registry.names("backend") and "redrafter" in registry.names("drafter")
    assert [(p.name, p.distribution) for p in registry.broken] == [("broken", "broken-plugin 1.0")]
    done = run_cli(site, "plugins")
    assert done.returncode == 0, done.stderr
    assert "broken plugins:\n  broken  (broken-plugin 1.0): ModuleNotFoundError" in done.stdout
    assert done.stderr.startswith(
        "specdec: warning: skipped the specdec plugin 'broken' from broken-plugin 1.0"
    )
    assert "Traceback" not in done.stderr


def test_a_name_registered_twice_is_an_error_naming_both_distributions(site):
    install(
        site,
        "fake-numpy",
        "2.0",
        {"numpy": "fake_numpy"},
        {
            "fake_numpy": hooks("""
        @hookimpl
        def specdec_register_backends(register):
            register("numpy", object)
    """)
        },
    )
    registry = PluginRegistry(entry_points=True)
    with pytest.raises(
        PluginConflictError,
        match=r"backend 'numpy' is registered by both plugin 'fake-numpy:numpy' "
        r"\(fake-numpy 2.0\) and plugin 'specdec:numpy' \(specdec [\d.]+\)",
    ):
        registry.get("backend", "numpy")
    assert registry.get("drafter", "redrafter", "numpy")  # other names are unaffected
    for off in ("fake-numpy", "FAKE_numpy"):  # a distribution name, as packaging compares them
        assert (
            PluginRegistry(entry_points=True, disabled={off}).get("backend", "numpy").factory
            is not object
        )
    done = run_cli(
        site, "generate", "--model", str(site), "--prompt-ids", "[1]", "--backend", "numpy"
    )
    assert (
        done.returncode == 2
        and "registered by both" in done.stderr
        and "--disable-plugin" in done.stderr
    )
    listed = run_cli(site, "plugins")
    assert "CONFLICT" in listed.stdout, listed.stdout
    for disabled in (
        run_cli(site, "--disable-plugin", "fake-numpy", "plugins"),
        run_cli(site, "plugins", env={"SPECDEC_DISABLE_PLUGINS": "fake-numpy"}),
    ):
        assert (
            "CONFLICT" not in disabled.stdout
            and "disabled plugins:\n  numpy  (fake-numpy 2.0)" in disabled.stdout
        )


def test_a_drafter_registered_for_every_backend_conflicts_with_one_for_a_backend():
    def plugin_with(name, backend):
        plugin = types.ModuleType(f"{name}_{backend}".replace("*", "any"))

        @specdec.hookimpl
        def specdec_register_drafters(register):
            register(name, backend, object)

        plugin.specdec_register_drafters = specdec_register_drafters
        return plugin

    registry = PluginRegistry([plugin_with("mine", "*"), plugin_with("mine", "numpy")])
    with pytest.raises(PluginConflictError, match="registered by both"):
        registry.get("drafter", "mine", "numpy")
    assert registry.get("drafter", "mine", "torch").backend == "*"
    with pytest.raises(PluginError, match="registered drafter 'mine' on backend 'numpy' twice"):
        twice = types.ModuleType("twice")

        @specdec.hookimpl
        def specdec_register_drafters(register):
            register("mine", "numpy", object)
            register("mine", "numpy", object)

        twice.specdec_register_drafters = specdec_register_drafters
        PluginRegistry([twice])


@pytest.mark.parametrize("marked", [True, False])
def test_a_misspelt_hook_is_rejected(site, marked):
    plugin = types.ModuleType("typo_plugin")

    def specdec_register_drafter(register):
        register("typo", "numpy", object)

    plugin.specdec_register_drafter = (
        specdec.hookimpl(specdec_register_drafter) if marked else specdec_register_drafter
    )
    with pytest.raises(
        PluginError,
        match=r"plugin 'typo_plugin' \(local\) defines 'specdec_register_drafter', which "
        r"is not a specdec hook; did you mean 'specdec_register_drafters'\?",
    ):
        PluginRegistry([plugin])
    install(
        site,
        "typo-plugin",
        "0.3",
        {"typo": "typo_mod"},
        {
            "typo_mod": hooks("""
        @hookimpl
        def specdec_register_verifier(register):
            pass
    """)
        },
    )
    with pytest.warns(
        PluginWarning,
        match=r"'typo' from typo-plugin 0.3: PluginError: .*did you mean "
        r"'specdec_register_verifiers'",
    ):
        registry = PluginRegistry(entry_points=True)
    assert [p.name for p in registry.broken] == ["typo"]


def test_an_unmarked_hook_is_a_hook():
    plugin = types.ModuleType("unmarked")

    def specdec_register_drafters(register):
        register("unmarked", "numpy", object)

    plugin.specdec_register_drafters = specdec_register_drafters
    assert PluginRegistry([plugin]).names("drafter") == ["unmarked"]


def test_a_registration_with_wrong_arguments_names_the_plugin():
    plugin = types.ModuleType("wrong_args")

    @specdec.hookimpl
    def specdec_register_drafters(register):
        register("no_backend", object)

    plugin.specdec_register_drafters = specdec_register_drafters
    with pytest.raises(
        PluginError,
        match=r"plugin 'wrong_args' \(local\) registered drafter 'no_backend' with 2 "
        r"arguments; use register\(name, backend, factory\)",
    ):
        PluginRegistry([plugin])


def test_plugins_piped_into_head_exits_quietly():
    """The reader closes the pipe before specdec writes: no BrokenPipeError traceback, exit 0."""
    read, write = os.pipe()
    os.close(read)
    done = subprocess.run(
        [sys.executable, "-m", "specdec.cli.main", "plugins"],
        stdout=write,
        stderr=subprocess.PIPE,
        text=True,
    )
    os.close(write)
    assert done.returncode == 0 and done.stderr == "", done.stderr
