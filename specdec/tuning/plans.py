"""The drafter's plan: ``specdec plan`` measures which settings decode fastest for a drafter on
this machine (a beam drafter's width and length, a tree drafter's tree, and whether the
prompt-lookup beam rides along); ``save_drafter_plan`` keeps its recommendation in the tuning cache
(``specdec.tuning.store``) and ``generate`` uses it when the caller names none of those settings
(``cached_drafter_plan``). Plans are keyed by the backend and its device, the target's dtype and
name, and the drafter (a checkpoint folder by its weights' size and time, so a retrained
checkpoint in the same folder is planned again). The device is its description without a thread
count: a process that took fewer threads (other work beside it at its start) uses the plan made on
this machine, whose file says the device it was made on (``describe_plan``).
"""

from __future__ import annotations

import re
import time
from pathlib import Path

from specdec.tuning.dtype import dtype_name
from specdec.tuning.store import digest, read_entry, tuning_dir, write_entry

__all__ = ["cached_drafter_plan", "describe_plan", "save_drafter_plan"]

CACHE_VERSION = 2  # 2: the device without its thread count
# a thread count in a backend's device description: torch's ", 2 threads", MLX's ", OpenBLAS on 1
# thread"
THREADS = re.compile(r",? (?:OpenBLAS on )?(\d+) threads?\b")


def _device(backend, target) -> str:
    """The backend's description of the target's device ("" where it gives none)."""
    if not hasattr(backend, "describe_device"):
        return ""
    return backend.describe_device(getattr(target, "device", None))


def _plan_file(backend, target, drafter: str) -> Path:
    key = {
        "version": CACHE_VERSION,
        "backend": backend.name,
        "device": THREADS.sub("", _device(backend, target)),
        "dtype": dtype_name(target, ""),
        "target": getattr(target, "name", ""),
        "drafter": _drafter_identity(drafter),
    }
    return tuning_dir() / f"plan-{backend.name}-{digest(key)}.json"


def _drafter_identity(drafter: str) -> str:
    """A drafter name as given, or a checkpoint folder with its weights' size and time (so a
    retrained checkpoint in the same folder is planned again)."""
    folder = Path(drafter)
    if folder.is_dir():
        weights = folder / "model.safetensors"
        stat = weights.stat() if weights.is_file() else None
        return f"{folder.resolve()}:{stat.st_size if stat else 0}:{stat.st_mtime_ns if stat else 0}"
    return str(drafter)


def save_drafter_plan(backend, target, drafter: str, *, options: dict, details: dict) -> Path:
    """Keep ``specdec plan``'s recommendation (``options``: the drafter's settings, each an int;
    ``details["lookup"]``: whether the prompt-lookup beam rides along) for this backend, device,
    dtype, target and drafter."""
    file = _plan_file(backend, target, drafter)
    write_entry(
        file,
        {
            "options": {str(k): int(v) for k, v in options.items()},
            **details,
            # what it was planned for, in words (``describe_plan``; the file's name is a digest)
            "drafter": str(drafter),
            "target": getattr(target, "name", "") or "",
            "backend": backend.name,
            "dtype": dtype_name(target, ""),
            "device": _device(backend, target),
            "planned_at": time.strftime("%Y-%m-%dT%H:%M:%S"),
        },
    )
    return file


def describe_plan(plan: dict) -> str:
    """A kept plan in one line: what it is for, its settings, and what it measured."""
    threads = THREADS.search(str(plan.get("device", "")))
    made_on = [] if threads is None else [f"made on {threads.group(1)} thread(s)"]
    where = ", ".join([str(plan[k]) for k in ("backend", "dtype") if plan.get(k)] + made_on)
    target = f" on {plan['target']}" if plan.get("target") else ""
    what = f"{plan.get('drafter', 'a drafter')}{target}" + (f" ({where})" if where else "")
    settings = " ".join(f"{k}={v}" for k, v in (plan.get("options") or {}).items())
    if isinstance(plan.get("lookup"), bool):
        settings += f", lookup {'on' if plan['lookup'] else 'off'}"
    measured = plan.get("measured_speedup")
    figure = f"measured {measured:.2f}x" if isinstance(measured, (int, float)) else "kept"
    prompts = f" on {plan['prompts']} prompts" if plan.get("prompts") else ""
    return f"{what}: {settings}; {figure}{prompts}, {plan.get('planned_at', '')}".rstrip(", ")


def cached_drafter_plan(backend, target, drafter) -> dict | None:
    """{"options": {name: int >= 1}, "lookup": bool or absent, ...} planned for this setting, or
    None (none kept, or a file that is not a whole plan)."""
    if not isinstance(drafter, (str, Path)):
        return None
    plan = read_entry(_plan_file(backend, target, str(drafter)))
    options = plan.get("options") if plan else None
    if not isinstance(options, dict) or not all(
        isinstance(v, int) and not isinstance(v, bool) and v >= 1 for v in options.values()
    ):
        return None
    if "lookup" in plan and not isinstance(plan["lookup"], bool):
        return None
    return plan
