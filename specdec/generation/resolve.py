"""Each component the caller names, resolved once: a drafter, tree builder or verifier given as a
name, a checkpoint folder or an object becomes one ``Resolved`` record (its kind, the installed
name, the checkpoint, the drafter's spec and the line that says where it came from), which the
rest of the call reads instead of working the name out again; ``build`` makes the object."""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import Any

import attrs

from specdec.errors import InvalidInputError
from specdec.plugins.export import detect_layout, is_checkpoint_file
from specdec.models.files import check_checkpoint_folder
from specdec.plugins.registry import PluginRegistry
from specdec.plugins.specs import DrafterSpec

__all__ = [
    "Resolved",
    "build",
    "check_options",
    "drafter_kind",
    "plugin_source",
    "resolve",
    "with_lookup",
]


@attrs.frozen(kw_only=True)
class Resolved:
    """One component named by the caller. ``name`` is the installed name (None: an object passed
    in, which is ``choice``); ``checkpoint`` the folder a drafter was given as; ``spec`` a named
    drafter's spec (None for other kinds and for drafters without one); ``source`` as
    ``DecodePlan.sources`` words it."""

    kind: str  # "drafter" | "tree_builder" | "verifier"
    choice: Any  # what the caller gave: a name, a checkpoint folder or an object
    name: str | None
    checkpoint: Path | None = None
    spec: DrafterSpec | None = None
    source: str


def drafter_kind(checkpoint: Path, registry: PluginRegistry) -> str:
    """The name of the installed drafter that reads the checkpoint folder: an engine's layout
    (``specdec.plugins.export``), else the drafter whose spec reads its config's model_type."""
    found = detect_layout(checkpoint, registry)  # specdec's own checkpoints and engines' layouts
    if found is not None and found[1] != "specdec":
        return found[0]
    model_type = check_checkpoint_folder(checkpoint).get("model_type")
    return registry.spec_for_checkpoint(model_type, checkpoint).name


def plugin_source(registry: PluginRegistry, kind: str, choice, on_backend: str) -> str:
    """ "verifier 'exact' (plugin numpy, specdec 0.1.0)", or the class of an object passed in."""
    label = kind.replace("_", " ")
    if not isinstance(choice, str):
        return f"{label} {type(choice).__name__} (an object passed in)"
    plugin = registry.get(kind, choice, on_backend).plugin
    return f"{label} {choice!r} (plugin {plugin!r}, {registry.distribution(plugin)})"


def resolve(kind: str, choice, registry: PluginRegistry, on_backend: str) -> Resolved:
    """``choice`` resolved once: a checkpoint folder read for its drafter's name, a name checked
    against the registry for ``on_backend``, an object passed through."""
    checkpoint = None
    name = choice if isinstance(choice, str) else None
    if kind == "drafter" and (
        isinstance(choice, Path)
        or (
            isinstance(choice, str)
            and (_checkpoint_folder(choice, registry) or is_checkpoint_file(choice, registry))
        )
    ):
        checkpoint = Path(choice).expanduser()
        name = drafter_kind(checkpoint, registry)
    elif kind == "drafter" and not isinstance(choice, str) and not hasattr(choice, "propose"):
        raise InvalidInputError(
            f"drafter must be a name, a checkpoint folder or a Drafter object, got {choice!r}"
        )
    spec = None
    if kind == "drafter" and name is not None and name in registry.names("drafter_spec"):
        spec = registry.drafter_spec(name)
    source = plugin_source(registry, kind, choice if name is None else name, on_backend)
    return Resolved(
        kind=kind, choice=choice, name=name, checkpoint=checkpoint, spec=spec, source=source
    )


def _checkpoint_folder(choice: str, registry: PluginRegistry) -> bool:
    """``choice`` names a folder read as a checkpoint: any folder, but one that only shares an
    installed drafter's name (``copy/`` in the working folder, beside a plugin ``copy``) and
    holds no config.json leaves the name to the plugin."""
    folder = Path(choice).expanduser()
    if not folder.is_dir():
        return False
    return choice not in registry.names("drafter") or (folder / "config.json").is_file()


def with_lookup(drafter: Resolved) -> Resolved:
    """``drafter`` with a prompt-lookup beam beside it, as its source says."""
    beside = " with a prompt-lookup beam (specdec.drafting.lookup)"
    return attrs.evolve(drafter, source=drafter.source + beside)


def check_options(
    component: Resolved,
    registry: PluginRegistry,
    on_backend: str,
    options,
    *,
    passed=(),
    also=(),
    aliases: dict | None = None,
) -> None:
    """Refuse ``options`` that the factory of ``component`` does not take, naming those it takes:
    its keywords but ``passed`` (which its caller gives it), and ``also`` (options its caller
    takes for it); ``aliases`` (short name -> option), the short names a refused option may
    have been written as."""
    aliases = aliases or {}
    kind, choice = component.kind, component.name
    accepted = inspect.signature(registry.get(kind, choice, on_backend).factory).parameters
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in accepted.values()):
        return
    valid = sorted(k for k in accepted if k not in passed)
    unknown = sorted(set(options) - set(valid) - set(also))
    if unknown:
        beside = f"; every generation also takes: {', '.join(also)}" if also else ""
        # an option string's short name reaches here as its long one (w=2: beam_width), so the
        # line names both, whichever was written ("w is short for beam_width" read as noise to
        # whoever wrote beam_width)
        short = [f"{n} or its short name {a}" for a, n in aliases.items() if n in unknown]
        written = f" ({'; '.join(short)})" if short else ""
        raise InvalidInputError(
            f"{kind.replace('_', ' ')} {choice!r} does not take option(s) {unknown}{written}; "
            f"it takes: {', '.join(valid) or 'none'}{beside}"
        )


def build(
    component: Resolved, registry: PluginRegistry, on_backend: str, options: dict, **positional
):
    """The object of ``component`` for backend ``on_backend``, its factory given ``options`` and
    ``positional`` (an object passed in is returned as it is)."""
    if component.name is None:
        return component.choice
    check_options(component, registry, on_backend, options, passed=positional)
    factory = registry.get(component.kind, component.name, on_backend).factory
    return factory(**positional, **options)
