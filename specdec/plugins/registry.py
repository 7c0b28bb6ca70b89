"""The plugin host: pluggy, entry-point group ``specdec``, one registry of named factories.

Built-in backends and drafters register through their own entry points exactly as a
third-party package does. Tests build a fresh ``PluginRegistry`` from explicit modules.
Installed plugins are isolated (``specdec.plugins.loading``): one that fails to load is skipped
with a warning and listed in ``broken``; two plugins registering one name make that name an
error naming both, until one is disabled.
"""

from __future__ import annotations

import functools
import warnings
from importlib import metadata
from typing import Any, Callable, Iterable

import attrs

from specdec.plugins import hookspecs
from specdec.errors import InvalidInputError, PluginConflictError, PluginError, UnknownPluginError
from specdec.plugins.specs import DrafterSpec
from specdec.plugins.support import missing_framework
from specdec.plugins.on_host import HOST_BACKEND, on_host_factory
from specdec.plugins.loading import (
    DISABLE_ENV,
    BrokenPlugin,
    PluginManager,
    PluginWarning,
    check_hook_names,
    disabled_plugins,
    entry_point_plugins,
    normalize,
    one_line_error,
)

ANY_BACKEND = "*"
# kinds whose NumPy implementation runs on a backend that has none of its own
HOST_KINDS = ("drafter", "tree_builder")
KINDS = (  # kind, hook, whether ``register`` takes a backend
    ("backend", "specdec_register_backends", False),
    ("drafter", "specdec_register_drafters", True),
    ("tree_builder", "specdec_register_tree_builders", True),
    ("verifier", "specdec_register_verifiers", True),
    ("drafter_spec", "specdec_register_drafter_specs", False),
)


@attrs.frozen(kw_only=True)
class Registration:
    """One named factory. ``backend`` is ``"*"`` for factories that work on every backend."""

    kind: str
    name: str
    backend: str | None
    factory: Callable[..., Any]
    plugin: str
    lossless: bool | None = None

    def overlaps(self, other: "Registration") -> bool:
        """Both answer one (kind, name, backend) lookup."""
        return (self.kind, self.name) == (other.kind, other.name) and (
            self.backend == other.backend or ANY_BACKEND in (self.backend, other.backend)
        )


class PluginRegistry:
    """Collects registrations from pluggy hooks and resolves names with clear errors.

    ``plugins`` are modules (or objects) given in code: a malformed one raises PluginError.
    ``entry_points=True`` also loads every installed plugin not named in ``disabled`` (default:
    ``SPECDEC_DISABLE_PLUGINS``); a malformed one is skipped with a PluginWarning.
    """

    def __init__(
        self,
        plugins: Iterable[Any] = (),
        *,
        entry_points: bool = False,
        disabled: Iterable[str] | None = None,
    ):
        self._pm = PluginManager("specdec")
        self._pm.add_hookspecs(hookspecs)
        self._distributions: dict[str, str] = {}
        self.registrations: list[Registration] = []
        self.broken: list[BrokenPlugin] = []
        self.disabled: list[BrokenPlugin] = []
        if entry_points:
            off = disabled_plugins() if disabled is None else frozenset(map(normalize, disabled))
            found, skipped = entry_point_plugins(off)
            self.disabled = [
                BrokenPlugin(name=p.name, distribution=p.distribution, error="disabled")
                for p in skipped
            ]
            for plugin in found:  # an entry-point name two distributions use is qualified by each
                twice = sum(p.name == plugin.name for p in found) > 1
                self._add_installed(
                    plugin,
                    f"{plugin.distribution.split()[0]}:{plugin.name}" if twice else plugin.name,
                )
        for plugin in plugins:
            if self._pm.get_name(plugin) is not None:  # installed, and passed in too: the same
                continue
            self._add(plugin, self._pm.get_canonical_name(plugin), "local")

    def _add_installed(self, found, name: str) -> None:
        try:
            module = found.entry_point.load()
            self._add(module, name, found.distribution)
        except Exception as exc:  # noqa: BLE001 - any failure of an installed plugin is isolated
            error = one_line_error(exc)
            self.broken.append(
                BrokenPlugin(name=found.name, distribution=found.distribution, error=error)
            )
            warnings.warn(
                f"skipped the specdec plugin {found.name!r} from {found.distribution}: {error} "
                f"(set {DISABLE_ENV}={found.distribution.split()[0]} to silence this)",
                PluginWarning,
                stacklevel=4,
            )

    def _add(self, plugin: Any, name: str, distribution: str) -> None:
        """Register ``plugin`` and collect its registrations, all or none."""
        label = f"plugin {name!r} ({distribution})"
        check_hook_names(plugin, label)
        try:
            self._pm.register(plugin, name=name)
        except Exception as exc:
            raise PluginError(f"{label} could not be registered: {one_line_error(exc)}") from exc
        self._distributions[name] = distribution
        collected: list[Registration] = []
        try:
            for kind, hook, with_backend in KINDS:
                for impl in getattr(self._pm.hook, hook).get_hookimpls():
                    if impl.plugin is plugin:
                        impl.function(self._registrar(kind, name, label, with_backend, collected))
        except PluginError:
            self._pm.unregister(plugin)
            raise
        except Exception as exc:
            self._pm.unregister(plugin)
            raise PluginError(f"{label} failed while registering: {one_line_error(exc)}") from exc
        self.registrations.extend(collected)

    def _registrar(self, kind: str, plugin: str, label: str, with_backend: bool, collected: list):
        def register(name, *args, lossless=None):
            if kind == "drafter_spec":
                return register_spec(name, *args)
            if len(args) != (2 if with_backend else 1):
                usage = (
                    "register(name, backend, factory)"
                    if with_backend
                    else "register(name, factory)"
                )
                raise PluginError(
                    f"{label} registered {kind} {name!r} with {len(args) + 1} arguments; use "
                    f"{usage}"
                )
            backend, factory = args if with_backend else (None, args[0])
            if kind == "verifier" and lossless is None:
                raise PluginError(
                    f"{label} registered verifier {name!r} without lossless=True/False"
                )
            entry = Registration(
                kind=kind,
                name=name,
                backend=backend,
                factory=factory,
                plugin=plugin,
                lossless=lossless,
            )
            if any(
                (other.kind, other.name, other.backend) == (kind, name, backend)
                for other in collected
            ):
                raise PluginError(
                    f"{label} registered {kind} {name!r} on backend {backend!r} twice"
                )
            collected.append(entry)

        def register_spec(spec, *extra):
            if extra or not isinstance(spec, DrafterSpec):
                raise PluginError(
                    f"{label} called register({spec!r}{', ...' if extra else ''}) in "
                    "specdec_register_drafter_specs; use register(DrafterSpec(...))"
                )
            register_drafter = self._registrar("drafter", plugin, label, True, collected)
            for backend, factory in spec.implementations.items():
                register_drafter(spec.name, backend, factory)
            collected.append(
                Registration(
                    kind="drafter_spec", name=spec.name, backend=None, factory=spec, plugin=plugin
                )
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
                if r.kind == kind
                and (
                    backend is None
                    or r.backend in (backend, ANY_BACKEND)
                    or (kind in HOST_KINDS and r.backend == HOST_BACKEND)
                )
            }
        )

    def _runs_on_host(self, kind: str, backend, matches) -> bool:
        """A drafter or tree builder with no implementation for an installed ``backend`` runs its
        NumPy one there (``specdec.plugins.on_host``)."""
        return (
            kind in HOST_KINDS
            and backend not in (None, HOST_BACKEND)
            and backend in self.names("backend")
            and any(r.backend == HOST_BACKEND for r in matches)
        )

    def _on_host(self, kind: str, name: str, backend: str, matches) -> Registration:
        host = next(r for r in matches if r.backend == HOST_BACKEND)
        numpy_backend = self.get("backend", HOST_BACKEND).factory()
        factory = on_host_factory(kind, name, host.factory, backend, numpy_backend)
        return attrs.evolve(host, backend=backend, factory=factory)

    def ready_backends(self) -> list[str]:
        """The installed backends whose framework imports here (``specdec plugins`` marks the
        others NOT INSTALLED, with the extra to install)."""
        return [name for name in self.names("backend") if missing_framework(name) is None]

    def conflicts(self) -> list[tuple[Registration, Registration]]:
        """Pairs of registrations from different plugins that answer the same lookup."""
        regs = self.registrations
        return [
            (a, b)
            for i, a in enumerate(regs)
            for b in regs[i + 1 :]
            if a.plugin != b.plugin and a.overlaps(b)
        ]

    def get(self, kind: str, name: str, backend: str | None = None) -> Registration:
        """The registration of ``name`` on ``backend`` (one registered for every backend when
        there is none for that backend); PluginConflictError when two plugins registered it."""
        label = kind.replace("_", " ")
        matches = [r for r in self.registrations if r.kind == kind and r.name == name]
        if not matches:
            installed = ", ".join(self.names(kind)) or "none"
            raise UnknownPluginError(f"unknown {label} {name!r}; installed {label}s: {installed}")
        if kind == "backend":
            exact = matches
        else:
            exact = [r for r in matches if r.backend == backend] or [
                r for r in matches if r.backend == ANY_BACKEND
            ]
        if not exact and self._runs_on_host(kind, backend, matches):
            return self._on_host(kind, name, backend, matches)
        if not exact:
            has = ", ".join(sorted({r.backend for r in matches}))
            raise UnknownPluginError(
                f"{label} {name!r} is not available on backend {backend!r}; it is installed for: "
                f"{has}. {label.capitalize()}s on {backend!r}: "
                f"{', '.join(self.names(kind, backend)) or 'none'}"
            )
        # a plugin may register one name for every backend and again for one backend
        chosen = exact[0]
        rivals = [
            r
            for r in matches
            if r.plugin != chosen.plugin
            and (kind == "backend" or r.backend in (backend, ANY_BACKEND))
        ]
        if rivals:
            who = " and ".join(
                f"plugin {r.plugin!r} ({self.distribution(r.plugin)})"
                for r in sorted([chosen, *rivals], key=lambda r: r.plugin)
            )
            raise PluginConflictError(
                f"{label} {name!r} is registered by both {who}; disable one with "
                f"`specdec --disable-plugin NAME` or {DISABLE_ENV}=NAME (a plugin or distribution "
                "name)"
            )
        return chosen

    def drafter_specs(self) -> list[DrafterSpec]:
        """Every registered drafter spec, by name."""
        return [self.get("drafter_spec", name).factory for name in self.names("drafter_spec")]

    def drafter_spec(self, name: str) -> DrafterSpec:
        """The spec of drafter ``name``; UnknownPluginError naming the drafters that have one."""
        return self.get("drafter_spec", name).factory

    def spec_for_checkpoint(self, model_type, checkpoint) -> DrafterSpec:
        """The spec of the drafter whose checkpoints have ``model_type``."""
        specs = {spec.model_type: spec for spec in self.drafter_specs() if spec.model_type}
        if model_type not in specs:
            raise InvalidInputError(
                f"drafter checkpoint {checkpoint} has model_type {model_type!r}; the installed "
                f"drafters read: {', '.join(sorted(specs)) or 'none'}"
            )
        return specs[model_type]

    def describe(self) -> list[dict[str, Any]]:
        """One dict per registration, broken plugin and disabled plugin, for ``specdec plugins``.
        A registration's ``install`` is the pip command that installs the framework of its
        backend where that is missing (it is registered, but cannot run), else None."""
        conflicting = {id(r) for pair in self.conflicts() for r in pair}
        rows = [
            {
                "kind": r.kind,
                "name": r.name,
                "backend": r.backend,
                "lossless": r.lossless,
                "plugin": r.plugin,
                "package": self.distribution(r.plugin),
                "conflict": id(r) in conflicting,
                "install": missing_framework(r.name if r.kind == "backend" else r.backend),
            }
            for r in self.registrations
            if r.kind != "drafter_spec"
        ]
        for kind, plugins in (("broken", self.broken), ("disabled", self.disabled)):
            rows += [
                {
                    "kind": kind,
                    "name": p.name,
                    "plugin": p.name,
                    "package": p.distribution,
                    "error": p.error,
                }
                for p in plugins
            ]
        return rows


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
