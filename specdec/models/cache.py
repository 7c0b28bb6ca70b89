"""The specdec cache verifies what it serves.

Each converted model folder records the size and SHA-256 of its files in ``MANIFEST`` when it
is written. Every load checks the sizes (and that the weights file is structurally complete);
the full hashes are checked when a load fails and on request (``specdec cache verify``), and
a damaged folder is repaired by converting it again. Work folders of killed runs (a conversion's
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

log = logging.getLogger("specdec.models.cache")


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _content(folder: Path) -> list[Path]:
    return sorted(p for p in folder.iterdir() if p.is_file() and p.name not in (COMPLETE, MANIFEST))


def write_manifest(folder: Path) -> None:
    """Record the size and SHA-256 of every file of ``folder``."""
    files = {p.name: {"size": p.stat().st_size, "sha256": sha256_of(p)} for p in _content(folder)}
    write_json_atomic(folder / MANIFEST, {"files": files})


def record_file(folder: Path, name: str) -> None:
    """Update one file's entry after specdec rewrote it (a config upgrade)."""
    if (folder / MANIFEST).is_file():
        manifest = read_json(folder / MANIFEST, what="cache manifest")
        path = folder / name
        manifest["files"][name] = {"size": path.stat().st_size, "sha256": sha256_of(path)}
        write_json_atomic(folder / MANIFEST, manifest)


def problems(folder: Path, *, full: bool = False) -> list[str]:
    """What is wrong with a converted folder: missing files, sizes (and with ``full``, hashes)
    that differ from the manifest, an incomplete weights file; [] when it is sound."""
    folder = Path(folder)
    if not (folder / COMPLETE).is_file():
        return [f"{folder} is not a complete conversion (no {COMPLETE})"]
    found = []
    try:
        recorded = read_json(folder / MANIFEST, what="cache manifest")["files"] if (folder / MANIFEST).is_file() else {}
    except (CorruptFileError, KeyError):
        recorded, found = {}, [f"{folder / MANIFEST} is damaged"]
    for name, entry in recorded.items():
        path = folder / name
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
    for folder in sorted(p for p in models.iterdir() if p.is_dir() and not p.name.startswith(".")) \
            if models.is_dir() else []:
        found = problems(folder)
        state = "ok" if not found else "damaged: " + "; ".join(found)
        if not found and not (folder / MANIFEST).is_file():
            state = "ok (sizes unrecorded: converted by an older specdec)"
        rows.append({"name": folder.name, "path": str(folder), "bytes": folder_size(folder), "state": state})
    return rows
