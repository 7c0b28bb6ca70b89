"""The fastest dtype of a target, measured on the machine at hand.

Which precision runs fastest depends on the machine, not on the model: on a CPU
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

The choice is kept in the tuning cache (``specdec.tuning.store``: a stale or deleted file only
costs a measurement); one taken while other work shared the cores
(``specdec.tuning.machine.free_share``) is taken again at a later start that finds the machine
quiet, and the quieter decides.
``specdec tune`` re-measures and prints the table; ``$SPECDEC_DTYPE``
(e.g. ``float32``) names the dtype to use instead of measuring, for runs that must not depend
on timing.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Any, Sequence

import attrs
import numpy as np

from specdec.models.files import read_json
from specdec.reference.tree import build_prefix_tree
from specdec.slots import on_target
from specdec.tuning.machine import Measured, cpu_description, cpu_flags
from specdec.tuning.store import (
    digest,
    read_entry,
    say_if_busy,
    say_measuring,
    settled,
    tuning_dir,
    write_entry,
)
from specdec.types import DraftTree

__all__ = [
    "DtypeChoice",
    "architecture_key",
    "chain_tree",
    "cpu_description",  # specdec.tuning.machine's, importable here as before
    "cpu_flags",
    "dtype_cache_file",
    "dtype_name",
    "load_fastest",
    "measure_forward",
]

DTYPE_VARIABLE = "SPECDEC_DTYPE"  # when set (e.g. float32), the dtype used instead of measuring
TREE_SIZES = (1, 8)  # a one-token decode step and a typical verification tree
PROMPT_TOKENS = 64
REPEATS = 5
CACHE_VERSION = 1
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
            f"{self.dtype}, the fastest here over a one-token and a tree forward together "
            f"({self.source}: one forward of {sizes} tokens: {parts}; on {self.device})"
            + self._faster_alone()
        )

    def _faster_alone(self) -> str:
        """Where another dtype's one-token forward beat the chosen one's: why it still lost (a
        header of "bfloat16 29.0 / 126.4 ms" beside float32's 48.8 read as bfloat16 decoding
        faster, while its trees and prompts, the larger forwards, cost about twice as much)."""
        chosen = self.timings.get(self.dtype, {})
        one = min(chosen, default=None)
        if one is None or len(chosen) < 2:
            return ""
        big = max(chosen)
        faster = [
            name
            for name, sizes in self.timings.items()
            if name != self.dtype and sizes.get(one, float("inf")) < chosen[one]
        ]
        return "".join(
            f"; {name} forwards one token faster ({self.timings[name][one]:.1f} ms), but "
            f"{big} tokens slower ({self.timings[name][big]:.1f} ms): trees and prompts run the "
            "larger forwards"
            for name in faster
        )


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


def dtype_cache_file(backend, device: str | None, architecture: dict) -> Path:
    """Where the dtype choice of this backend, device and model shape is kept."""
    key = {
        "version": CACHE_VERSION,
        "backend": backend.name,
        "device": backend.describe_device(device),
        "architecture": architecture,
    }
    return tuning_dir() / f"dtype-{backend.name}-{digest(key)}.json"


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
        return target, DtypeChoice(dtype=dtype_name(target, candidates[0]), source="only candidate")
    file = dtype_cache_file(backend, device, architecture)
    cached = None if remeasure else read_entry(file)
    busy = bool(cached) and not settled(cached, file)  # taken beside other work: again
    if cached and cached.get("dtype") in candidates and not busy:
        say_if_busy(file, float(cached.get("share", 1.0)), BUSY_LINE, dtype=cached["dtype"])
        target = backend.load_target(source, dtype=cached["dtype"], device=device, **slots)
        return target, DtypeChoice(
            dtype=cached["dtype"],
            source="cached",
            timings=cached.get("timings", {}),
            device=cached.get("device", ""),
        )
    say_measuring(
        f"which of {', '.join(candidates)} runs {Path(str(source)).name} fastest",
        again=cached if busy else None,
    )
    best, best_score, timings, clock = None, float("inf"), {}, Measured()
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
    share, measures = clock.free, 1
    if busy:  # measured again: the quieter of the two measurements decides
        measures = int(cached.get("measures", 1)) + 1
        if share < float(cached.get("share", 0.0)) and cached["dtype"] in candidates:
            dtype, timings, share = cached["dtype"], cached.get("timings", {}), cached["share"]
            if dtype != best[0]:
                del target, best
                target = backend.load_target(source, dtype=dtype, device=device, **slots)
    if busy and cached.get("dtype") != dtype:  # a choice taken busy, measured anew, replaced
        print(
            f"specdec: the dtype measured fastest here is now {dtype}, not {cached.get('dtype')} "
            "(measured while other work shared the cores): greedy outputs can differ from earlier "
            f"runs' where they rounded apart; dtype={cached.get('dtype')!r} pins the old one",
            file=sys.stderr,
            flush=True,
        )
    say_if_busy(file, share, BUSY_LINE, dtype=dtype)
    described = backend.describe_device(device)
    write_entry(
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


BUSY_LINE = (
    "specdec: dtype {dtype} was chosen from timings taken while other work held {busy} of the "
    "cores, so it may not be this machine's fastest; it is measured again at a start that finds "
    "the machine quiet, or now by `specdec tune` on a quiet machine (dtype= pins one)"
)


def dtype_name(target, fallback: str) -> str:
    dtype = getattr(target, "dtype", None)
    return str(dtype).rpartition(".")[2] if dtype is not None else fallback
