"""The specdec cache verifies what it serves.

Each converted model folder records the size and SHA-256 of its files in ``MANIFEST`` when it
is written. Every load checks the sizes (and that the weights file is structurally complete);
the full hashes are checked when a load fails and on request (``specdec cache verify``), and
a damaged folder is repaired by converting it again. A folder without its manifest, with a
manifest that names anything but a plain file of the folder, or with a link among its files
is damaged too: nothing in a cache folder makes specdec read outside it. ``clear --all``
removes only the entries specdec makes (``OWN_ENTRIES``), never the folder ``$SPECDEC_CACHE``
names. Work folders of killed runs (a conversion's
``.NAME.partial-PID-*``, a download's ``tmp/fetch-PID-*``) are removed on the next start once
their process is gone.
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
MANIFEST = ".specdec-manifest.json"
LEFTOVER_PATTERNS = (("models", ".*.partial-*"), ("models", ".*.old-*"), ("tmp", "fetch-*"))
OWN_ENTRIES = (
    "models",
    "tmp",
    "tuning",
    "teacher",
    "corpus",
)  # what specdec makes in its cache folder

log = logging.getLogger("specdec.models.cache")


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
    """Work folders left by processes that are gone (killed mid-conversion or mid-download)."""
    found = []
    for sub, pattern in LEFTOVER_PATTERNS:
        if (root / sub).is_dir():
            found += [p for p in (root / sub).glob(pattern) if not _alive(_pid_of(p))]
    return sorted(found)


def clean_leftovers(root: Path) -> list[Path]:
    """Remove ``leftovers(root)``; returns what was removed."""
    removed = leftovers(root)
    for path in removed:
        shutil.rmtree(path, ignore_errors=True) if path.is_dir() else path.unlink(missing_ok=True)
    if removed:
        log.info("removed %d leftover work folder(s) of killed runs from %s", len(removed), root)
    return removed


def folder_size(path: Path) -> int:
    return sum(p.stat().st_size for p in Path(path).rglob("*") if p.is_file())


def describe(root: Path) -> list[dict]:
    """One row per converted model in the cache: name, path, bytes, state (sizes checked)."""
    rows = []
    models = root / "models"
    for folder in (
        sorted(p for p in models.iterdir() if p.is_dir() and not p.name.startswith("."))
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
    """Remove specdec's entries of the cache folder ``root`` (``OWN_ENTRIES``), and ``root``
    itself once it is empty; returns (removed, the other entries, left in place)."""
    if not root.is_dir():
        return [], []
    removed, others = [], []
    for path in sorted(root.iterdir()):
        if path.name in OWN_ENTRIES:
            remove_entry(path)
            removed.append(path)
        else:
            others.append(path)
    if not others and not root.is_symlink():
        root.rmdir()
    return removed, others
