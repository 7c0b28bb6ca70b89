"""Run a grid of methods x (backend, dtype) x temperatures over prompts: warm-up, interleaved
repeats."""

from __future__ import annotations

import sys
import time
from typing import Callable, Iterable, Sequence

import attrs
import numpy as np

import specdec
from specdec.progress import progress as progress_bar
from specdec.bench.methods import Method
from specdec.bench.peers import peer_runner
from specdec.bench.prompts import BenchPrompt
from specdec.bench.trust import Measured
from specdec.decode.plan import drafter_settings
from specdec.generation.api import stream
from specdec.generation.components import (
    add_lookup,
    load_drafter,
    lookup_by_default,
    planned_options,
)
from specdec.generation.encoding import encode_prompts
from specdec.generation.loading import ModelFolder
from specdec.generation.resolve import resolve
from specdec.plugins.registry import default_registry
from specdec.slots import TREE_ROOM


@attrs.frozen(kw_only=True)
class BenchRecord:
    """One generation of one prompt by one method. ``accepted``: drafted tokens accepted per step
    (after the prefill); tokens per step = new_tokens / (len(accepted) + 1), the bonus counted."""

    method: str
    backend: str
    dtype: str
    temperature: float
    prompt_id: str
    category: str
    repeat: int
    new_tokens: int
    seconds: float
    accepted: tuple = ()
    verified: int = 0
    drafted: int = (
        0  # tokens of the distinct beams (roots not counted), before deduplication into trees
    )
    plain_steps: int = (
        0  # decode steps that verified the root alone (a budget of 0, or nothing drafted)
    )
    # those steps by why they decoded plainly ({reason: steps}, specdec.decode.budget)
    plain_reasons: dict = attrs.field(factory=dict)
    time_draft: float = 0.0
    time_verify: float = 0.0
    time_other: float = 0.0
    time_prefill: float = 0.0
    # the generated ids, for greedy identity checks
    tokens: tuple = attrs.field(default=(), repr=False)
    peak_rss_mb: float = float("nan")  # the process's peak resident memory during this generation
    exact: str = ""  # the target's exact mode: "on", "off" ("" for peers)
    busy: bool = False  # other work took the cores while it ran (specdec.bench.trust)
    # the drafter's beam or tree sizes ("beam_width=2, beam_length=3, ..."), and whether a plan
    # set them; "" for plain decoding and peers
    settings: str = ""

    @property
    def steps(self) -> int:
        return len(self.accepted) + 1 if self.accepted or self.verified else 0


def specdec_runner(
    method: Method, model, target, backend: str, max_new_tokens: int
) -> Callable[..., dict]:
    """A callable(prompt ids, temperature, seed) -> dict of measurements, for a specdec method.
    The drafter is loaded once; only decoding is timed."""
    registry = default_registry()
    backend_obj = registry.get("backend", backend).factory()
    options = dict(method.generate_options)
    loop_options = {
        k: options.pop(k) for k in ("verifier", "tree_builder", "speculation") if k in options
    }
    lookup = options.pop("lookup", None)
    named = resolve("drafter", method.drafter, registry, backend_obj.name)
    # as generate: what specdec plan chose, where the method names nothing
    given = dict(options)
    options, planned = planned_options(backend_obj, target, named, options)
    drafter = load_drafter(named, target, backend_obj, registry, options)
    if lookup is None:
        lookup = lookup_by_default(named, drafter, loop_options.get("verifier"), planned)
    if lookup:
        drafter = add_lookup(drafter, lookup, backend_obj, target)
    beam_drafter = (
        method.kind in registry.names("drafter_spec")
        and registry.drafter_spec(method.kind).beam_options
    )

    def run(ids: list[int], temperature: float, seed: int) -> dict:
        # drafter is complete
        steps = stream(
            target,
            ids,
            drafter=drafter,
            backend=backend,
            max_new_tokens=max_new_tokens,
            temperature=temperature,
            seed=[seed],
            lookup=False,
            **loop_options,
        )
        accepted, verified, drafted, plain_steps, generated = [], 0, 0, 0, []
        reasons: dict = {}
        times = dict(time_draft=0.0, time_verify=0.0, time_other=0.0, time_prefill=0.0)
        start = time.perf_counter()
        for step in steps:
            generated.extend(int(t) for t in step.new_tokens[0])
            if step.is_prefill:
                times["time_prefill"] += step.time_prefill
                continue
            accepted.append(int(step.num_accepted[0]))
            verified += int(step.num_verified[0])
            plain_steps += int(step.num_verified[0]) == 1
            why = step.plain_reasons[0] if len(step.plain_reasons) else None
            if why is not None:
                reasons[why] = reasons.get(why, 0) + 1
            if beam_drafter:  # tokens of the beams before deduplication into the tree
                drafted += int(step.num_drafted[0])
            times["time_draft"] += step.time_draft
            times["time_verify"] += step.time_verify
            times["time_other"] += step.time_other
        seconds = time.perf_counter() - start
        return dict(
            new_tokens=len(generated),
            seconds=seconds,
            accepted=tuple(accepted),
            verified=verified,
            drafted=drafted,
            plain_steps=plain_steps,
            plain_reasons=reasons,
            tokens=tuple(generated),
            **times,
        )

    run.drafter = drafter  # what the method drafts with, for reports and tests
    # its sizes, and whether a plan kept by specdec plan set them (the same method line runs
    # other beams once a plan is kept)
    sizes = ", ".join(drafter_settings(drafter))
    run.settings = sizes + (" (chosen by `specdec plan` here)" if options != given else "")
    return run


def run_bench(
    model,
    prompts: Sequence[BenchPrompt],
    methods: Sequence[Method],
    *,
    grid: Iterable[tuple[str, str | None]] = (("numpy", None),),
    temperatures: Sequence[float] = (0.0,),
    max_new_tokens: int = 128,
    repeats: int = 3,
    warmup: int = 1,
    seed: int = 0,
    progress: bool = True,
) -> list[BenchRecord]:
    """Every method on every prompt, ``repeats`` times, interleaved (repeat > prompt > method),
    after ``warmup`` untimed runs of each method on the first prompt."""
    records: list[BenchRecord] = []
    grid = list(grid)
    total = len(grid) * len(temperatures) * repeats * len(prompts) * len(methods)
    # prompts first: the target's one slot is sized to the longest
    read = ModelFolder.of(model)
    folder = model if read is None else read.path
    if progress:  # before anything loads: the first run waits on loading and warm-up
        print(
            f"bench: {total} runs to do ({len(methods)} methods x {len(prompts)} prompts x "
            f"{repeats} repeats x {len(grid) * len(temperatures)} settings), after loading and "
            f"{warmup} warm-up run of each method (a first use here measures the machine once)",
            file=sys.stderr,
            flush=True,
        )
    bar = progress_bar(total=total, desc="bench", enabled=progress)
    tokenizer = read.tokenizer if read else getattr(folder, "tokenizer", None)
    template = read.chat_template if read else getattr(folder, "chat_template", None)
    encoded = [
        encode_prompts(p.prompt, tokenizer, 2**62, chat_template=template)[0][0] for p in prompts
    ]
    capacity = max(map(len, encoded)) + max_new_tokens + TREE_ROOM
    for backend, dtype in grid:
        target = specdec.load(folder, backend=backend, dtype=dtype, capacity=capacity)
        targets = {None: target}  # by a method's exact option; a second target only when one asks
        choice = getattr(target, "dtype_choice", None)
        dtype_label = str(dtype or (f"{choice.dtype} ({choice.source})" if choice else "default"))
        runners = {}
        for method in methods:
            if method.is_peer:
                if method.peer_backend != backend:
                    continue
                runners[method.label] = peer_runner(
                    method, model, target, dtype or _dtype_name(target), max_new_tokens
                )
            else:
                if method.exact not in targets:
                    targets[method.exact] = specdec.load(
                        folder,
                        backend=backend,
                        dtype=target_dtype(target, dtype),
                        capacity=capacity,
                        exact=method.exact,
                    )
                runners[method.label] = specdec_runner(
                    method, model, targets[method.exact], backend, max_new_tokens
                )
                runners[method.label].exact = (
                    "on" if getattr(targets[method.exact], "exact", False) else "off"
                )
        for temperature in temperatures:
            for label, run in runners.items():
                for _ in range(warmup):
                    run(encoded[0], temperature, seed)
            if not records:
                bar.reset()  # the time left paced from the timed runs, not the loading
            for repeat in range(repeats):
                for index, (prompt, ids) in enumerate(zip(prompts, encoded)):
                    for label, run in runners.items():
                        reset_peak_rss()
                        with Measured() as clock:  # this run's own: a burst spoils a few runs
                            measured = run(ids, temperature, seed + 1000 * repeat + index)
                        records.append(
                            BenchRecord(
                                method=label,
                                backend=backend,
                                dtype=dtype_label,
                                temperature=temperature,
                                prompt_id=prompt.id,
                                category=prompt.category,
                                repeat=repeat,
                                peak_rss_mb=peak_rss_mb(),
                                exact=getattr(run, "exact", ""),
                                settings=getattr(run, "settings", ""),
                                busy=not clock.quiet,
                                **measured,
                            )
                        )
                        bar.update(1)
    bar.close()
    return records


def target_dtype(target, asked: str | None) -> str | None:
    """The dtype a second target of this grid cell loads in: the first one's
    (no new measurement)."""
    return _dtype_name(target) or asked


def _dtype_name(target) -> str | None:
    dtype = getattr(target, "dtype", None)
    return None if dtype is None else str(dtype).rpartition(".")[2]


def reset_peak_rss() -> None:
    """Start a new peak of resident memory for this process (Linux: /proc/self/clear_refs)."""
    try:
        with open("/proc/self/clear_refs", "w") as handle:
            handle.write("5")
    except OSError:
        pass


def peak_rss_mb() -> float:
    """Peak resident memory of this process since the last reset, in MB (Linux), else nan."""
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return float("nan")


def median(values) -> float:
    values = list(values)
    return float(np.median(values)) if values else float("nan")
