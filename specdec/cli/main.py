"""Command line: ``specdec demo | generate | bench | plan | tune | train | teacher | cache |
export | import | serve | plugins``; each command's parser and code in its own module, the
parser built and errors reported here."""

from __future__ import annotations

import argparse
import json
import os
import sys
import warnings

from specdec import compute
from specdec.cli.cache import add_parser as add_cache_parser
from specdec.cli.decode import add_parsers as add_decode_parsers
from specdec.cli.export import add_parser as add_export_parsers
from specdec.cli.measure import add_parsers as add_measure_parsers
from specdec.cli.serve import add_parser as add_serve_parser
from specdec.cli.store import add_parser as add_store_parser
from specdec.cli.teacher import add_parser as add_teacher_parser
from specdec.cli.train import add_parsers as add_train_parsers
from specdec.errors import SpecdecError, TrainingInterrupted
from specdec.plugins.loading import DISABLE_ENV, PluginWarning
from specdec.plugins.registry import default_registry


def cmd_plugins(args) -> int:
    rows = default_registry().describe()
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    # a backend whose framework is missing says how to install it on its own line; the
    # components registered for it say "not installed" in their backend list, on one line with
    # the others (they took a line each, 11 of them for mlx, each with the install command)
    absent = {r["name"] for r in rows if r["kind"] == "backend" and r.get("install")}
    rows = [r if r["kind"] == "backend" else {**r, "install": None} for r in rows]
    for kind in ("backend", "drafter", "tree_builder", "verifier"):
        print(f"{kind.replace('_', ' ')}s:")
        for row, backends, plugins in _grouped(r for r in rows if r["kind"] == kind):
            backends = [f"{b} (not installed)" if b in absent else b for b in backends]
            where = "" if not backends else f" [{', '.join(backends)}]"
            flag = "" if row["lossless"] is None else (" lossless" if row["lossless"] else " LOSSY")
            conflict = "  CONFLICT: registered by another plugin too" if row["conflict"] else ""
            missing = f"  NOT INSTALLED: {row['install']}" if row.get("install") else ""
            print(
                f"  {row['name']}{where}{flag}  ({row['package']}, plugin"
                f"{'s' if len(plugins) > 1 else ''} {', '.join(plugins)}){conflict}{missing}"
            )
    for kind in ("broken", "disabled"):
        listed = [r for r in rows if r["kind"] == kind]
        if listed:
            print(f"{kind} plugins:")
        for row in listed:
            why = "" if kind == "disabled" else f": {row['error']}"
            print(f"  {row['name']}  ({row['package']}){why}")
    return 0


def _grouped(rows):
    """(first row, backends, plugins) per component name, flag and distribution: one line for
    a drafter that one package registers for several backends."""
    groups: dict = {}
    for row in rows:
        key = (row["name"], row["lossless"], row["package"], row["conflict"], row.get("install"))
        first, backends, plugins = groups.setdefault(key, (row, [], []))
        for value, into in ((row["backend"], backends), (row["plugin"], plugins)):
            if value is not None and value not in into:
                into.append(value)
    return list(groups.values())


class _DefaultsShown(argparse.HelpFormatter):
    """Help that states each option's default where its own words do not and the default is
    a value (not None, not a flag's False)."""

    def _get_help_string(self, action):
        text = action.help or ""
        default = action.default
        if (
            "default" in text.lower()
            or default in (None, False, argparse.SUPPRESS)
            or default == []
            or not action.option_strings
        ):
            return text
        if isinstance(default, (list, tuple)):
            default = " ".join(str(value) for value in default)
        return f"{text} (default {default})"


class _Parser(argparse.ArgumentParser):
    """Every command's parser shows its defaults (its subcommands' parsers are this class too:
    argparse makes them of the parent's class)."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("formatter_class", _DefaultsShown)
        super().__init__(*args, **kwargs)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="specdec", description="Speculative decoding with pluggable backends.")
    parser.add_argument("--debug", action="store_true", help="show the full traceback of an error")
    parser.add_argument(
        "--disable-plugin",
        action="append",
        default=[],
        metavar="NAME",
        help="do not load this installed plugin (entry-point or distribution name); repeatable, "
        "added to SPECDEC_DISABLE_PLUGINS",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    add_decode_parsers(sub)
    add_measure_parsers(sub)
    add_train_parsers(sub)
    add_cache_parser(sub)
    add_export_parsers(sub)
    add_serve_parser(sub)
    add_teacher_parser(sub)
    add_store_parser(sub)
    plugins = sub.add_parser(
        "plugins", help="list installed backends, drafters, tree builders and verifiers"
    )
    plugins.add_argument("--json", action="store_true")
    plugins.set_defaults(func=cmd_plugins)
    for listed in sub._choices_actions:  # `specdec X --help` opens with the line the list gives
        command = sub.choices[listed.dest]
        if command.description is None and listed.help:
            command.description = listed.help[0].upper() + listed.help[1:] + "."
    return parser


def main(argv=None) -> int:
    """Run a command; every expected failure is one line on stderr and a non-zero exit
    (``--debug`` re-raises it with its traceback)."""
    _show_plugin_warnings()
    early = argparse.ArgumentParser(add_help=False)  # plugins are loaded while the parser is built
    early.add_argument("--disable-plugin", action="append", default=[])
    early.add_argument("--debug", action="store_true")
    known = early.parse_known_args(argv)[0]
    _disable_plugins(known.disable_plugin)
    try:
        parser = build_parser()
    except SpecdecError as exc:  # two plugins for one drafter spec
        if known.debug:
            raise
        print(f"specdec: error: {one_line(exc)}", file=sys.stderr)
        return 2
    args, extra = parser.parse_known_args(argv)
    late = getattr(args, "late_names", None)  # a command whose names may follow its options
    if extra and (late is None or any(word.startswith("-") for word in extra)):
        parser.parse_args(argv)  # exits with argparse's own message for what it does not know
    if extra:  # `specdec cache verify --no-repair NAME`: argparse had closed the names already
        getattr(args, late).extend(extra)
    try:
        if getattr(args, "on_compute_thread", False):  # one OpenMP team: specdec.compute
            return compute.run(args.func, args)
        return args.func(args)
    except BrokenPipeError:  # `specdec plugins | head`: the reader left, which is not an error
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except TrainingInterrupted as exc:
        if args.debug:
            raise
        print(f"specdec: {exc}", file=sys.stderr)
        return 130
    except KeyboardInterrupt:
        if args.debug:
            raise
        print("specdec: interrupted", file=sys.stderr)
        return 130
    except (SpecdecError, OSError, MemoryError) as exc:
        if args.debug:
            raise
        print(f"specdec: error: {one_line(exc)} (--debug shows the traceback)", file=sys.stderr)
        return 2


def _disable_plugins(names: list[str]) -> None:
    """--disable-plugin: added to SPECDEC_DISABLE_PLUGINS, so that child processes agree."""
    if names:
        os.environ[DISABLE_ENV] = ",".join(filter(None, [os.environ.get(DISABLE_ENV, ""), *names]))
        default_registry.cache_clear()


def _show_plugin_warnings() -> None:
    """A skipped plugin is reported as one line on stderr, like every other message of the CLI."""
    shown = warnings.showwarning

    def show(message, category, filename, lineno, file=None, line=None):
        if issubclass(category, PluginWarning):
            print(f"specdec: warning: {message}", file=sys.stderr)
        else:
            shown(message, category, filename, lineno, file, line)

    warnings.showwarning = show


def one_line(exc: BaseException) -> str:
    """The error's message on one line; an OSError names its file and what went wrong."""
    if isinstance(exc, OSError) and not isinstance(exc, SpecdecError) and exc.strerror:
        where = f"{exc.filename}: " if exc.filename else ""
        return f"{where}{exc.strerror}"
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text


if __name__ == "__main__":
    sys.exit(main())
