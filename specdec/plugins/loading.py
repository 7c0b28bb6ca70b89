"""Finding and checking plugins, isolated as pytest isolates its plugins.

An installed plugin (entry point in group ``specdec``) that fails to import or defines a hook
that is not a specdec hook is skipped with a ``PluginWarning`` naming its distribution and the
error, and listed as broken by ``specdec plugins``. ``SPECDEC_DISABLE_PLUGINS`` (or
``specdec --disable-plugin``) names entry points or distributions not to load. See
docs/decisions/0003-plugins-isolated.md.
"""

from __future__ import annotations

import difflib
import inspect
import os
import re
from importlib import metadata
from typing import Any

import attrs
import pluggy

from specdec.plugins import hookspecs
from specdec.errors import PluginError

GROUP = "specdec"
DISABLE_ENV = "SPECDEC_DISABLE_PLUGINS"
HOOK_PREFIX = "specdec_"
HOOKS = tuple(sorted(name for name in vars(hookspecs) if name.startswith(HOOK_PREFIX)))


class PluginWarning(UserWarning):
    """About a plugin: an installed one was skipped (the message names it, its distribution and
    why), or one runs its NumPy reference on a backend it has no implementation for; the
    command line prints it as one line."""


@attrs.frozen(kw_only=True)
class FoundPlugin:
    """An entry point of group ``specdec``: its name, its distribution ('name version'), its
    module."""

    name: str
    distribution: str
    entry_point: Any


@attrs.frozen(kw_only=True)
class BrokenPlugin:
    """A plugin that was skipped, and why (one line)."""

    name: str
    distribution: str
    error: str


def normalize(name: str) -> str:
    """A distribution name as packaging compares them (PEP 503)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def disabled_plugins() -> frozenset[str]:
    """Entry-point or distribution names listed in SPECDEC_DISABLE_PLUGINS (comma-separated)."""
    return frozenset(
        normalize(n.strip()) for n in os.environ.get(DISABLE_ENV, "").split(",") if n.strip()
    )


def entry_point_plugins(disabled: frozenset[str]) -> tuple[list[FoundPlugin], list[FoundPlugin]]:
    """(plugins to load, plugins disabled): every entry point of group ``specdec`` once, even when
    its distribution is visible twice on sys.path (an editable install run from its own folder)."""
    seen, found, skipped = set(), [], []
    for ep in metadata.entry_points(group=GROUP):
        dist_name = ep.dist.name if ep.dist is not None else "unknown"
        version = ep.dist.version if ep.dist is not None else "?"
        key = (normalize(dist_name), ep.name, ep.value)
        if key in seen:
            continue
        seen.add(key)
        plugin = FoundPlugin(name=ep.name, distribution=f"{dist_name} {version}", entry_point=ep)
        off = {
            normalize(ep.name),
            normalize(dist_name),
            normalize(f"{dist_name}:{ep.name}"),
        } & disabled
        (skipped if off else found).append(plugin)
    return found, skipped


def one_line_error(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


class PluginManager(pluggy.PluginManager):
    """pluggy's manager that, like pytest's, also reads unmarked ``specdec_*`` functions as hooks,
    so that a misspelt hook name is an error instead of a function nobody calls."""

    def parse_hookimpl_opts(self, plugin, name: str):
        opts = super().parse_hookimpl_opts(plugin, name)
        if (
            opts is None
            and name.startswith(HOOK_PREFIX)
            and inspect.isroutine(getattr(plugin, name, None))
        ):
            opts = {}
        return opts


def check_hook_names(plugin: Any, label: str) -> None:
    """Raise PluginError for a ``specdec_*`` function of ``plugin`` that is not a specdec hook."""
    for name in dir(plugin):
        if (
            name.startswith(HOOK_PREFIX)
            and name not in HOOKS
            and inspect.isroutine(getattr(plugin, name))
        ):
            close = difflib.get_close_matches(name, HOOKS, n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            raise PluginError(
                f"{label} defines {name!r}, which is not a specdec hook{hint} (hooks: "
                f"{', '.join(HOOKS)})"
            )
