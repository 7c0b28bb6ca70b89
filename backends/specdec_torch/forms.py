"""How the decoder layers' products are computed on a CPU: measured per row count, once per machine.

A layer's projection ``x @ W.T`` (x: the forward's T packed tokens) can run as ``F.linear(x, W)``
or as ``(W @ x.T).T``; the math library picks another kernel for each, and for the few rows a
decode step or a draft tree carries the difference is large where the weights stream from memory.
Measured on a 2-core AMD EPYC with AVX2 only (torch 2.13, float32, SmolLM2-135M's 30 layers of
q/k/v, o, gate/up and down, weights far larger than the caches): ``F.linear`` took 29.7 ms for one
row, 51.5 for two, 53.9 for four, 48.9 for eight; the transposed form 32.2, 20.5, 20.8 and 40.6
(one row doubled: 20.5), so a draft tree cost 1.5x a one-token forward where it could cost less
than it. Timing one weight alone misleads (it then sits in the cache: the same products took
0.34 ms against 0.21 for two rows, and 0.48 against 0.50 for eight), so the choice is made on
whole forwards of the loaded model: a chain of k tokens for each row class k in ``ROW_CLASSES``
(1, 2-3, 4-7, ... 64-127), each form interleaved, ``REPEATS`` times after a warm-up, the fastest
of each compared with ``specdec_torch.timing.MARGIN`` (the transposed form must win by 10%). Other
work only ever slows a forward, so the fastest of five says what a form costs where the median of
three did not: on a quiet machine the transposed form took 61-70 ms at 8 rows in three first uses
and 84.7 ms (median of three) in a fourth, which kept ``F.linear`` (82.6) there, and every tree of 8
to 15 nodes then cost 30% more than on the same machine the day before. It is cached
under ``<specdec cache>/tuning/`` per device, dtype and architecture (a few seconds for
SmolLM2-135M, once; again where other work shared the cores, as every measurement here).

Only forwards outside exact mode use it (exact mode runs the products its invariance check
checked, ``specdec_torch.exact``); forwards of more rows than the largest class (prompt chunks)
and other devices keep ``F.linear``; the LM head has its own choice (``specdec_torch.products``).
``SPECDEC_LAYER_PRODUCTS=linear`` turns the measurement off.
"""

from __future__ import annotations

import os
import time

import numpy as np
import torch
import torch.nn.functional as F

from specdec.tuning.dtype import SHAPE_FIELDS, chain_tree
from specdec.tuning.machine import Measured
from specdec.tuning.store import digest, read_entry, say_measuring, settled, tuning_dir, write_entry
from specdec_torch.device import describe_device
from specdec_torch.products import transposed_product
from specdec_torch.timing import MARGIN

__all__ = [
    "ROW_CLASSES",
    "choose_layer_forms",
    "describe_forms",
    "layer_product",
    "row_class",
    "transposed_linear",
]

ROW_CLASSES = (1, 2, 4, 8, 16, 32, 64)  # a class holds the row counts from it to the next, less 1
REPEATS = 5
PROMPT_TOKENS = 32
VARIABLE = "SPECDEC_LAYER_PRODUCTS"
VERSION = 2  # 2: the fastest of five rounds (was the median of three)


def row_class(rows: int) -> int | None:
    """The class of a product of ``rows`` rows: the largest of ``ROW_CLASSES`` not above it
    (None beyond the last class's range, or for no rows)."""
    if rows < 1 or rows >= 2 * ROW_CLASSES[-1]:
        return None
    return 1 << (int(rows).bit_length() - 1)


def transposed_linear(x: torch.Tensor, weight: torch.Tensor, bias=None) -> torch.Tensor:
    """``F.linear(x, weight, bias)`` computed as ``(weight @ x.T).T`` (``transposed_product``:
    a single row doubled) on x's rows made contiguous: fed a transposed view, the down projection
    took 3x as long here."""
    out = transposed_product(x.reshape(-1, x.shape[-1]).contiguous(), weight)
    if bias is not None:
        out = out + bias
    return out.reshape(*x.shape[:-1], weight.shape[0])


def layer_product(x: torch.Tensor, weight: torch.Tensor, bias, transposed: frozenset[int]):
    """``F.linear(x, weight, bias)`` in the form chosen for its row class (``transposed``: the
    classes that run ``transposed_linear``)."""
    if transposed and row_class(x.numel() // x.shape[-1]) in transposed:
        return transposed_linear(x, weight, bias)
    return F.linear(x, weight, bias)


def describe_forms(transposed: frozenset[int]) -> str:
    """``transposed`` (row classes) in words, e.g. "transposed for 1-7 rows, F.linear above"."""
    if not transposed:
        return "F.linear"
    spans, start, end = [], None, None
    for k in ROW_CLASSES:
        if k in transposed:
            start, end = (k if start is None else start), 2 * k - 1
        elif start is not None:
            spans.append((start, end))
            start = None
    if start is not None:
        spans.append((start, end))
    text = ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in spans)
    return f"transposed for {text} rows, F.linear for the rest"


def _cache_file(target):
    key = {
        "version": VERSION,
        "device": describe_device(str(target.device)),
        "dtype": str(target.dtype),
        "architecture": {field: getattr(target.config, field, None) for field in SHAPE_FIELDS},
        "classes": list(ROW_CLASSES),
    }
    return tuning_dir() / f"layer-forms-torch-{digest(key)}.json"


def _measure(backend, target) -> dict[int, dict[str, float]]:
    """The fastest milliseconds of a chain forward of each row class, in each form (interleaved
    rounds; other work only slows a round)."""
    vocab = int(target.vocab_size)
    prompt = ((np.arange(PROMPT_TOKENS, dtype=np.int64) * 7919 + 13) % vocab).tolist()
    trees = {k: chain_tree(backend, target, 1, k) for k in ROW_CLASSES}
    slot = np.array([0])
    forms = {"linear": frozenset(), "transposed": frozenset(ROW_CLASSES)}
    times = {k: {form: [] for form in forms} for k in ROW_CLASSES}
    target.admit(0, prompt)
    try:
        for round_ in range(REPEATS + 1):  # the first round warms up
            for k in ROW_CLASSES:
                order = list(forms) if (round_ + k) % 2 == 0 else list(forms)[::-1]
                for form in order:
                    target.transposed_rows = forms[form]
                    start = time.perf_counter()
                    backend.to_numpy(target.forward_tree(trees[k], slot).logits[:, -1:, :1])
                    if round_:
                        times[k][form].append(time.perf_counter() - start)
    finally:
        target.release(0)
        target.transposed_rows = frozenset()
    return {
        k: {form: round(1e3 * float(np.min(t)), 3) for form, t in by_form.items()}
        for k, by_form in times.items()
    }


def choose_layer_forms(backend, target) -> frozenset[int]:
    """The row classes whose layer products run transposed on this machine (measured once per
    device, dtype and architecture, then cached; module docstring). Empty off the CPU, under
    ``SPECDEC_LAYER_PRODUCTS=linear``, or when nothing is cached and the target has no free slot 0
    or too few positions (``PROMPT_TOKENS`` and the largest class) to measure in."""
    if target.device.type != "cpu" or os.environ.get(VARIABLE, "").strip() == "linear":
        return frozenset()
    file = _cache_file(target)
    cached = read_entry(file)
    busy = bool(cached) and not settled(cached, file)
    if cached and not busy:
        return frozenset(int(k) for k in cached.get("transposed", []))
    if bool(target.cache.admitted[0]) or int(target.capacity) < PROMPT_TOKENS + ROW_CLASSES[-1]:
        return frozenset()  # no room to measure in (a cached choice is read where there is one)
    dtype = str(target.dtype).removeprefix("torch.")  # the dtype choice loads one per dtype
    say_measuring(
        f"which form of the layers' products is fastest in {dtype}", again=cached if busy else None
    )
    clock = Measured()
    with clock, torch.inference_mode():
        timings = _measure(backend, target)
    chosen = sorted(k for k, t in timings.items() if t["transposed"] < MARGIN * t["linear"])
    share, measures = clock.free, 1
    if busy:  # measured again: the quieter of the two measurements decides
        measures = int(cached.get("measures", 1)) + 1
        if share < float(cached.get("share", 0.0)):
            chosen, timings = cached.get("transposed", []), cached.get("timings", {})
            share = float(cached["share"])
    write_entry(
        file,
        {
            "transposed": chosen,
            "timings": {str(k): t for k, t in timings.items()},
            "share": round(share, 3),
            "measures": measures,
            "measured_at": time.strftime("%Y-%m-%dT%H:%M:%S"),
        },
    )
    return frozenset(int(k) for k in chosen)
