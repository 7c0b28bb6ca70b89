"""What a step costs on this machine: the prices that the per-step choice of how much to draft
(``specdec.decode.budget``) and the prompt-chunk budget weigh.

**The forward's cost curve.** The seconds of one target forward as a function of the tokens it
carries (prompt chunks plus every tree row's nodes, padding included) and of the rows they sit in
are measured once per machine: a chain of T tokens in one row after a short prompt, T = 1, 2, 4,
... 512, then R = 2, 4, ... rows (up to the slots free) of one and of four tokens each; each
size the fastest of a few interleaved repeats, made non-decreasing by pooling
(``measure_curve``, ``increasing``). A forward of T tokens in R rows is priced as the chain of
T tokens plus what R rows cost beyond one row of the same tokens (``CostCurve.at``): each row
reads its own slot of the cache and attends on its own, so 16 rows of one token cost more than a
chain of 16 (on SmolLM2-135M on a 2-core CPU, 58 ms against 44), while the width a row adds
costs what the chain's tokens cost (within 2 ms over 1-16 rows of 1-16 tokens). The curve is
cached under ``<specdec cache>/tuning/`` beside the dtype choice
(``specdec.tuning.store``), keyed by the backend and its device, the target's shape, dtype and
exact mode, so a later start reads it instead of measuring (several seconds for SmolLM2-135M on
a 2-core CPU, once; again at a later start that finds the machine quiet where other work
shared the cores: ``curve_for``).

**Corrected online.** A decode step costs more than its forward (verification, commit, the
loop's bookkeeping) and the machine's load changes, so ``StepCosts`` prices a step as its plain
step (its rows decoded plainly), fitted as a + b * curve(tokens) (a fixed cost per step, the curve
scaled) by least squares over the plain steps' own timings, older steps weighing less, plus what
its trees add, fitted the same way against the curve's increment from the drafting steps'
seconds beyond their plain price; drafting is fitted as a + b * (rows drafting). One fit for both
misled the choice: trees cost more than the chain curve says (SmolLM2-135M here, 8 rows: a
32-node step added 2.1x the curve's increment to a plain step at 1.15x the curve), so a scale
learnt from drafting steps priced the plain step too dear (77-90 ms against 51-58 measured) and
drafting kept looking better than it was. Decode steps and steps carrying prompt tokens are
fitted apart (a chunk of several slots' prompts is priced as one row's chain). A stale or
missing measurement only costs speed, never correctness: budgets change which tokens are
verified, never which are accepted.
"""

from __future__ import annotations

import math
import time

import attrs
import numpy as np

from specdec.progress import progress
from specdec.tuning.dtype import chain_tree
from specdec.tuning.machine import Measured
from specdec.tuning.store import (
    digest,
    read_entry,
    say_if_busy,
    say_measuring,
    settled,
    tuning_dir,
    write_entry,
)

__all__ = ["CostCurve", "StepCosts", "curve_for", "measure_curve", "plain_share", "step_costs"]

SIZES = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)  # tokens per forward measured
ROWS = (2, 4, 8, 16, 32, 64)  # rows per forward measured (those that fit the free slots)
ROW_WIDTHS = (1, 4)  # tokens per row of the rows measured
PROMPT_TOKENS = 64
ROW_PROMPT_TOKENS = 32  # the prompt in each further row's slot
REPEATS = 5
# per observation, the weight of the earlier ones in the online fits (a memory of ~20 steps)
FORGET = 0.95
PRIOR_WEIGHT = 1.0  # the starting point of a fit counts as this many observations
# 4: keyed by the target's product forms too; 3: rows measured beside the chain; 2: the fastest
# of the repeats, pooled into a non-decreasing curve (1 took medians, a running max)
CACHE_VERSION = 4


def _piecewise(x, xs, ys) -> np.ndarray:
    """``ys`` at ``x`` (array): piecewise linear between the points ``xs`` (increasing),
    continued beyond the last with the last segment's slope (never decreasing)."""
    x = np.asarray(x, dtype=np.float64)
    xs, ys = np.asarray(xs, dtype=np.float64), np.asarray(ys, dtype=np.float64)
    inside = np.interp(x, xs, ys)
    if len(xs) < 2:
        return inside
    slope = max((ys[-1] - ys[-2]) / (xs[-1] - xs[-2]), 0.0)
    return np.where(x > xs[-1], ys[-1] + slope * (x - xs[-1]), inside)


@attrs.frozen
class CostCurve:
    """Seconds of one forward of ``tokens[i]`` tokens in one row: ``seconds[i]`` (measured,
    increasing T); and what a forward of ``rows[j]`` rows costs beyond one row carrying the same
    tokens: ``row_seconds[j]`` (``rows`` starts at 1, whose extra is 0; measured, increasing R).
    Without rows measured, every forward is priced as its chain."""

    tokens: tuple[int, ...]
    seconds: tuple[float, ...]
    rows: tuple[int, ...] = (1,)
    row_seconds: tuple[float, ...] = (0.0,)

    def at(self, tokens, rows=1) -> np.ndarray:
        """Seconds of forwards of ``tokens`` in ``rows`` rows (arrays that broadcast): the chain of
        the tokens plus the rows' extra, each piecewise linear between the measured sizes and
        continued beyond the largest with its last segment's slope."""
        rows = np.maximum(np.asarray(rows, dtype=np.float64), 1.0)
        return _piecewise(tokens, self.tokens, self.seconds) + _piecewise(
            rows, self.rows, self.row_seconds
        )

    def to_json(self) -> dict:
        return {
            "tokens": list(self.tokens),
            "seconds": list(self.seconds),
            "rows": list(self.rows),
            "row_seconds": list(self.row_seconds),
        }

    @classmethod
    def from_json(cls, value: dict) -> "CostCurve | None":
        """The curve a cache file holds, or None when it is not a whole one."""
        try:
            curve = cls(
                tokens=tuple(int(t) for t in value["tokens"]),
                seconds=tuple(float(s) for s in value["seconds"]),
                rows=tuple(int(r) for r in value["rows"]),
                row_seconds=tuple(float(s) for s in value["row_seconds"]),
            )
        except (KeyError, TypeError, ValueError):
            return None
        whole = (
            curve.tokens
            and len(curve.tokens) == len(curve.seconds)
            and curve.rows[:1] == (1,)
            and len(curve.rows) == len(curve.row_seconds)
        )
        finite = all(math.isfinite(s) for s in curve.seconds + curve.row_seconds)
        return curve if whole and finite else None


class _Fit:
    """y ~ a + b * x, least squares over the observations with weights that decay by ``FORGET``
    per observation, pulled toward the slope b0 by a prior worth ``PRIOR_WEIGHT`` observations at
    x = ``x_ref`` (and weakly toward a0); a >= 0 and b >= 0 (more work never costs less).

    The line is trusted only as far as its observations reach (``seen``: the largest x observed,
    shrinking by ``FORGET`` per observation as the fit forgets it); beyond, it rises at least at
    the prior's slope b0. Observations bunched at small x tell the fixed cost, not the slope:
    a 1.5B model's drafting steps at one row, where a tree's few tokens cost what one token does
    and the plain step's price was still settling, fitted what trees add at b = 0.01 of the
    curve, and the first drafting step at 16 rows, a 400-token forward, was priced 0.27 s and
    took 3.3 s (the curve said 3.0): fifteen plain steps lost in one step of a burst.

    Where the steps lie below the prior's line through the origin (a plain step faster than the
    curve says), the best line has a = 0, and then its level at the steps and its slope are one
    number: the steps measure it, so the prior pulls the slope only as weakly as it pulls a.
    Pulled at full weight, it held a 1.5B model's plain step at 4 rows at 0.206 s after three
    steps of 0.185 s, and drafting steps that only broke even looked 10% better than plain."""

    def __init__(self, a0: float, b0: float, x_ref: float):
        self.prior = (
            a0,
            b0,
            0.1 * PRIOR_WEIGHT,  # a weak pull on the fixed cost
            PRIOR_WEIGHT * x_ref * x_ref,
        )
        self.sums = np.zeros(6)  # weights, x, y, x^2, x*y, y^2
        self.seen = 0.0  # the largest x observed, forgotten as the sums are
        self._solved: tuple[float, float] | None = None

    @property
    def weight(self) -> float:
        """The observations' total weight (about 20 once the memory is full)."""
        return float(self.sums[0])

    def observe(self, x: float, y: float) -> None:
        self.sums = FORGET * self.sums + np.array([1.0, x, y, x * x, x * y, y * y])
        self.seen = max(float(x), FORGET * self.seen)
        self._solved = None

    def lean_on(self, a0: float) -> None:
        """Take ``a0`` as the fixed cost that the prior pulls toward (a related fit's)."""
        self.prior = (float(a0), *self.prior[1:])
        self._solved = None

    def coefficients(self) -> tuple[float, float]:
        if self._solved is None:
            self._solved = self._solve()
        return self._solved

    def _solve(self) -> tuple[float, float]:
        a0, b0, pa, pb = self.prior
        w, sx, sy, sxx, sxy, _ = self.sums
        matrix = np.array([[w + pa, sx], [sx, sxx + pb]])
        a, b = np.linalg.solve(matrix, np.array([sy + pa * a0, sxy + pb * b0]))
        if b < 0:  # the best line with b = 0
            a, b = (sy + pa * a0) / (w + pa), 0.0
        if a < 0:  # the best line through the origin, the slope pulled as weakly as a is
            weak = pb * pa / PRIOR_WEIGHT
            a, b = 0.0, max((sxy + weak * b0) / (sxx + weak), 0.0)
        return float(a), float(b)

    def at(self, x) -> np.ndarray:
        """The line up to ``seen``, and beyond it at least the prior's slope (class docstring)."""
        a, b = self.coefficients()
        x = np.asarray(x, dtype=np.float64)
        beyond = np.maximum(x - self.seen, 0.0)
        return a + b * (x - beyond) + max(b, self.prior[1]) * beyond

    def scatter(self) -> float:
        """The standard error of the fit's predictions, in y's units: the observations' scatter
        about the line over the root of their weight (0 before two)."""
        w, sx, sy, sxx, sxy, syy = self.sums
        if w < 2:
            return 0.0
        a, b = self.coefficients()
        residual = syy - 2 * a * sy - 2 * b * sxy + a * a * w + 2 * a * b * sx + b * b * sxx
        return float(np.sqrt(max(residual, 0.0) / w) / np.sqrt(w))

    @property
    def mean(self) -> float:
        """The observations' weighted mean y (0 before two)."""
        w, sy = self.sums[0], self.sums[2]
        return float(sy / w) if w >= 2 and sy > 0 else 0.0

    def error(self) -> float:
        """``scatter`` relative to the mean observation (0 before two)."""
        mean = self.mean
        return self.scatter() / mean if mean > 0 else 0.0


def plain_share(tokens: int, plain_tokens: int | None) -> int:
    """The tokens of a step's forward (``tokens``) that it would carry were its rows decoded
    plainly: ``plain_tokens`` (None: all); the step was plain when this equals ``tokens``."""
    return tokens if plain_tokens is None else min(plain_tokens, tokens)


class StepCosts:
    """Predicted seconds of a step's target part (forward, verification, commit, bookkeeping) and
    of its drafting. A step's target part is priced as its plain step, what its forward would
    carry were every row decoded plainly (prompt chunks and one token a row), plus what its trees
    add. The plain step is fitted online as a + b * curve(plain tokens) from the plain steps (a
    fixed cost per step, the curve scaled; decode steps and steps carrying prompt tokens apart),
    starting from the curve itself (a = 0, b = 1); what trees add, as d + e * (curve(tokens) -
    curve(plain tokens)) from the drafting steps' seconds beyond their plain step's price,
    starting from the curve's increment (d = 0, e = 1); without a curve (None), both from the
    steps alone on the token counts. Each fit learns only from its
    own steps, so a run of drafting steps never reprices the plain step (a scale learnt from both
    at once did: trees cost more than the chain curve says, and the plain step it priced from the
    drafting steps came out too dear, so drafting kept looking better than it was). Drafting is
    fitted as a + b * (drafting rows), starting from free. The loop's fixed cost is the same
    in both plain fits, so each starts from (and is weakly pulled toward) the other's: under a
    queue every step carries prompt tokens, and the decode fit, which sizes the prompt chunks,
    would otherwise price a decode step at the bare curve until the queue emptied (through a
    whole 26-client run of plain decoding on SmolLM2-135M here, 13 ms a step too cheap, so the
    chunks were held to a limit 26 ms tighter than meant). The first step and the first drafting
    call are left out: they pay one-off costs (allocation, kernel choice) that would otherwise
    price the step (4.4x the curve, seen) or drafting out until the fit forgets them; so are the
    first drafting step and drafting call at each further row count (a batch of two whose other
    request ended drafted its first step at one row in 205 ms, the next in 50: fitted, it priced
    trees out at one row for the requests that followed)."""

    def __init__(self, curve: CostCurve | None):
        self.curve = curve
        reference = float(curve.at(16)) if curve is not None else 16.0
        growth = float(curve.at(16) - curve.at(1)) if curve is not None else 15.0
        slope = 1.0 if curve is not None else 0.0
        self._target = _Fit(0.0, slope, reference)  # plain decode steps: a token a row
        self._chunks = _Fit(0.0, slope, reference)  # plain steps that carry prompt tokens
        self._trees = _Fit(0.0, slope, max(growth, 1e-6))
        self._draft = _Fit(0.0, 0.0, 1.0)
        self._stepped = False  # a step seen (the first is left out: one-off costs)
        self._tree_rows: set[int] = set()  # row counts a drafting step was seen at
        self._draft_rows: set[int] = set()  # drafting-row counts drafting was seen at

    def _x(self, tokens, rows=1) -> np.ndarray:
        tokens = np.asarray(tokens, dtype=np.float64)
        return self.curve.at(tokens, rows) if self.curve is not None else tokens

    def target(self, tokens, rows=1, plain=None) -> np.ndarray:
        """Seconds of the target part of a step whose forward carries ``tokens`` in ``rows``
        rows, ``plain`` (None: ``tokens``) were its rows decoded plainly (arrays that broadcast)."""
        x = self._x(tokens, rows)
        plain = tokens if plain is None else plain
        base = self._x(plain, rows)
        added = x - base
        return self._plain(base, plain, rows) + np.where(added > 0, self._trees.at(added), 0.0)

    def _plain(self, x, plain, rows) -> np.ndarray:
        """The plain step's price at curve value ``x``: a step of a token a row is priced from
        such steps, one that carries prompt tokens from those (a prompt chunk and a decode row
        stand apart from the curve differently: a chunk of several slots' prompts is priced as
        one row's chain)."""
        return np.where(
            np.asarray(plain) <= np.asarray(rows), self._target.at(x), self._chunks.at(x)
        )

    def error(self) -> float:
        """The relative standard error of ``target``'s predictions: both fits' scatter over the
        plain step's mean seconds."""
        mean = self._target.mean
        scatter = np.hypot(self._target.scatter(), self._trees.scatter())
        return float(scatter / mean) if mean > 0 else 0.0

    def draft(self, rows) -> np.ndarray:
        """Seconds of drafting for ``rows`` (array) drafting requests (0 rows: 0 s)."""
        rows = np.asarray(rows, dtype=np.float64)
        return np.where(rows > 0, self._draft.at(rows), 0.0)

    def observe(
        self,
        tokens: int,
        seconds: float,
        drafting_rows: int,
        draft_seconds: float,
        rows: int = 1,
        plain_tokens: int | None = None,
    ) -> None:
        """A step ran: its forward carried ``tokens`` in ``rows`` rows (``plain_tokens`` were it
        decoded plainly; None: ``tokens``); target part ``seconds``; drafting ``draft_seconds``
        for ``drafting_rows`` requests."""
        first, self._stepped = not self._stepped, True
        plain = plain_share(tokens, plain_tokens)
        if plain != tokens:  # the first drafting step at each row count: one-off costs
            first = first or rows not in self._tree_rows
            self._tree_rows.add(rows)
        if tokens > 0 and seconds > 0 and not first:
            x = float(self._x(tokens, rows))
            if plain == tokens:
                decode = plain <= rows
                fit, other = (
                    (self._target, self._chunks) if decode else (self._chunks, self._target)
                )
                fit.observe(x, seconds)
                other.lean_on(fit.coefficients()[0])
            else:
                base = float(self._x(plain, rows))
                self._trees.observe(x - base, seconds - float(self._plain(base, plain, rows)))
        if drafting_rows > 0:
            if drafting_rows in self._draft_rows:
                self._draft.observe(float(drafting_rows), draft_seconds)
            self._draft_rows.add(drafting_rows)


# ------------------------------------------------------------------------------------------
# Measuring the curve once per machine


def _cache_file(backend, target, free_slots: int):
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
        "forms": str(getattr(target, "product_forms", "")),  # the backend's kernel forms
        "shape": [
            int(getattr(target, name, 0) or 0)
            for name in ("vocab_size", "hidden_size", "num_layers")
        ],
        "sizes": list(SIZES),
        "rows": [r for r in ROWS if r <= free_slots],
        "row_widths": list(ROW_WIDTHS),
    }
    return tuning_dir() / f"costs-{backend.name}-{digest(key)}.json"


def measure_curve(backend, target, slots=(0,), *, repeats: int = REPEATS) -> CostCurve | None:
    """Time forwards of a chain of T tokens for each T in ``SIZES`` that fits, after a prompt
    admitted into the first of the free ``slots``, and of R rows of ``ROW_WIDTHS`` tokens for each
    R in ``ROWS`` that the free slots hold (each row after a shorter prompt); the slots are
    released after. None when the first slot holds too few positions."""
    slots = [int(s) for s in slots]
    capacity, vocab = int(target.capacity), int(target.vocab_size)
    prompt_tokens = min(PROMPT_TOKENS, capacity // 4)
    sizes = [k for k in SIZES if prompt_tokens + k <= capacity]
    if not slots or prompt_tokens < 1 or not sizes:
        return None
    row_prompt = min(ROW_PROMPT_TOKENS, prompt_tokens)
    row_counts = [r for r in ROWS if r <= len(slots)]
    shapes = [(1, k) for k in sizes] + [
        (r, w) for r in row_counts for w in ROW_WIDTHS if r * w in sizes
    ]
    trees = {shape: chain_tree(backend, target, *shape) for shape in shapes}
    admitted = []
    try:
        for i, slot in enumerate(slots[: max(row_counts, default=1)]):
            length = prompt_tokens if i == 0 else row_prompt
            target.admit(
                slot, ((np.arange(length, dtype=np.int64) * 7919 + 13 + i) % vocab).tolist()
            )
            admitted.append(slot)

        def once(shape: tuple[int, int]) -> float:
            where = np.asarray(slots[: shape[0]])
            start = time.perf_counter()
            backend.to_numpy(target.forward_tree(trees[shape], where).logits[:, -1:, :1])
            return time.perf_counter() - start

        # a line a minute where it outlasts one (minutes beside other work, with no word before)
        rounds = progress(
            range(repeats + 1), desc="specdec: measuring step costs", unit="round", bar=False
        )
        times = {shape: [] for shape in shapes}
        for repeat in rounds:
            for shape in shapes:  # round 0 warms up: first calls allocate and pick kernels
                seconds = once(shape)
                if repeat:
                    times[shape].append(seconds)
    finally:
        for slot in admitted:
            target.release(slot)
    seconds = increasing([min(times[(1, k)]) for k in sizes])
    chain = dict(zip(sizes, seconds))
    extra = [  # what R rows cost beyond one row of the same tokens, the median over widths
        float(np.median([min(times[(r, w)]) - chain[r * w] for w in ROW_WIDTHS if (r, w) in times]))
        for r in row_counts
    ]
    return CostCurve(
        tokens=tuple(sizes),
        seconds=tuple(float(s) for s in seconds),
        rows=(1, *row_counts),
        row_seconds=tuple(float(s) for s in np.maximum(increasing([0.0, *extra]), 0.0)),
    )


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


def curve_for(backend, target, slots=(0,)) -> CostCurve | None:
    """The cached curve of this backend, device and target (and rows as many as ``slots``), else
    measured now in the free ``slots`` (and cached); None when it cannot be measured (no
    positions, or the forward raised).

    A measurement taken while other work shared the cores (``specdec.tuning.store.settled``: a
    first start beside a build, say) has the wrong shape, not only the wrong scale, which the
    online fits correct: it is measured again at a later start that finds the machine quiet, and
    the curve measured with the larger share of the cores is kept."""
    file = _cache_file(backend, target, len(slots))
    cached = read_entry(file) or {}
    curve = CostCurve.from_json(cached) if cached else None
    if curve is not None and settled(cached, file):
        say_if_busy(file, float(cached.get("share", 1.0)), BUSY_LINE)
        return curve
    share, measures = float(cached.get("share", 1.0)), int(cached.get("measures", 1))
    rows = f" with up to {len(slots)} requests at once" if len(slots) > 1 else ""
    # what the key holds besides the model: two targets of one model (another dtype, exact mode
    # on and off) each measure, and read as one measurement said twice without it
    dtype = getattr(target, "dtype", None)
    form = [str(dtype).rpartition(".")[2]] if dtype is not None else []
    form += ["exact mode"] if getattr(getattr(target, "exactness", None), "on", False) else []
    form_text = f" ({', '.join(form)})" if form else ""
    say_measuring(  # once per slot count a target is loaded with: the rows change the costs
        f"what a step of {getattr(target, 'name', None) or 'this model'}{form_text} costs{rows}",
        again=cached if curve is not None else None,
    )
    try:
        with Measured() as clock:
            measured = measure_curve(backend, target, slots)
    except Exception:  # noqa: BLE001 - a speed choice: without a curve the costs are learned online
        return curve
    if measured is None or CostCurve.from_json(measured.to_json()) is None:
        return curve
    new_share = clock.free
    if curve is None or new_share > share:
        curve, share = measured, new_share
    say_if_busy(file, share, BUSY_LINE)
    write_entry(
        file,
        {
            **curve.to_json(),
            "share": round(share, 3),
            "measures": measures + 1 if cached else 1,
            "measured_at": time.strftime("%Y-%m-%dT%H:%M:%S"),
        },
    )
    return curve


BUSY_LINE = (
    "specdec: the step costs speculation='auto' prices drafting with were measured while other "
    "work held {busy} of the cores, so auto may draft in fewer steps than this machine pays for; "
    "they are measured again at a start that finds the machine quiet (speculation='always' "
    "drafts every step meanwhile)"
)


def step_costs(backend, target, free_slots) -> StepCosts:
    """The step costs of ``target``: its cached or measured curve (measured in ``free_slots``, a
    sequence; empty: no slot free, learned from the steps alone)."""
    return StepCosts(curve_for(backend, target, tuple(free_slots)) if len(free_slots) else None)
