"""Choices measured on the machine at hand: the fastest dtype of a target, and the beam plan.

**The dtype.** Which precision runs fastest depends on the machine, not on the model: on a CPU
with bfloat16 matrix instructions (AVX-512 BF16, AMX) bfloat16 halves the bytes a decode step
reads and runs a small tree almost for free; on a CPU with only AVX2 the same bfloat16 kernels
run several times slower than float32. So ``dtype=None`` is not a fixed default: the first time
a model shape runs on a machine, ``load_fastest`` loads the target in every candidate dtype the
backend offers (``Backend.dtype_candidates``), times a few forwards at tree sizes 1 and 8, keeps
the fastest and caches the choice under ``<specdec cache>/tuning/``, keyed by

- the backend and its framework version (``Backend.describe_device``),
- the device (CPU model and instruction-set flags with the thread count, or the GPU's name),
- the model's architecture (the config's shape fields: layers, widths, heads, vocabulary).

The weights' values do not change the speed, so two models of one shape share a measurement and
no fingerprint of the weights is computed. Later loads read the cache and load once.

**The drafter's plan.** ``specdec plan`` measures which settings decode fastest for a drafter on
this machine (a beam drafter's width and length, a tree drafter's tree, and whether the
prompt-lookup beam rides along); ``save_drafter_plan`` keeps its recommendation and ``generate``
uses it when the caller names none of those settings (``cached_drafter_plan``).

Everything here is a speed choice, never a correctness one: a stale or deleted cache file only
costs a measurement. A measurement taken while other work shared the cores (``machine_share``)
is taken again at later starts, ``MEASURES`` times in all at most, and the quietest decides.
``specdec tune`` re-measures and prints the table; ``$SPECDEC_DTYPE``
(e.g. ``float32``) names the dtype to use instead of measuring, for runs that must not depend
on timing.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import platform
import time
from pathlib import Path
from typing import Any, Sequence

import attrs
import numpy as np

from specdec.models.cache import cache_dir, cache_entry
from specdec.models.checkpoints import write_json_atomic
from specdec.models.files import read_json
from specdec.reference.tree import build_prefix_tree
from specdec.slots import on_target
from specdec.types import DraftTree

__all__ = [
    "CpuClock",
    "DtypeChoice",
    "architecture_key",
    "cached_drafter_plan",
    "cpu_description",
    "cpu_flags",
    "dtype_cache_file",
    "load_fastest",
    "machine_share",
    "measure_forward",
    "save_drafter_plan",
    "settled",
]

DTYPE_VARIABLE = "SPECDEC_DTYPE"  # when set (e.g. float32), the dtype used instead of measuring
TREE_SIZES = (1, 8)  # a one-token decode step and a typical verification tree
PROMPT_TOKENS = 64
REPEATS = 5
CACHE_VERSION = 1
# a measurement whose process got less of the cores' time than this shared them with other work
# (``machine_share``), and is taken again at later starts, this many times in all at most
QUIET_SHARE = 0.85
MEASURES = 3
SHAPE_FIELDS = (
    "model_type",
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "vocab_size",
    "tie_word_embeddings",
)


@attrs.frozen(kw_only=True)
class DtypeChoice:
    """The dtype a target was loaded in and why.

    dtype: the chosen name; source: "measured" (timed now), "cached" (timed earlier on this
    machine), "only candidate" (the backend offers one dtype here), "$SPECDEC_DTYPE" or "given"
    (the caller's);
    timings: {dtype: {tree size: median ms of one forward}} of the measurement; device: what
    the measurement ran on.
    """

    dtype: str
    source: str
    timings: dict = attrs.field(factory=dict)
    device: str = ""

    def describe(self) -> str:
        """One line for people: the choice, and the numbers behind it."""
        if not self.timings:
            return f"{self.dtype} ({self.source})"
        parts = ", ".join(
            f"{name} " + " / ".join(f"{ms:.1f}" for ms in sizes.values()) + " ms"
            for name, sizes in self.timings.items()
        )
        sizes = "/".join(str(k) for k in next(iter(self.timings.values())))
        return (
            f"{self.dtype}, the fastest here ({self.source}: one forward of {sizes} tokens: "
            f"{parts}; on {self.device})"
        )


@functools.lru_cache(maxsize=1)
def _cpuinfo() -> tuple[str, frozenset]:
    """(model name, instruction-set flags) of the CPU, from /proc/cpuinfo where there is one."""
    model, flags = "", frozenset()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            key = key.strip()
            if key in ("model name", "Model", "cpu model") and not model:
                model = value.strip()
            elif key in ("flags", "Features") and not flags:
                flags = frozenset(value.split())
    except OSError:
        pass
    return model or platform.processor() or platform.machine(), flags


def cpu_flags() -> frozenset:
    """The CPU's instruction-set flags (empty where the system does not list them)."""
    return _cpuinfo()[1]


def cpu_description() -> str:
    """The CPU's model name and a digest of its flags: two machines with the same name but other
    instruction sets (AVX-512 BF16 or only AVX2) are told apart."""
    model, flags = _cpuinfo()
    digest = (
        hashlib.sha256(" ".join(sorted(flags)).encode()).hexdigest()[:12] if flags else "no flags"
    )
    return f"{model} [flags {digest}]"


def architecture_key(source: Any) -> dict | None:
    """The shape fields of a model folder's config.json, or None for anything else (a model object
    or a loaded target, whose dtype is the caller's)."""
    if not isinstance(source, (str, Path)):
        return None
    config_file = Path(source) / "config.json"
    if not config_file.is_file():
        return None
    try:
        config = read_json(config_file, what="model config")
    except (OSError, ValueError):  # CorruptFileError included
        return None  # the loader reports the broken file
    text = config.get("text_config", config)
    if not isinstance(text, dict):
        return None
    return {field: text.get(field) for field in SHAPE_FIELDS}


def _digest(value: Any) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True, default=str).encode()).hexdigest()[:20]


def _tuning_dir() -> Path:
    return cache_dir() / "tuning"


def dtype_cache_file(backend, device: str | None, architecture: dict) -> Path:
    """Where the dtype choice of this backend, device and model shape is kept."""
    key = {
        "version": CACHE_VERSION,
        "backend": backend.name,
        "device": backend.describe_device(device),
        "architecture": architecture,
    }
    return _tuning_dir() / f"dtype-{backend.name}-{_digest(key)}.json"


def _read(file: Path) -> dict | None:
    try:
        return read_json(file, what="tuning cache file")
    except (OSError, ValueError):  # CorruptFileError included
        return None  # absent or damaged: measure again


def _write(file: Path, value: dict) -> None:
    try:
        if file.parent == _tuning_dir():
            cache_entry("tuning")
        file.parent.mkdir(parents=True, exist_ok=True)
        write_json_atomic(file, value)
    except OSError:
        pass  # a read-only cache only costs a measurement next time


def chain_tree(backend, target, rows: int, width: int) -> DraftTree:
    """A tree of ``rows`` rows, each a chain of ``width`` made-up tokens, on the target's backend:
    what the forwards timed on this machine carry."""
    tokens = np.arange(rows * width, dtype=np.int64) * 104729 + 1
    vocab = int(target.vocab_size)
    return on_target(build_prefix_tree((tokens % vocab).reshape(rows, 1, width)), backend, target)


def measure_forward(
    backend, target, sizes: Sequence[int] = TREE_SIZES, *, repeats: int = REPEATS
) -> dict[int, float]:
    """Median milliseconds of one ``forward_tree`` over a chain of k tokens, for each k in
    ``sizes``, after a ``PROMPT_TOKENS``-token prompt admitted into slot 0
    (the result is read back to the host, so lazy backends are timed too). Sizes are interleaved per
    repeat; slot 0 is released after."""
    vocab = int(target.vocab_size)
    prompt = (np.arange(PROMPT_TOKENS, dtype=np.int64) * 7919 + 13) % vocab
    slot = np.array([0])
    target.admit(0, prompt.tolist())
    trees = {k: chain_tree(backend, target, 1, k) for k in sizes}

    def once(k: int) -> float:
        start = time.perf_counter()
        backend.to_numpy(target.forward_tree(trees[k], slot).logits[:, -1:, :1])
        return time.perf_counter() - start

    for k in sizes:  # warm-up: first calls allocate and pick kernels
        once(k), once(k)
    times = {k: [] for k in sizes}
    for _ in range(repeats):
        for k in sizes:
            times[k].append(once(k))
    target.release(0)
    return {k: round(1e3 * float(np.median(v)), 3) for k, v in times.items()}


def _score(timings: dict[int, float]) -> float:
    """Plain decoding runs the one-token forward, speculation the tree: both count."""
    return float(sum(timings.values()))


def load_fastest(backend, source, *, device: str | None = None, remeasure: bool = False, **slots):
    """(target, DtypeChoice): ``source`` (a model folder) loaded in the fastest of the backend's
    dtype candidates on this machine, measured once and cached (module docstring); ``slots``:
    the ``slots`` / ``capacity`` to load it with."""
    forced = os.environ.get(DTYPE_VARIABLE, "").strip()
    if forced and forced != "auto":
        target = backend.load_target(source, dtype=forced, device=device, **slots)
        return target, DtypeChoice(dtype=forced, source=f"${DTYPE_VARIABLE}")
    candidates = tuple(backend.dtype_candidates(device))
    architecture = architecture_key(source)
    if len(candidates) == 1 or architecture is None:
        target = backend.load_target(
            source,
            dtype=candidates[0] if architecture is not None else None,
            device=device,
            **slots,
        )
        return target, DtypeChoice(
            dtype=_dtype_name(target, candidates[0]), source="only candidate"
        )
    file = dtype_cache_file(backend, device, architecture)
    cached = None if remeasure else _read(file)
    busy = bool(cached) and not settled(cached)  # taken beside other work: measured again
    if cached and cached.get("dtype") in candidates and not busy:
        target = backend.load_target(source, dtype=cached["dtype"], device=device, **slots)
        return target, DtypeChoice(
            dtype=cached["dtype"],
            source="cached",
            timings=cached.get("timings", {}),
            device=cached.get("device", ""),
        )
    best, best_score, timings, clock = None, float("inf"), {}, CpuClock()
    if slots.get("capacity") is not None:  # room for the measurement's prompt and trees
        slots = {**slots, "capacity": max(int(slots["capacity"]), PROMPT_TOKENS + max(TREE_SIZES))}
    for dtype in candidates:
        target = backend.load_target(source, dtype=dtype, device=device, **slots)
        with clock:
            timings[dtype] = measure_forward(backend, target)
        if _score(timings[dtype]) < best_score:
            best, best_score = (dtype, target), _score(timings[dtype])
        del target  # at most two targets are held at once: the best so far and this one
    dtype, target = best
    share, measures = clock.share, 1
    if busy:  # measured again: the quieter of the two measurements decides
        measures = int(cached.get("measures", 1)) + 1
        if share < float(cached.get("share", 0.0)) and cached["dtype"] in candidates:
            dtype, timings, share = cached["dtype"], cached.get("timings", {}), cached["share"]
            if dtype != best[0]:
                del target, best
                target = backend.load_target(source, dtype=dtype, device=device, **slots)
    described = backend.describe_device(device)
    _write(
        file,
        {
            "dtype": dtype,
            "timings": timings,
            "device": described,
            "architecture": architecture,
            "candidates": list(candidates),
            "share": round(share, 3),
            "measures": measures,
            "measured_at": time.strftime("%Y-%m-%dT%H:%M:%S"),
        },
    )
    return target, DtypeChoice(dtype=dtype, source="measured", timings=timings, device=described)


def machine_share(wall: float, cpu: float) -> float:
    """The share of this machine's cores the process computed on over ``wall`` seconds in which it
    used ``cpu`` seconds of CPU time: about 1 where a measurement had the cores to itself (0.99
    for SmolLM2-135M's forwards on 2 cores), 0.63 beside one busy process, 0.50 beside two. A
    measurement below ``QUIET_SHARE`` shared the cores with other work: its timings have the
    wrong proportions, not only the wrong scale. (A device whose work is not CPU time, a GPU,
    reads as busy and is measured ``MEASURES`` times, once.)"""
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cores = os.cpu_count() or 1
    return cpu / max(wall * cores, 1e-9)


def settled(cached: dict) -> bool:
    """Whether a cached measurement stands: its process had the cores (a share of at least
    ``QUIET_SHARE``; a file from before shares were recorded counts as quiet), or it has been
    taken ``MEASURES`` times already."""
    return (
        float(cached.get("share", 1.0)) >= QUIET_SHARE or int(cached.get("measures", 1)) >= MEASURES
    )


class CpuClock:
    """The wall and CPU seconds of the process inside ``with clock:`` blocks, and the share of
    the machine's cores they amount to (``machine_share``)."""

    def __init__(self):
        self.wall = self.cpu = 0.0

    def __enter__(self) -> "CpuClock":
        self._start = (time.perf_counter(), time.process_time())
        return self

    def __exit__(self, *exc) -> None:
        wall, cpu = self._start
        self.wall += time.perf_counter() - wall
        self.cpu += time.process_time() - cpu

    @property
    def share(self) -> float:
        return machine_share(self.wall, self.cpu)


def _dtype_name(target, fallback: str) -> str:
    dtype = getattr(target, "dtype", None)
    return str(dtype).rpartition(".")[2] if dtype is not None else fallback


# ------------------------------------------------------------------------------------------
# Drafter plans


def _plan_file(backend, target, drafter: str) -> Path:
    key = {
        "version": CACHE_VERSION,
        "backend": backend.name,
        "device": backend.describe_device(getattr(target, "device", None))
        if hasattr(backend, "describe_device")
        else "",
        "dtype": _dtype_name(target, ""),
        "target": getattr(target, "name", ""),
        "drafter": _drafter_identity(drafter),
    }
    return _tuning_dir() / f"plan-{backend.name}-{_digest(key)}.json"


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
    _write(
        file,
        {
            "options": {str(k): int(v) for k, v in options.items()},
            **details,
            "planned_at": time.strftime("%Y-%m-%dT%H:%M:%S"),
        },
    )
    return file


def cached_drafter_plan(backend, target, drafter) -> dict | None:
    """{"options": {name: int >= 1}, "lookup": bool or absent, ...} planned for this setting, or
    None (none kept, or a file that is not a whole plan)."""
    if not isinstance(drafter, (str, Path)):
        return None
    plan = _read(_plan_file(backend, target, str(drafter)))
    options = plan.get("options") if plan else None
    if not isinstance(options, dict) or not all(
        isinstance(v, int) and not isinstance(v, bool) and v >= 1 for v in options.values()
    ):
        return None
    if "lookup" in plan and not isinstance(plan["lookup"], bool):
        return None
    return plan
