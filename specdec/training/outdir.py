"""The training output folder: training never destroys what it did not create.

``claim_out`` runs before any work. It records the run in ``training_run.json`` (kind and the
settings that define it) and refuses, with what is there and how to proceed:

- a non-empty folder that is not a training run (a model folder, anything else), unless
  ``overwrite``: training would replace its ``config.json`` and ``model.safetensors``;
- a training run of another kind, or a run of this kind with saved work, unless ``resume``
  (continue it) or ``overwrite`` (start again, removing that run's files);
- ``resume`` with nothing saved;
- ``resume`` with settings that change the run (learning rate, beam shape, data ...), unless
  ``allow_changes``; both the old and the new settings are then recorded.

Budget (steps, minutes), save dtype, threads and progress bars are not part of a run's
identity: a resume may extend the budget or save in another dtype.
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path

from specdec.models.checkpoints import write_json_atomic
from specdec.models.files import read_json
from specdec.errors import InvalidInputError, TrainingOutputError
from specdec.models.outfolder import refuse_dangerous_out
from specdec.plugins.registry import default_registry

RUN_FILE = "training_run.json"
STATE_FILE = "trainer_state.safetensors"
LEGACY_STATE_FILE = "trainer_state.pt"  # pickled by older versions; read only without code
LOG_FILE = "training_log.json"
LAST_DIR = "last"
REPORT_FILE = "training_report.json"
RUN_FILES = (
    "config.json",
    "model.safetensors",
    STATE_FILE,
    LEGACY_STATE_FILE,
    LOG_FILE,
    REPORT_FILE,
    RUN_FILE,
)


def _a(word: str) -> str:
    """``word`` with its indefinite article ("an eagle3", "a medusa")."""
    return f"{'an' if word[:1].lower() in 'aeiou' else 'a'} {word}"


def _model_types() -> dict[str, str]:
    """Drafter name -> the model_type of its checkpoints, for every installed drafter spec."""
    return {
        spec.name: spec.model_type for spec in default_registry().drafter_specs() if spec.model_type
    }


def _listing(folder: Path) -> str:
    names = sorted(p.name + ("/" if p.is_dir() else "") for p in folder.iterdir())
    return ", ".join(names[:6]) + (f" and {len(names) - 6} more" if len(names) > 6 else "")


def _read_json(path: Path):
    try:
        return read_json(path, kind=None)
    except (OSError, ValueError):  # CorruptFileError included: the callers say what is wrong
        return None


def has_state(folder: Path) -> bool:
    """Whether ``folder`` holds a saved trainer state (this version's file or an older one)."""
    return (folder / STATE_FILE).is_file() or (folder / LEGACY_STATE_FILE).is_file()


def existing_run(folder: Path) -> dict | None:
    """The run recorded in ``folder`` ({"kind", "settings", ...}), or None if it holds none.

    A folder written before runs were recorded counts as a run of the kind its checkpoint names
    when it has a saved trainer state (its settings are then unknown: None)."""
    record = _read_json(folder / RUN_FILE)
    model_types = _model_types()
    if isinstance(record, dict) and record.get("kind") in model_types:
        return record
    config = _read_json(folder / "config.json")
    if has_state(folder) and isinstance(config, dict):
        kind = {v: k for k, v in model_types.items()}.get(config.get("model_type"))
        if kind:
            return {"kind": kind, "settings": None, "resumes": []}
    return None


def describe_progress(folder: Path) -> str:
    log = _read_json(folder / LOG_FILE)
    if not isinstance(log, dict) or not log.get("history"):
        return "saved state, not yet evaluated" if has_state(folder) else "nothing saved yet"
    best = max(row.get("score", row.get("tokens_per_step", 0.0)) for row in log["history"])
    return f"step {log.get('step')}, best held-out {best:.2f} tokens/step"


def has_work(folder: Path) -> bool:
    return any(
        (folder / name).exists()
        for name in ("model.safetensors", STATE_FILE, LEGACY_STATE_FILE, LAST_DIR)
    )


def remove_leftovers(folder: Path) -> None:
    """Remove half-written files of a killed save (``.NAME.PID.partial``) from the run folder."""
    for sub in (folder, folder / LAST_DIR):
        if sub.is_dir():
            for leftover in sub.glob(".*.partial"):
                leftover.unlink(missing_ok=True)


def _changes(old: dict | None, new: dict) -> dict:
    if old is None:
        return {}
    return {
        key: [old.get(key), new.get(key)]
        for key in sorted(set(old) | set(new))
        if old.get(key) != new.get(key)
    }


def claim_out(
    out,
    *,
    kind: str,
    settings: dict,
    resume: bool,
    overwrite: bool = False,
    allow_changes: bool = False,
    sources=(),
) -> dict:
    """Check ``out`` for a ``kind`` run with ``settings`` (JSON values) and record the run; returns
    the record. ``sources`` (the target, an initial checkpoint) and the home and working folders
    are refused as ``out``, as is any folder holding one of them."""
    folder = Path(out)
    if folder.exists() and not folder.is_dir():
        raise TrainingOutputError(
            f"--out {folder} is a file, not a folder: choose a folder for the checkpoint"
        )
    try:
        refuse_dangerous_out(folder, sources=sources)
    except InvalidInputError as exc:
        raise TrainingOutputError(str(exc)) from None
    if resume and overwrite:
        raise TrainingOutputError(
            "--resume continues the run in --out and --overwrite starts it again: give one"
        )
    empty = not folder.exists() or not any(folder.iterdir())
    run = None if empty else existing_run(folder)
    if resume:
        if run is None or run["kind"] != kind or not has_state(folder):
            what = (
                "does not exist"
                if not folder.exists()
                else "is empty"
                if empty
                else (
                    f"holds a {run['kind']} run"
                    if run and run["kind"] != kind
                    else f"has no saved training state ({STATE_FILE})"
                    if run
                    else f"holds no training run ({_listing(folder)})"
                )
            )
            raise TrainingOutputError(
                f"--resume: nothing to resume in {folder}: it {what}; run without --resume to "
                "start a new run"
            )
        changed = _changes(current_settings(run), settings)
        if changed and not allow_changes:
            listed = "; ".join(
                f"{k}: {old!r} -> {new!r}" for k, old, new in ((k, *v) for k, v in changed.items())
            )
            raise TrainingOutputError(
                f"--resume with settings that change the run in {folder} ({listed}): pass "
                "--allow-changes to continue with the new settings (both are recorded in "
                "training_run.json), or train into a new folder"
            )
        run.setdefault("resumes", []).append(
            {"at": time.strftime("%Y-%m-%dT%H:%M:%S"), "settings": settings, "changed": changed}
        )
    elif not empty:
        if run is None and not overwrite:
            raise TrainingOutputError(
                f"--out {folder} is not empty and holds no training run (it has "
                f"{_listing(folder)}); training writes config.json and model.safetensors there and "
                "would replace those files: choose a new or empty folder, or pass --overwrite to "
                "write there anyway"
            )
        if run is not None and run["kind"] != kind and not overwrite:
            raise TrainingOutputError(
                f"--out {folder} holds {_a(run['kind'])} training run, not {_a(kind)} one: choose "
                "another folder, or pass --overwrite to replace it"
            )
        if run is not None and run["kind"] == kind and has_work(folder) and not overwrite:
            raise TrainingOutputError(
                f"--out {folder} already holds {_a(kind)} training run "
                f"({describe_progress(folder)}): pass --resume to continue it, choose a new "
                "folder, or pass --overwrite to start again and replace it"
            )
        # starting again over a run: its files go, nothing else in the folder does
        if run is not None:
            for name in RUN_FILES:
                (folder / name).unlink(missing_ok=True)
            shutil.rmtree(folder / LAST_DIR, ignore_errors=True)
        run = None
    if run is None:
        run = {
            "kind": kind,
            "settings": settings,
            "started": time.strftime("%Y-%m-%dT%H:%M:%S"),
            "resumes": [],
        }
    try:
        folder.mkdir(parents=True, exist_ok=True)
        remove_leftovers(folder)
        write_json_atomic(folder / RUN_FILE, run)
    except OSError as exc:
        raise TrainingOutputError(
            f"cannot write to --out {folder}: {exc.strerror or exc}; choose a writable folder"
        ) from None
    return run


def current_settings(run: dict) -> dict | None:
    """The settings in effect: the last resume's, else the run's own."""
    resumes = run.get("resumes") or []
    return resumes[-1]["settings"] if resumes else run.get("settings")
