"""``specdec cache``: show, verify (and repair) and clear the specdec cache."""

from __future__ import annotations

import sys

from specdec.errors import InvalidInputError
from specdec.models import cache
from specdec.models.bundled import repair
from specdec.models.cache import cache_dir
from specdec.tuning.machine import QUIET_SHARE
from specdec.tuning.plans import describe_plan
from specdec.tuning.store import read_entry


def add_parser(sub) -> None:
    parser = sub.add_parser(
        "cache",
        help="show, verify or clear the specdec cache (converted models, this machine's "
        "measurements and kept plans, teacher data)",
    )
    parser.add_argument("action", nargs="?", default="show", choices=("show", "verify", "clear"))
    parser.add_argument("names", nargs="*", help="model names in the cache (default: all of them)")
    parser.add_argument(
        "--no-repair", action="store_true", help="verify: report damage without converting again"
    )
    parser.add_argument(
        "--all",
        action="store_true",
        help="clear: remove everything specdec keeps in the cache (models, teacher data, tuning "
        "...)",
    )
    for name, what in CLEARABLE.items():
        parser.add_argument(
            f"--{name}", action="store_true", help=f"clear: remove the {name}/ folder ({what})"
        )
    parser.add_argument(
        "--plans",
        action="store_true",
        help="clear: remove only `specdec plan`'s kept choices (generate then uses each "
        "drafter's own settings; the machine's measurements stay)",
    )
    parser.set_defaults(func=cmd_cache, late_names="names")


# the folders besides converted models that `clear --NAME` removes alone, and what they hold
CLEARABLE = {
    "tuning": "this machine's measurements: the dtype choice, the exactness self-test, the "
    "step-cost curves, `specdec plan`'s choices; measured again on next use, plans when "
    "`specdec plan` runs again",
    "teacher": "training's teacher records; made again by the next training run that needs them",
}


def _busy_measurements(folder) -> list[str]:
    """A line per measurement of this machine taken while other work shared its cores (its
    ``share`` below ``QUIET_SHARE``): such a figure has the wrong proportions, and is taken again
    at a later start (``specdec.tuning.store.settled``)."""
    lines = []
    for file in sorted(folder.glob("*.json")):
        entry = read_entry(file) or {}
        share = entry.get("share")
        if isinstance(share, (int, float)) and share < QUIET_SHARE:
            taken = int(entry.get("measures", 1))
            lines.append(
                f"{file.name}: taken while other work held {1 - share:.0%} of the cores "
                f"({taken} time(s)); measured again at a start that finds the machine quiet "
                "(`specdec cache clear --tuning`: all at the next start)"
            )
    return lines


def _plans(folder) -> list[str]:
    """A line per choice ``specdec plan`` kept (``generate`` uses it when no setting is named),
    or one line saying none is (a plan that said "not saved" left nothing to confirm it by)."""
    return [
        f"{file.name}: plan kept for generate: {describe_plan(read_entry(file) or {})} "
        "(`specdec cache clear --plans` removes the plans)"
        for file in sorted(folder.glob("plan-*.json"))
    ] or ["plans kept: none (generate uses the drafters' own settings)"]


def _size(n: int) -> str:
    return f"{n / 1e6:.1f} MB"


def cmd_cache(args) -> int:
    root = cache_dir()
    if args.action != "show":  # showing changes nothing
        for path in cache.clean_leftovers(root):
            print(f"removed leftover {path} (from a killed run)", file=sys.stderr)
    rows = cache.describe(root)
    known = {row["name"]: row for row in rows}
    unknown = [n for n in args.names if n not in known]
    if unknown:
        raise InvalidInputError(
            f"no model named {', '.join(unknown)} in the cache {root}; it holds: "
            f"{', '.join(known) or 'none'}"
        )
    chosen = [known[n] for n in args.names] if args.names else rows
    if args.action == "show":
        print(f"cache {root}")
        for row in rows:
            print(f"  {row['name']:<24} {_size(row['bytes']):>10}  {row['state']}  ({row['path']})")
        others = (
            [
                p
                for p in sorted(root.iterdir())
                if p.name not in ("models", "tmp", cache.ROOT_MARK) and not p.is_symlink()
            ]
            if root.is_dir()
            else []
        )
        for path in others:
            owner = "" if cache.is_own(path) else ", not made by specdec: clear leaves it"
            print(f"  {path.name + '/':<24} {_size(cache.folder_size(path)):>10}  ({path}{owner})")
            if path.name == "tuning":
                for line in _busy_measurements(path) + _plans(path):
                    print(f"    {line}")
        for path in cache.leftovers(root):
            print(f"  leftover of a killed run (`specdec cache clear` removes it): {path}")
        if not rows and not others:
            print("  (empty: no converted model, measurement or training data yet)")
        return 0
    if args.action == "verify":
        status = 0
        for row in chosen:
            folder = root / "models" / row["name"]
            found = cache.problems(folder, full=True)
            if not found:
                print(f"{row['name']}: ok (every file matches its recorded size and SHA-256)")
                continue
            print(f"{row['name']}: damaged: {'; '.join(found)}")
            if args.no_repair:
                status = 1
                continue
            repair(folder)
            print(f"{row['name']}: repaired (converted again)")
        return status
    folders = [name for name in CLEARABLE if getattr(args, name)]
    if args.plans and not args.tuning:  # a part of tuning/: its plan files alone
        plans = sorted((root / "tuning").glob("plan-*.json"))
        for path in plans:
            what = describe_plan(read_entry(path) or {})
            path.unlink()
            print(f"removed {path} ({what})")
        if not plans:
            print(f"nothing to remove: no plan kept in {root / 'tuning'}")
        if not args.names and not args.all and not folders:
            return 0
    if not args.names and not args.all and not folders and not args.plans:
        raise InvalidInputError(
            f"specdec cache clear: name the models to remove ({', '.join(known) or 'none'}), "
            f"or pass {' or '.join('--' + n for n in CLEARABLE)} to remove that folder, or --all "
            f"to remove the whole cache {root}"
        )
    for name in folders:
        path = root / name
        if not path.exists():
            print(f"nothing to remove: {path} does not exist")
        elif not cache.is_own(path):
            raise InvalidInputError(
                f"{path} was not made by specdec (no {cache.ENTRY_MARK} mark, or a link): "
                "left in place; remove it yourself if it is yours to remove"
            )
        else:
            cache.remove_entry(path)
            print(f"removed {path}")
    if folders and not args.names and not args.all:
        return 0
    if args.all:
        removed, others = cache.clear_all(root)
        for path in removed:
            print(f"removed {path}")
        if others:
            print(
                f"left {len(others)} entr{'y' if len(others) == 1 else 'ies'} of {root} that "
                "specdec did not make: "
                f"{', '.join(p.name for p in others[:8])}{' ...' if len(others) > 8 else ''}",
                file=sys.stderr,
            )
        return 0
    for row in chosen:
        path = root / "models" / row["name"]
        cache.remove_entry(path)
        print(f"removed {path}")
    return 0
