"""The plugin host: pluggy, entry-point group ``specdec``, one registry of named factories.

Built-in backends and drafters register through their own entry points exactly as a
third-party package does. Tests build a fresh ``PluginRegistry`` from explicit modules.
"""

from __future__ import annotations

import functools
from importlib import metadata
from typing import Any, Callable, Iterable

import attrs
import pluggy

from specdec import hookspecs
from specdec.errors import UnknownPluginError

ANY_BACKEND = "*"


@attrs.frozen(kw_only=True)
class Registration:
    """One named factory. ``backend`` is ``"*"`` for factories that work on every backend."""

    kind: str
    name: str
    backend: str | None
    factory: Callable[..., Any]
    plugin: str
    lossless: bool | None = None


class PluginRegistry:
    """Collects registrations from pluggy hooks and resolves names with clear errors."""

    def __init__(self, plugins: Iterable[Any] = (), *, entry_points: bool = False):
        self._pm = pluggy.PluginManager("specdec")
        self._pm.add_hookspecs(hookspecs)
        if entry_points:
            self._pm.load_setuptools_entrypoints("specdec")
        for plugin in plugins:
            self._pm.register(plugin)
        self._distributions = {
            self._pm.get_name(plugin): f"{dist.project_name} {dist.version}"
            for plugin, dist in self._pm.list_plugin_distinfo()
        }
        self.registrations: list[Registration] = []
        self._collect()

    def _collect(self) -> None:
        for kind, hook, with_backend in (
            ("backend", self._pm.hook.specdec_register_backends, False),
            ("drafter", self._pm.hook.specdec_register_drafters, True),
            ("tree_builder", self._pm.hook.specdec_register_tree_builders, True),
            ("verifier", self._pm.hook.specdec_register_verifiers, True),
        ):
            for impl in hook.get_hookimpls():
                plugin_name = impl.plugin_name
                register = self._registrar(kind, plugin_name, with_backend)
                impl.function(register)

    def _registrar(self, kind: str, plugin: str, with_backend: bool):
        def register(name, *args, lossless=None):
            if with_backend:
                backend, factory = args
            else:
                (factory,), backend = args, None
            if kind == "verifier" and lossless is None:
                raise TypeError(f"plugin {plugin!r} registered verifier {name!r} without lossless=True/False")
            self.registrations.append(
                Registration(kind=kind, name=name, backend=backend, factory=factory, plugin=plugin, lossless=lossless)
            )

        return register

    def distribution(self, plugin: str) -> str:
        """'package version' of the distribution that provided ``plugin`` ('local' otherwise)."""
        return self._distributions.get(plugin, "local")

    def names(self, kind: str, backend: str | None = None) -> list[str]:
        return sorted(
            {
                r.name
                for r in self.registrations
                if r.kind == kind and (backend is None or r.backend in (backend, ANY_BACKEND))
            }
        )

    def get(self, kind: str, name: str, backend: str | None = None) -> Registration:
        """The registration of ``name``; a later registration of the same key wins."""
        label = kind.replace("_", " ")
        matches = [r for r in self.registrations if r.kind == kind and r.name == name]
        if not matches:
            installed = ", ".join(self.names(kind)) or "none"
            raise UnknownPluginError(f"unknown {label} {name!r}; installed {label}s: {installed}")
        if kind == "backend":
            return matches[-1]
        exact = [r for r in matches if r.backend == backend] or [r for r in matches if r.backend == ANY_BACKEND]
        if not exact:
            has = ", ".join(sorted({r.backend for r in matches}))
            raise UnknownPluginError(
                f"{label} {name!r} is not available on backend {backend!r}; it is installed for: {has}. "
                f"{label.capitalize()}s on {backend!r}: {', '.join(self.names(kind, backend)) or 'none'}"
            )
        return exact[-1]

    def describe(self) -> list[dict[str, Any]]:
        """One dict per registration, for ``specdec plugins``."""
        return [
            {
                "kind": r.kind,
                "name": r.name,
                "backend": r.backend,
                "lossless": r.lossless,
                "plugin": r.plugin,
                "package": self.distribution(r.plugin),
            }
            for r in self.registrations
        ]


@functools.lru_cache(maxsize=1)
def default_registry() -> PluginRegistry:
    """The registry of every installed plugin (entry-point group ``specdec``), built once."""
    return PluginRegistry(entry_points=True)


def installed_distributions() -> dict[str, str]:
    """Versions of the frameworks backends may use, for reports ('not installed' if absent)."""
    versions = {}
    for name in ("specdec", "numpy", "torch", "transformers", "mlx", "mlx-lm"):
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = "not installed"
    return versions
