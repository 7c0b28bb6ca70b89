"""Folders a command writes (``--out``): written beside, swapped in whole, never destroying what
specdec did not write.

``check_out`` runs before any work and refuses an ``--out`` that is a file or a link, that is the
home or working folder or holds one of them, that is a source the command reads or holds one, and
a non-empty folder unless ``overwrite``; with ``overwrite`` the folder must hold only what an
earlier specdec command wrote there (its ``WRITTEN`` record lists it), so a folder of notes, code
or a checkpoint it did not write is refused with its foreign entries named. ``writing`` gives a
work folder beside ``--out`` (``.NAME.partial-PID-*``) and, once the command has written
everything, records what is there and swaps it in by renames: a refusal or a crash leaves
``--out`` as it was.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Iterable, Iterator

from specdec.errors import InvalidInputError
from specdec.models.files import read_json

WRITTEN = ".specdec-written.json"


def _resolved(path: Path) -> Path:
    return Path(os.path.realpath(path))


def _holds(folder: Path, other: Path) -> bool:
    """Whether ``other`` is ``folder`` or lies inside it (both resolved)."""
    return other == folder or folder in other.parents


def refuse_dangerous_out(out, *, sources: Iterable = (), flag: str = "--out") -> Path:
    """``out`` as a Path, after refusing the folders no command may write over: the home or
    working folder or one holding them, and a source the command reads or one holding it."""
    folder = Path(out).expanduser()
    if folder.is_symlink():
        raise InvalidInputError(
            f"{flag} {folder} is a link; give the folder itself (specdec replaces --out whole)"
        )
    if folder.exists() and not folder.is_dir():
        raise InvalidInputError(f"{flag} {folder} is a file; give a folder")
    real = _resolved(folder)
    for name, place in (("the working folder", Path.cwd()), ("your home folder", Path.home())):
        if _holds(real, _resolved(place)):
            what = "is" if real == _resolved(place) else "holds"
            raise InvalidInputError(
                f"{flag} {folder} {what} {name} ({place}); give a folder of its own, e.g. "
                f"{flag} {folder / 'out'}"
            )
    for source in sources:
        if source is None:
            continue
        source_real = _resolved(Path(source).expanduser())
        if _holds(real, source_real):
            what = "is" if real == source_real else "holds"
            raise InvalidInputError(
                f"{flag} {folder} {what} the source {source}, which this command reads; write to "
                "another folder"
            )
    return folder


def written_by_specdec(folder: Path) -> set[str] | None:
    """The entries an earlier specdec command recorded writing in ``folder``, or None."""
    try:
        record = read_json(folder / WRITTEN, kind=None)
    except (OSError, ValueError):  # CorruptFileError included
        return None
    names = record.get("entries") if isinstance(record, dict) else None
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        return None
    return set(names)


def check_out(out, *, overwrite: bool, sources: Iterable = (), flag: str = "--out") -> Path:
    """Refuse ``out`` (before any work) unless the command may write it; returns the folder."""
    folder = refuse_dangerous_out(out, sources=sources, flag=flag)
    if not folder.is_dir():
        return folder
    entries = sorted(p.name for p in folder.iterdir())
    if not entries:
        return folder
    if not overwrite:
        raise InvalidInputError(
            f"{flag} {folder} is not empty; choose an empty folder or pass --overwrite "
            "(overwrite=True in Python) to replace what an earlier export or import wrote there"
        )
    ours = written_by_specdec(folder)
    foreign = [name for name in entries if name != WRITTEN and name not in (ours or set())]
    if ours is None or foreign:
        listed = ", ".join(foreign[:6]) + (
            f" and {len(foreign) - 6} more" if len(foreign) > 6 else ""
        )
        raise InvalidInputError(
            f"{flag} {folder} holds what specdec did not write there ({listed}); --overwrite "
            "replaces only a folder an earlier export or import wrote: choose another folder, "
            "or move those files away first"
        )
    return folder


@contextlib.contextmanager
def writing(
    out, *, overwrite: bool, sources: Iterable = (), flag: str = "--out", what: str = ""
) -> Iterator[Path]:
    """Check ``out``, then yield a work folder beside it; on a normal exit the work folder is
    recorded (``WRITTEN``) and swapped in for ``out``, on an exception removed. ``what`` (the
    command) goes into the record."""
    sources = list(sources)
    folder = check_out(out, overwrite=overwrite, sources=sources, flag=flag)
    try:
        folder.parent.mkdir(parents=True, exist_ok=True)
        work = Path(
            tempfile.mkdtemp(prefix=f".{folder.name}.partial-{os.getpid()}-", dir=folder.parent)
        )
    except OSError as exc:
        raise InvalidInputError(
            f"cannot write {flag} {folder}: {exc.strerror or exc}; choose a writable folder"
        ) from None
    try:
        yield work
        entries = sorted(p.name for p in work.iterdir())
        (work / WRITTEN).write_text(json.dumps({"command": what, "entries": entries}, indent=1))
        work.chmod(0o755)
        # the folder was checked before the work; check again that nothing foreign arrived since
        check_out(folder, overwrite=overwrite, sources=sources, flag=flag)
        _swap_in(work, folder)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _swap_in(work: Path, folder: Path) -> None:
    """Put ``work`` in ``folder``'s place by renames: a reader sees the old folder or the new."""
    if not folder.exists():
        work.rename(folder)
        return
    if not any(folder.iterdir()):
        folder.rmdir()
        work.rename(folder)
        return
    old = Path(tempfile.mkdtemp(prefix=f".{folder.name}.old-{os.getpid()}-", dir=folder.parent))
    folder.rename(old / folder.name)
    work.rename(folder)
    shutil.rmtree(old, ignore_errors=True)
