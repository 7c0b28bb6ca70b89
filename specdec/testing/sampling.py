"""Checks of sampled decoding for backends: uniforms that probe a verifier's decisions near their
boundaries, and chi-square tests of emitted tokens with their power.

``boundary_uniforms`` makes the uniforms of a verification step by running the float64
reference verifier and choosing each uniform as it is read: about half of them just inside or
just outside the decision they feed (an acceptance coin within ``near`` of its probability, a
draw within ``near`` of a boundary of the cumulative probabilities), never closer than
``margin``. A backend's verifier given the same inputs must then reach the reference's verdict:
no decision is a near-tie that float32 rounding could flip, yet a relative error of a few
percent in an acceptance probability or a cumulative sum flips many of them.

``conditional_chi_square`` tests tokens emitted by sampled verification: each emitted token,
given the tokens emitted before it in its row, must follow the target's conditional
distribution there (for every lossless verifier, however many drafted tokens were accepted).
``chi2_quantile`` and ``chi2_power`` give the test's threshold and its power against a chosen
deviation (non-centrality ``N * sum (p' - p)^2 / p``).
"""

from __future__ import annotations

import math
from statistics import NormalDist
from typing import Callable, Sequence

import numpy as np

from specdec.reference.sampling import sample_from
from specdec.reference.verify import make_verdict, num_beams, tree_depth
from specdec.types import Draft, DraftTree, SamplingConfig, TargetOutput

__all__ = [
    "ProbingChooser",
    "boundary_uniforms",
    "chi2_power",
    "chi2_quantile",
    "conditional_chi_square",
    "emitted_rows",
]


def chi2_quantile(df: int, alpha: float = 1e-3) -> float:
    """Upper ``alpha`` quantile of chi-square(df), Wilson-Hilferty (within 1% for df >= 3)."""
    z = NormalDist().inv_cdf(1.0 - alpha)
    c = 2.0 / (9.0 * df)
    return df * (1.0 - c + z * math.sqrt(c)) ** 3


def chi2_power(df: int, noncentrality: float, alpha: float = 1e-3) -> float:
    """P(statistic > chi2_quantile(df, alpha)) when the statistic is non-central chi-square(df,
    noncentrality): Patnaik's scaled chi-square, then Wilson-Hilferty."""
    scale = (df + 2.0 * noncentrality) / (df + noncentrality)
    h = (df + noncentrality) ** 2 / (df + 2.0 * noncentrality)
    x = chi2_quantile(df, alpha) / scale
    c = 2.0 / (9.0 * h)
    return 1.0 - NormalDist().cdf(((x / h) ** (1.0 / 3.0) - (1.0 - c)) / math.sqrt(c))


def emitted_rows(
    tree_tokens: np.ndarray, path: np.ndarray, num_accepted: np.ndarray, bonus: np.ndarray
) -> list[tuple[int, ...]]:
    """The tokens each row of a verdict emits: its accepted drafted tokens, then the bonus token.
    All host arrays: tree tokens (B, N), path (B, D+1), num_accepted (B,), bonus (B,)."""
    return [
        tuple(int(tree_tokens[b, u]) for u in path[b, 1 : int(num_accepted[b]) + 1])
        + (int(bonus[b]),)
        for b in range(len(bonus))
    ]


def conditional_chi_square(
    rows: Sequence[Sequence[int]],
    conditional: Callable[[tuple[int, ...]], np.ndarray],
    *,
    min_expected: float = 5.0,
) -> tuple[float, int]:
    """(statistic, degrees of freedom) of the emitted tokens of ``rows`` against
    ``conditional(prefix)``, the target's distribution (V,) after the tokens ``prefix``: token j
    of a row is a cell of the group of its prefix (the row's first j tokens). Within a group,
    cells expected to hold fewer than ``min_expected`` tokens are pooled (with the smallest other
    cell if the pool is still that small); a group contributes its cells less one."""
    counts: dict[tuple[int, ...], dict[int, int]] = {}
    for row in rows:
        for j, token in enumerate(row):
            group = counts.setdefault(tuple(int(t) for t in row[:j]), {})
            group[int(token)] = group.get(int(token), 0) + 1
    statistic, df = 0.0, 0
    for prefix, group in counts.items():
        total = sum(group.values())
        probs = np.asarray(conditional(prefix), dtype=np.float64)
        assert all(probs[token] > 0 for token in group), (
            f"after {prefix} a token the target gives no probability was emitted: {sorted(group)}"
        )
        order = sorted(np.flatnonzero(probs > 0), key=lambda t: -probs[t])
        cells = [[t] for t in order if total * probs[t] >= min_expected]
        rest = [t for t in order if total * probs[t] < min_expected]
        if rest:
            if cells and total * probs[rest].sum() < min_expected:
                cells[-1] += rest
            else:
                cells.append(rest)
        if len(cells) < 2:
            continue
        for cell in cells:
            expected = total * float(probs[cell].sum())
            observed = sum(group.get(int(t), 0) for t in cell)
            statistic += (observed - expected) ** 2 / expected
        df += len(cells) - 1
    return statistic, df


class ProbingChooser:
    """A chooser (``specdec.reference.verify.Chooser``) for one row that picks each uniform as the
    reference reads it and writes it into ``uniforms`` (D+1, W+1): with probability 1/4 just below
    the decision's boundary, 1/4 just above (within ``near`` of it, relative to the side's width),
    else anywhere; never within ``margin`` of a boundary. ``decisions`` counts what was chosen."""

    def __init__(
        self, uniforms: np.ndarray, rng: np.random.Generator, *, margin: float, near: float
    ):
        self.uniforms, self.rng, self.margin, self.near = uniforms, rng, margin, near
        self.decisions = 0

    def _pick(self, boundaries: list[float]) -> float:
        """A uniform in [0, 1) at least ``margin`` from every boundary, near one of them half the
        time."""
        margin, rng = self.margin, self.rng
        points = sorted({min(max(float(c), 0.0), 1.0) for c in boundaries})
        edges = sorted({0.0, *points, 1.0})
        kind = rng.random()
        if points and kind < 0.5:
            c = points[int(rng.integers(len(points)))]
            i = edges.index(c)
            sides = [
                (side, width)
                for side, width in (
                    (-1.0, c - edges[i - 1] if i else 0.0),
                    (1.0, edges[i + 1] - c if i + 1 < len(edges) else 0.0),
                )
                if width > 4.0 * margin
            ]
            if sides:
                side, width = sides[0] if kind < 0.25 or len(sides) == 1 else sides[1]
                reach = min(max(self.near * width, 2.0 * margin), width / 2.0)
                u = c + side * (margin + (reach - margin) * rng.random())
                if 0.0 <= u < 1.0 and all(abs(u - b) >= margin for b in points):
                    return float(u)
        while True:
            u = float(rng.random())
            if all(abs(u - b) >= margin for b in points):
                return u

    def categorical(self, probs: np.ndarray, depth: int) -> int:
        probs = np.asarray(probs, dtype=np.float64)
        cdf = np.cumsum(probs) / probs.sum()
        # u * total crosses cdf[k] there
        u = self._pick([float(c) for c in cdf[:-1] if 0.0 < c < 1.0])
        self.uniforms[depth, 0] = u
        self.decisions += 1
        return int(sample_from(probs, np.array(u)))

    def accept(self, probability: float, depth: int, beam: int) -> bool:
        # 1: accepted below it (a coin scaled down would flip there)
        u = self._pick([float(probability)])
        self.uniforms[depth, 1 + beam] = u
        self.decisions += 1
        return bool(u < probability)


def boundary_uniforms(
    verifier,
    tree: DraftTree,
    draft: Draft,
    logits: np.ndarray,
    sampling: SamplingConfig,
    *,
    rng: np.random.Generator,
    margin: float = 1e-4,
    near: float = 0.05,
) -> np.ndarray:
    """Uniforms (B, D+1, W+1) float64 for the reference ``verifier`` (a ``RowVerifier`` of
    ``specdec.reference.verify``) on these NumPy inputs, every one it reads chosen by a
    ``ProbingChooser``; those it does not read are uniform. The reference's verdict with them is
    the one the choosers took."""
    depth, width = tree_depth(tree), num_beams(draft)
    uniforms = rng.random((tree.batch_size, depth + 1, width + 1))
    target = TargetOutput(logits=logits, hidden=np.zeros(logits.shape[:2] + (1,)))
    paths, bonus = [], []
    for b in range(tree.batch_size):
        path, token = verifier.verify_row(
            tree,
            draft,
            target,
            sampling,
            b,
            ProbingChooser(uniforms[b], rng, margin=margin, near=near),
        )
        paths.append(path), bonus.append(token)
    expected = make_verdict(paths, bonus, depth)
    again = verifier.verify(tree, draft, target, sampling, uniforms)
    for field in ("path", "num_accepted", "bonus_tokens"):
        assert np.array_equal(getattr(again, field), getattr(expected, field)), (
            f"boundary_uniforms: the reference's {field} with the chosen uniforms is not what they "
            "were chosen for"
        )
    return uniforms
