"""What a step costs on this machine: the prices that the per-step choice of how much to draft
(``specdec.decode.budget``) and the prompt-chunk budget weigh.

**The forward's cost curve.** The seconds of one target forward as a function of the tokens it
carries (prompt chunks plus every tree row's nodes, padding included) are measured once per
machine: a chain of T tokens after a short prompt, T = 1, 2, 4, ... 512, the fastest of a few
interleaved repeats, made non-decreasing by pooling (``measure_curve``, ``increasing``). The
curve is cached under ``<specdec cache>/tuning/`` beside the dtype choice
(``specdec.tuning.dtype``), keyed by the backend and its device, the target's shape, dtype and
exact mode, so a later start reads it instead of measuring (several seconds for SmolLM2-135M on
a 2-core CPU, once).

**Corrected online.** A decode step costs more than its forward (verification, commit, the
loop's bookkeeping) and the machine's load changes, so ``StepCosts`` fits each step's seconds as
a + b * curve(tokens) (a fixed cost per step, the curve scaled) by least squares over the steps'
own timings, older steps weighing less; drafting is fitted the same way, a + b * (rows drafting). A
stale or missing measurement only costs speed, never correctness: budgets change which tokens are
verified, never which are accepted.
"""

from __future__ import annotations

import math
import time

import attrs
import numpy as np

from specdec.reference.tree import build_prefix_tree
from specdec.tuning.dtype import _digest, _read, _tuning_dir, _write
from specdec.types import DraftTree

__all__ = ["CostCurve", "StepCosts", "curve_for", "measure_curve", "step_costs"]

SIZES = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)  # tokens per forward measured
PROMPT_TOKENS = 64
REPEATS = 5
FORGET = 0.95  # per observation, the weight of the earlier ones in the online fits (a memory of ~20 steps)
PRIOR_WEIGHT = 1.0  # the starting point of a fit counts as this many observations
CACHE_VERSION = 2  # 2: the fastest of the repeats, fitted to a non-decreasing curve (1 took medians, a running max)


@attrs.frozen
class CostCurve:
    """Seconds of one forward of ``tokens[i]`` tokens: ``seconds[i]`` (measured, increasing T)."""

    tokens: tuple[int, ...]
    seconds: tuple[float, ...]

    def at(self, tokens) -> np.ndarray:
        """Seconds of forwards of ``tokens`` (array): piecewise linear between the measured sizes,
        continued beyond the largest with the last segment's slope."""
        t = np.asarray(tokens, dtype=np.float64)
        xs, ys = (
            np.asarray(self.tokens, dtype=np.float64),
            np.asarray(self.seconds, dtype=np.float64),
        )
        inside = np.interp(t, xs, ys)
        if len(xs) < 2:
            return inside
        slope = max((ys[-1] - ys[-2]) / (xs[-1] - xs[-2]), 0.0)
        return np.where(t > xs[-1], ys[-1] + slope * (t - xs[-1]), inside)

    def to_json(self) -> dict:
        return {"tokens": list(self.tokens), "seconds": list(self.seconds)}


class _Fit:
    """y ~ a + b * x, least squares over the observations with weights that decay by ``FORGET``
    per observation, pulled toward the slope b0 by a prior worth ``PRIOR_WEIGHT`` observations at
    x = ``x_ref`` (and weakly toward a0); a >= 0 and b >= 0 (more work never costs less)."""

    def __init__(self, a0: float, b0: float, x_ref: float):
        self.prior = (
            a0,
            b0,
            0.1 * PRIOR_WEIGHT,
            PRIOR_WEIGHT * x_ref * x_ref,
        )  # a weak pull on the fixed cost
        self.sums = np.zeros(5)  # weights, x, y, x^2, x*y
        self._solved: tuple[float, float] | None = None

    def observe(self, x: float, y: float) -> None:
        self.sums = FORGET * self.sums + np.array([1.0, x, y, x * x, x * y])
        self._solved = None

    def coefficients(self) -> tuple[float, float]:
        if self._solved is None:
            self._solved = self._solve()
        return self._solved

    def _solve(self) -> tuple[float, float]:
        a0, b0, pa, pb = self.prior
        w, sx, sy, sxx, sxy = self.sums
        matrix = np.array([[w + pa, sx], [sx, sxx + pb]])
        a, b = np.linalg.solve(matrix, np.array([sy + pa * a0, sxy + pb * b0]))
        if b < 0:  # the best line with b = 0
            a, b = (sy + pa * a0) / (w + pa), 0.0
        if a < 0:  # the best line through the origin
            a, b = 0.0, max((sxy + pb * b0) / (sxx + pb), 0.0)
        return float(a), float(b)

    def at(self, x) -> np.ndarray:
        a, b = self.coefficients()
        return a + b * np.asarray(x, dtype=np.float64)


class StepCosts:
    """Predicted seconds of a step's target part (forward, verification, commit, bookkeeping) and
    of its drafting. The target part is fitted online as a + b * curve(tokens): a fixed cost per
    step plus the measured curve scaled to the machine's load, starting from the curve itself
    (a = 0, b = 1); without a curve (None), as a + b * tokens from the steps alone. Drafting is
    fitted as a + b * (drafting rows), starting from free; its first step is left out, because a
    drafter's first call pays one-off costs (allocation, kernel choice) that would otherwise price
    drafting out for the steps it takes the fit to forget them."""

    def __init__(self, curve: CostCurve | None):
        self.curve = curve
        reference = float(curve.at(16)) if curve is not None else 16.0
        self._target = _Fit(0.0, 1.0 if curve is not None else 0.0, reference)
        self._draft = _Fit(0.0, 0.0, 1.0)
        self._drafted = False  # a drafting step seen (the first is left out)

    def _x(self, tokens) -> np.ndarray:
        tokens = np.asarray(tokens, dtype=np.float64)
        return self.curve.at(tokens) if self.curve is not None else tokens

    def target(self, tokens) -> np.ndarray:
        """Seconds of the target part of a step whose forward carries ``tokens`` (array)."""
        return self._target.at(self._x(tokens))

    def draft(self, rows) -> np.ndarray:
        """Seconds of drafting for ``rows`` (array) drafting requests (0 rows: 0 s)."""
        rows = np.asarray(rows, dtype=np.float64)
        return np.where(rows > 0, self._draft.at(rows), 0.0)

    def observe(
        self, tokens: int, seconds: float, drafting_rows: int, draft_seconds: float
    ) -> None:
        """A step ran: its forward carried ``tokens``; target part ``seconds``; drafting
        ``draft_seconds`` for ``drafting_rows`` requests."""
        if tokens > 0 and seconds > 0:
            self._target.observe(float(self._x(tokens)), seconds)
        if drafting_rows > 0:
            if self._drafted:
                self._draft.observe(float(drafting_rows), draft_seconds)
            self._drafted = True


# ------------------------------------------------------------------------------------------
# Measuring the curve once per machine


def _cache_file(backend, target):
    describe = getattr(backend, "describe_device", None)
    try:
        device = describe(getattr(target, "device", None)) if describe is not None else ""
    except Exception:  # noqa: BLE001 - a backend that cannot say: keyed by its name alone
        device = ""
    exactness = getattr(target, "exactness", None)
    key = {
        "version": CACHE_VERSION,
        "backend": backend.name,
        "device": device,
        "target": type(target).__name__,
        "dtype": str(getattr(target, "dtype", "")),
        "exact": bool(getattr(exactness, "on", False)),
        "shape": [
            int(getattr(target, name, 0) or 0)
            for name in ("vocab_size", "hidden_size", "num_layers")
        ],
        "sizes": list(SIZES),
    }
    return _tuning_dir() / f"costs-{backend.name}-{_digest(key)}.json"


def measure_curve(backend, target, slot: int = 0, *, repeats: int = REPEATS) -> CostCurve | None:
    """Time forwards of a chain of T tokens for each T in ``SIZES`` that fits, after a prompt
    admitted into the free ``slot`` (released after); None when the slot holds too few positions."""
    capacity, vocab = int(target.capacity), int(target.vocab_size)
    prompt_tokens = min(PROMPT_TOKENS, capacity // 4)
    sizes = [k for k in SIZES if prompt_tokens + k <= capacity]
    if prompt_tokens < 1 or not sizes:
        return None
    trees = {}
    for k in sizes:
        chain = build_prefix_tree(
            ((np.arange(k, dtype=np.int64) * 104729 + 1) % vocab).reshape(1, 1, k)
        )
        trees[k] = DraftTree(
            **{
                f.name: None
                if getattr(chain, f.name) is None
                else backend.from_numpy(np.asarray(getattr(chain, f.name)), target)
                for f in attrs.fields(DraftTree)
            }
        )
    where = np.array([slot])
    target.admit(slot, ((np.arange(prompt_tokens, dtype=np.int64) * 7919 + 13) % vocab).tolist())
    try:

        def once(k: int) -> float:
            start = time.perf_counter()
            backend.to_numpy(target.forward_tree(trees[k], where).logits[:, -1:, :1])
            return time.perf_counter() - start

        for k in sizes:  # warm-up: first calls allocate and pick kernels
            once(k)
        times = {k: [] for k in sizes}
        for _ in range(repeats):
            for k in sizes:
                times[k].append(once(k))
    finally:
        target.release(slot)
    seconds = increasing([min(times[k]) for k in sizes])
    return CostCurve(tokens=tuple(sizes), seconds=tuple(float(s) for s in seconds))


def increasing(values) -> np.ndarray:
    """The non-decreasing sequence closest to ``values`` in least squares (pool adjacent
    violators): more tokens never cost less. Each size is timed as its fastest repeat, because
    other work on the machine only ever adds time; a slow point left over is pooled with its
    neighbours instead of lifting every larger size, as a running maximum would."""
    blocks: list[list[float]] = []  # [mean, count]
    for value in values:
        blocks.append([float(value), 1.0])
        while len(blocks) > 1 and blocks[-2][0] > blocks[-1][0]:
            (mean, count), (last, n) = blocks[-2], blocks.pop()
            blocks[-1] = [(mean * count + last * n) / (count + n), count + n]
    return np.concatenate([np.full(int(count), mean) for mean, count in blocks])


def curve_for(backend, target, slot: int = 0) -> CostCurve | None:
    """The cached curve of this backend, device and target, else measured now (and cached);
    None when it cannot be measured (no positions, or the forward raised)."""
    file = _cache_file(backend, target)
    cached = _read(file)
    if cached and cached.get("tokens") and len(cached["tokens"]) == len(cached.get("seconds", ())):
        return CostCurve(
            tokens=tuple(int(t) for t in cached["tokens"]),
            seconds=tuple(float(s) for s in cached["seconds"]),
        )
    try:
        curve = measure_curve(backend, target, slot)
    except Exception:  # noqa: BLE001 - a speed choice: without a curve the costs are learned online
        return None
    if curve is not None and all(math.isfinite(s) for s in curve.seconds):
        _write(file, {**curve.to_json(), "measured_at": time.strftime("%Y-%m-%dT%H:%M:%S")})
    return curve


def step_costs(backend, target, free_slot: int | None) -> StepCosts:
    """The step costs of ``target``: its cached or measured curve (measured in ``free_slot``;
    None: no slot free, learned from the steps alone)."""
    return StepCosts(None if free_slot is None else curve_for(backend, target, free_slot))
