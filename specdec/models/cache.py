"""The specdec cache verifies what it serves.

Each converted model folder records the size and SHA-256 of its files in ``MANIFEST`` when it
is written. Every load checks the sizes (and that the weights file is structurally complete);
the full hashes are checked when a load fails and on request (``specdec cache verify``), and
a damaged folder is repaired by converting it again. A folder without its manifest, with a
manifest that names anything but a plain file of the folder, or with a link among its files
is damaged too: nothing in a cache folder makes specdec read outside it.

The cache deletes only its own. Each folder specdec makes in the cache (``models``, ``tmp``,
``tuning``, ``teacher``, ``corpus``: ``OWN_ENTRIES``) carries ``ENTRY_MARK`` from its creation,
and the cache folder itself ``ROOT_MARK`` when specdec made it (the default location,
``~/.cache/specdec``, is specdec's by its name and is marked on first use). ``clear --all``
removes only marked entries (in a marked root, also the entries of ``OWN_ENTRIES`` made by
versions before the marks), never a link and never what a link points to, and the root only
when specdec made it and nothing else is left. So a mistyped ``SPECDEC_CACHE=$HOME`` costs
nothing but the folders specdec made there. Work folders of killed runs (a conversion's
``.NAME.partial-PID-*``, a download's ``tmp/fetch-PID-*``) are removed by the next conversion
or ``clear`` once their process is gone, and only inside specdec's own entries; showing the
cache changes nothing.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import tempfile
from pathlib import Path

from specdec.models.checkpoints import write_json_atomic
from specdec.errors import CorruptFileError
from specdec.models.files import check_safetensors, read_json

COMPLETE = ".specdec-complete"
ROOT_MARK = ".specdec-cache"
ENTRY_MARK = ".specdec-cache-entry"
MANIFEST = ".specdec-manifest.json"
LEFTOVER_PATTERNS = (("models", ".*.partial-*"), ("models", ".*.old-*"), ("tmp", "fetch-*"))
# what specdec makes in its cache folder
OWN_ENTRIES = (
    "models",
    "tmp",
    "tuning",
    "teacher",
    "corpus",
)

log = logging.getLogger("specdec.models.cache")


def default_cache_dir() -> Path:
    """``$XDG_CACHE_HOME/specdec``, else ``~/.cache/specdec``."""
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return base / "specdec"


def cache_dir() -> Path:
    """``$SPECDEC_CACHE``, else ``default_cache_dir()``. Nothing is created: ``cache_entry``
    makes (and marks) the folders specdec writes in it."""
    if os.environ.get("SPECDEC_CACHE"):
        return Path(os.environ["SPECDEC_CACHE"]).expanduser()
    return default_cache_dir()


def _mark_new(folder: Path, mark: str) -> None:
    """Create ``folder`` (parents as needed) and, if this call made it, mark it as specdec's."""
    try:
        folder.mkdir()
    except FileExistsError:
        return
    except FileNotFoundError:
        folder.parent.mkdir(parents=True, exist_ok=True)
        return _mark_new(folder, mark)
    (folder / mark).write_text("made by specdec; `specdec cache clear --all` removes it\n")


def cache_entry(name: str, root: Path | None = None) -> Path:
    """The cache folder ``name`` (one of ``OWN_ENTRIES``), made and marked when missing; the root
    is marked too when specdec makes it or it is the default location."""
    if name not in OWN_ENTRIES:
        raise ValueError(f"{name!r} is not one of the cache's entries {OWN_ENTRIES}")
    root = cache_dir() if root is None else Path(root)
    _mark_new(root, ROOT_MARK)
    if root == default_cache_dir() and not (root / ROOT_MARK).exists():
        (root / ROOT_MARK).write_text("specdec's cache\n")
    _mark_new(root / name, ENTRY_MARK)
    return root / name


def own_root(root: Path) -> bool:
    """Whether specdec made the cache folder ``root`` (or it is the default location)."""
    return not root.is_symlink() and (root / ROOT_MARK).is_file()


def is_own(path: Path) -> bool:
    """Whether ``path`` is an entry specdec made in its cache: a real folder (not a link) with
    specdec's mark, or, in a root specdec made, a folder of ``OWN_ENTRIES`` made before marks."""
    if path.is_symlink() or not path.is_dir():
        return False
    if (path / ENTRY_MARK).is_file():
        return True
    return path.name in OWN_ENTRIES and own_root(path.parent)


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _content(folder: Path) -> list[Path]:
    return sorted(
        p
        for p in folder.iterdir()
        if p.is_file() and not p.is_symlink() and p.name not in (COMPLETE, MANIFEST)
    )


def read_manifest(folder: Path) -> dict[str, dict]:
    """name -> {"size", "sha256"} of ``folder``'s manifest, after checking that every name is a
    plain file name (no folder part, no link out of the folder) with an integer size and a hex
    hash; CorruptFileError otherwise."""
    path = folder / MANIFEST
    files = read_json(path, what="cache manifest").get("files")
    if not isinstance(files, dict):
        raise CorruptFileError(f"cache manifest {path} has no 'files' object")
    for name, entry in files.items():
        if (
            name in ("", ".", "..")
            or Path(name).name != name
            or "\\" in name
            or name in (COMPLETE, MANIFEST)
        ):
            raise CorruptFileError(
                f"cache manifest {path} names {name!r}, which is not a file of its folder"
            )
        size, digest = (
            (entry.get("size"), entry.get("sha256")) if isinstance(entry, dict) else (None, None)
        )
        if (
            isinstance(size, bool)
            or not isinstance(size, int)
            or size < 0
            or not isinstance(digest, str)
            or len(digest) != 64
            or any(c not in "0123456789abcdef" for c in digest)
        ):
            raise CorruptFileError(f"cache manifest {path} has a malformed entry for {name!r}")
    return files


def write_manifest(folder: Path) -> None:
    """Record the size and SHA-256 of every file of ``folder``."""
    files = {p.name: {"size": p.stat().st_size, "sha256": sha256_of(p)} for p in _content(folder)}
    write_json_atomic(folder / MANIFEST, {"files": files})


def record_file(folder: Path, name: str) -> None:
    """Update one file's entry after specdec rewrote it (a config upgrade)."""
    if (folder / MANIFEST).is_file():
        files = read_manifest(folder)
        path = folder / name
        files[name] = {"size": path.stat().st_size, "sha256": sha256_of(path)}
        write_json_atomic(folder / MANIFEST, {"files": files})


def problems(folder: Path, *, full: bool = False) -> list[str]:
    """What is wrong with a converted folder: missing files, sizes (and with ``full``, hashes)
    that differ from the manifest, an incomplete weights file; [] when it is sound."""
    folder = Path(folder)
    if not (folder / COMPLETE).is_file():
        return [f"{folder} is not a complete conversion (no {COMPLETE})"]
    if not (folder / MANIFEST).is_file() or (folder / MANIFEST).is_symlink():
        return [f"{folder / MANIFEST} is missing (the record of its files' sizes and hashes)"]
    try:
        recorded = read_manifest(folder)
    except CorruptFileError as exc:
        return [f"{folder / MANIFEST} is damaged: {exc}"]
    found = [
        f"{path} is a link, not a file specdec wrote"
        for path in sorted(folder.iterdir())
        if path.is_symlink()
    ]
    for name, entry in recorded.items():
        path = folder / name
        if path.is_symlink():
            continue
        if not path.is_file():
            found.append(f"{path} is missing")
        elif path.stat().st_size != entry["size"]:
            found.append(f"{path} has {path.stat().st_size} bytes, {entry['size']} were written")
        elif full and sha256_of(path) != entry["sha256"]:
            found.append(f"{path} has changed since it was written (SHA-256 differs)")
    weights = folder / "model.safetensors"
    if weights.is_file() and not found:
        try:
            check_safetensors(weights)
        except CorruptFileError as exc:
            found.append(str(exc))
    elif not weights.is_file() and "model.safetensors" not in recorded:
        found.append(f"{weights} is missing")
    return found


def install(partial: Path, folder: Path, *, source: str) -> None:
    """Move a finished conversion from ``partial`` into place: manifest, marker, then renames, so
    a reader sees the old folder, no folder, or the new one, never a half-written one."""
    write_manifest(partial)
    (partial / COMPLETE).write_text(source + "\n")
    partial.chmod(0o755)
    old = None
    if folder.exists():
        old = Path(tempfile.mkdtemp(prefix=f".{folder.name}.old-{os.getpid()}-", dir=folder.parent))
        folder.rename(old / folder.name)
    partial.rename(folder)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def work_folder(parent: Path, prefix: str) -> Path:
    """A fresh folder for one process's temporary work, named so ``clean_leftovers`` can tell
    whether its process is still running."""
    parent.mkdir(parents=True, exist_ok=True)
    return Path(tempfile.mkdtemp(prefix=f"{prefix}-{os.getpid()}-", dir=parent))


def _pid_of(path: Path) -> int | None:
    for part in path.name.split("-"):
        if part.isdigit():
            return int(part)
    return None


def _alive(pid: int | None) -> bool:
    if pid is None:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def leftovers(root: Path) -> list[Path]:
    """Work folders left by processes that are gone (killed mid-conversion or mid-download), in
    specdec's own entries only; never a file or a link."""
    found = []
    for sub, pattern in LEFTOVER_PATTERNS:
        if is_own(root / sub):
            found += [
                p
                for p in (root / sub).glob(pattern)
                if p.is_dir() and not p.is_symlink() and not _alive(_pid_of(p))
            ]
    return sorted(found)


def clean_leftovers(root: Path) -> list[Path]:
    """Remove ``leftovers(root)``; returns what was removed."""
    removed = leftovers(root)
    for path in removed:
        shutil.rmtree(path, ignore_errors=True)
    if removed:
        log.info("removed %d leftover work folder(s) of killed runs from %s", len(removed), root)
    return removed


def folder_size(path: Path) -> int:
    return sum(p.stat().st_size for p in Path(path).rglob("*") if p.is_file())


def describe(root: Path) -> list[dict]:
    """One row per converted model in the cache: name, path, bytes, state (sizes checked). In a
    ``models`` folder specdec did not make, only its conversions (with ``COMPLETE``) are listed."""
    rows = []
    models = root / "models"
    own = is_own(models)
    for folder in (
        sorted(
            p
            for p in models.iterdir()
            if p.is_dir() and not p.name.startswith(".") and (own or (p / COMPLETE).is_file())
        )
        if models.is_dir()
        else []
    ):
        found = problems(folder)
        state = "ok" if not found else "damaged: " + "; ".join(found)
        rows.append(
            {"name": folder.name, "path": str(folder), "bytes": folder_size(folder), "state": state}
        )
    return rows


def remove_entry(path: Path) -> None:
    """Remove a cache entry: a link itself (never what it points to), a file, or a folder."""
    if path.is_symlink() or path.is_file():
        path.unlink()
    elif path.is_dir():
        shutil.rmtree(path)


def clear_all(root: Path) -> tuple[list[Path], list[Path]]:
    """Remove the entries specdec made in the cache folder ``root`` (``is_own``), and ``root``
    itself when specdec made it and nothing else is left (never the working or home folder);
    returns (removed, the other entries, left in place)."""
    if not root.is_dir():
        return [], []
    removed, others = [], []
    for path in sorted(root.iterdir()):
        if path.name == ROOT_MARK:
            continue
        if is_own(path):
            shutil.rmtree(path)
            removed.append(path)
        else:
            others.append(path)
    keep = {Path.cwd().resolve(), Path.home().resolve()}
    if not others and own_root(root) and root.resolve() not in keep:
        (root / ROOT_MARK).unlink()
        root.rmdir()
    return removed, others
