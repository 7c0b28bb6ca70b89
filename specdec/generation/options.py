"""A drafter with options, written ``name[:key=value,...]`` (``--drafter`` of ``specdec generate``
and ``specdec serve``, ``--methods`` of ``specdec bench``), read into ``generate``'s keyword
options; and the check that a drafter takes the options it is given, made before anything loads."""

from __future__ import annotations

import contextlib
import inspect
from pathlib import Path

import numpy as np

from specdec.errors import InvalidInputError
from specdec.generation.arguments import is_int
from specdec.generation.resolve import Resolved, check_options, drafter_kind
from specdec.plugins.registry import default_registry
from specdec.plugins.export import is_checkpoint_file

__all__ = [
    "ALIASES",
    "GENERATE_OPTIONS",
    "OWN_ARGUMENTS",
    "check_drafter_options",
    "checkpoint_of",
    "option_value",
    "parse_options",
]

# Short names of drafter options: redrafter:w=4,l=5, lookup:k=10, draft_model:draft=MODEL.
ALIASES = {"w": "beam_width", "l": "beam_length", "k": "draft_length", "draft": "draft_model"}
# Options generate takes for every drafter (beside its factory's own keywords).
GENERATE_OPTIONS = ("lookup", "speculation", "stop_at_eos", "tree_builder", "verifier")
# Arguments generate and Engine take by name, which a command sets with its own flags.
OWN_ARGUMENTS = (
    "model",
    "prompt",
    "drafter",
    "backend",
    "max_new_tokens",
    "temperature",
    "top_k",
    "top_p",
    "seed",
    "dtype",
    "device",
    "exact",
    "registry",
    "slots",
    "capacity",
    "max_queue",
    "max_prefill_tokens",
    "tree_room",
)
# What generate passes every drafter factory itself.
FACTORY_ARGUMENTS = ("target", "checkpoint", "backend")


def option_value(text: str):
    """An option's value as ``generate`` takes it: an int ("4"), a float ("0.5"), a bool ("true",
    "false", any case), else the text itself ("cpu16", a model name or folder)."""
    for cast in (int, float):
        try:
            return cast(text)
        except ValueError:
            pass
    return {"true": True, "false": False}.get(text.lower(), text)


def parse_options(
    spec: str, *, aliases: dict = ALIASES, own: tuple = OWN_ARGUMENTS, what: str = "drafter"
) -> tuple[str, dict]:
    """``name[:key=value,...]`` -> (name, {option: value}), e.g. ``redrafter:w=4,l=5,lookup=false``
    -> ("redrafter", {"beam_width": 4, "beam_length": 5, "lookup": False}). Keys are ``aliases``
    or option names as ``generate`` takes them, values typed by ``option_value``. An existing
    folder, or a checkpoint file a layout reads, is a name whole (":" in its path and all).
    A key the drafter's factory takes itself (a plugin's ``k``) is its own, not a short name.
    ``own``: keys refused because the command sets them itself (``generate``'s and ``Engine``'s
    own arguments); ``what`` names the spec in errors. Whether the drafter takes the options is
    ``check_drafter_options``'."""
    spec = str(spec)
    if Path(spec).expanduser().is_dir() or is_checkpoint_file(spec):
        return spec, {}
    name, _, rest = spec.partition(":")
    if not name:
        raise InvalidInputError(
            f"{what} {spec!r} names no drafter: NAME[:key=value,...], e.g. redrafter:w=4,l=5"
        )
    options, own_keywords = {}, _factory_keywords(name)
    for item in filter(None, rest.split(",")):
        key, eq, value = (part.strip() for part in item.partition("="))
        if not eq or not key.isidentifier():
            raise InvalidInputError(
                f"{what} {spec!r}: bad option {item!r}; write key=value pairs "
                f"separated by commas, e.g. {name}:beam_width=4"
            )
        key = key if key in own_keywords else aliases.get(key, key)  # a plugin's own k stays k
        if key in own:
            raise InvalidInputError(
                f"{what} {spec!r}: {key} is not a drafter option but an "
                "argument of its own (on the command line, its own flag)"
            )
        if key in options:
            raise InvalidInputError(f"{what} {spec!r} gives {key} twice")
        options[key] = option_value(value)
    return name, options


def _factory_keywords(name: str) -> set[str]:
    """The keyword arguments that drafter ``name``'s factories take on any backend (none for a
    name no installed drafter has): a short name such as ``k`` is that drafter's own option where
    its factory takes one by that name, not ``draft_length``."""
    keywords: set[str] = set()
    for registration in default_registry().registrations:
        if registration.kind == "drafter" and registration.name == name:
            with contextlib.suppress(TypeError, ValueError):  # a factory with no signature
                keywords.update(inspect.signature(registration.factory).parameters)
    return keywords


def checkpoint_of(kind: str, folder) -> str:
    """``NAME:drafter=FOLDER`` (a checkpoint of drafter NAME, as ``specdec bench``'s methods and
    the CLI write it): the folder, after checking that it holds a checkpoint of drafter NAME."""
    if not isinstance(folder, str) or not Path(folder).expanduser().exists():
        raise InvalidInputError(
            f"{kind}:drafter= takes a checkpoint folder, e.g. {kind}:drafter=runs/{kind}; got "
            f"{folder!r}"
        )
    found = drafter_kind(Path(folder).expanduser(), default_registry())
    if found != kind:
        raise InvalidInputError(
            f"{kind}:drafter={folder}: the folder holds a checkpoint of {found}, not {kind}; write "
            f"{found}:drafter={folder} (or the folder alone)"
        )
    return folder


def check_drafter_options(drafter: Resolved, registry, on_backend: str, options) -> None:
    """Refuse options that neither ``generate`` (``GENERATE_OPTIONS``) nor the drafter's factory
    takes, naming those they take, and values of the wrong type or range, naming the option:
    a beam drafter's ``beam_width`` (an integer >= 1) and ``beam_length`` (>= 2), a tree drafter's
    tree settings (``DrafterSpec.tree_options``: integers >= 1), and a factory keyword whose
    default is a bool (True or False). Nothing is loaded. A Drafter object passed in is left to
    ``load_drafter``, which refuses any option for it."""
    if drafter.name is None:
        return
    takes = inspect.signature(registry.get("drafter", drafter.name, on_backend).factory).parameters
    short = tuple(f"{alias} ({name})" for alias, name in ALIASES.items() if name in takes)
    defaults = {name: parameter.default for name, parameter in takes.items()}
    check_options(
        drafter,
        registry,
        on_backend,
        options,
        passed=FACTORY_ARGUMENTS,
        also=GENERATE_OPTIONS + (f"short names {', '.join(short)}",) * bool(short),
        aliases=ALIASES,
    )
    least = {}
    if drafter.spec is not None:
        least = {key: 1 for key in drafter.spec.tree_options}
        if drafter.spec.beam_options:
            least.update(beam_width=1, beam_length=2)
    for key, value in options.items():
        where = f"drafter {drafter.name!r}: option {key}"
        if key in least and value is not None:
            if not is_int(value) or value < least[key]:
                raise InvalidInputError(
                    f"{where} must be an integer >= {least[key]}, got {value!r}"
                )
        elif isinstance(defaults.get(key), bool) and not isinstance(value, (bool, np.bool_)):
            raise InvalidInputError(f"{where} must be True or False, got {value!r}")
