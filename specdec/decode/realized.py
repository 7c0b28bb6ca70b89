"""What drafting has realized, per row count: the check that keeps "auto" from losing to plain.

``Speculation.choose`` predicts (acceptance times measured costs) which step is fastest. A
prediction can be wrong where it has not been tested: a fresh engine that meets a burst of
sixteen requests drafted on every step from its prior and its chain-shaped cost curve, and
halved the throughput of plain decoding (0.5x). So beside the prediction, the tokens per second
that steps actually delivered are kept per row count (``bucket``: 1, 2, 3-4, 5-8, 9-16 rows ...),
plain decode steps and drafting steps apart, as decaying sums of committed tokens and seconds
(target and drafting). In a bucket:

- at most ``PROBE`` drafting steps are taken on the prediction alone;
- then, until ``YARDSTICK`` plain decode steps there have been seen (the yardstick: one tells
  their rate, two their scatter), the bucket decodes plainly (one is enough where drafting
  clearly lost);
- after that, a bucket decodes plainly where its drafting steps delivered fewer tokens per second
  than its plain steps, beyond what their scatter explains: below ``LOSS`` times the plain
  steps' rate (a clear loss, told from a few steps whatever they accepted), or below the plain
  rate by more than ``CONFIDENCE`` standard errors of the two rates (each from the scatter of
  its steps' own tokens per second). A drafter whose steps vary with what they accept (one
  request's steps commit 1 to 5 tokens) is stopped only by a large loss; one whose steps all
  commit alike (a drafter that accepts nothing) is stopped by a small one: before, only the
  clear loss counted, and such a drafter, costing little, drafted in 70% of one request's steps
  at 0.93x of plain decoding, its prediction held just above plain by the engine's prior. A
  verdict wrong from noise is a near tie, so it costs little either way. The bucket then
  probes again after as many plain steps there as make the probe's lost time at most
  ``RETRY_COST`` of them (``retry_steps``: what ``PROBE`` drafting steps at the measured rates
  cost beyond plain decoding, in plain steps, over ``RETRY_COST``; at least ``MIN_RETRY``),
  twice as many after each probe that loses again (up to ``MAX_RETRY``), sized afresh after one
  that wins (acceptance changes with the requests, costs with the load). A fixed 64 steps was
  too long where a probe costs little and too short where it costs much: one request whose
  first three drafting steps accepted nothing (the start of an answer) then decoded up to 64
  steps plainly (the default path on the demo's first prompt drafted in 12 of 77 steps, 1.13
  tokens per step, against 1.42 where the probes were luckier), while at 16 rows, where a
  drafting step delivers 0.43x of a plain one, three probes cost 4.8 plain steps. A verdict
  also lapses, and the bucket probes again at once, when every request its drafting steps drew
  on has ended: it spoke of their acceptance as much as of the costs (one request whose first
  three steps at one row accepted nothing judged drafting lost there, and the next request,
  which accepts two tokens a step, decoded 36 of its 58 steps plainly; probed afresh, it
  drafted in all 30 of its steps at 2.06 tokens per step).

So a drafter that does not pay at some row count costs at most ``PROBE`` steps there (and
two plain steps to measure against) before plain decoding takes over, and then at most
``RETRY_COST`` of the steps (and ``PROBE`` for each set of requests that follows the
ones probed), whatever the drafter, the model or the arrival pattern. Steps that
carry prompt tokens are not counted (their time is the prompts'), nor a decoder's first plain
and first drafting step at each row count (one-off costs: a kernel's first run at a new row
count took four steps' time). Budgets never change which tokens are accepted, so this
only moves speed.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

__all__ = [
    "CONFIDENCE",
    "LOSS",
    "MAX_RETRY",
    "MIN_RETRY",
    "PROBE",
    "RETRY_COST",
    "RealizedRates",
    "YARDSTICK",
    "bucket",
]

PROBE = 3  # drafting steps a bucket takes on the prediction alone
LOSS = 0.8  # drafting that delivered less than this share of plain's tokens/s lost clearly
CONFIDENCE = 2.0  # ... or less than plain's by this many standard errors of the two rates
YARDSTICK = 2  # plain steps in a bucket before its drafting is weighed against them
RETRY_COST = 0.05  # a probe's lost time, over the plain steps before it, at most this share ...
MIN_RETRY = 8  # ... of at least this many plain steps ...
MAX_RETRY = 1024  # ... doubled after each probe that loses again, up to this
DECAY = 0.2  # weight of a bucket's newest step in its sums


def bucket(rows: int) -> int:
    """0 for 1 row, 1 for 2, 2 for 3-4, 3 for 5-8, ... (powers of two)."""
    return max(0, math.ceil(math.log2(max(int(rows), 1))))


class _Rate:
    """Decaying averages of committed tokens and seconds of one kind of step in one bucket, and
    of each step's own tokens per second and its square (their scatter)."""

    def __init__(self):
        self.tokens, self.seconds, self.count = 0.0, 0.0, 0
        self.mean, self.square = 0.0, 0.0  # of the steps' own tokens/s

    def observe(self, tokens: float, seconds: float) -> None:
        rate = tokens / seconds
        if self.count == 0:
            self.tokens, self.seconds = tokens, seconds
            self.mean, self.square = rate, rate * rate
        else:
            self.tokens += DECAY * (tokens - self.tokens)
            self.seconds += DECAY * (seconds - self.seconds)
            self.mean += DECAY * (rate - self.mean)
            self.square += DECAY * (rate * rate - self.square)
        self.count += 1

    @property
    def rate(self) -> float:
        return self.tokens / self.seconds if self.seconds > 0 else 0.0

    @property
    def variance(self) -> float:
        """The squared standard error of ``rate``: the steps' scatter over the steps the
        decaying average holds (``count``, at most (2 - DECAY) / DECAY), less one; infinite
        from a single step."""
        steps = min(float(self.count), (2.0 - DECAY) / DECAY)
        if steps <= 1.0:
            return math.inf
        return max(self.square - self.mean * self.mean, 0.0) / (steps - 1.0)


class RealizedRates:
    """Realized tokens/s per bucket of decode rows (module docstring)."""

    def __init__(self):
        self._plain: dict[int, _Rate] = {}
        self._draft: dict[int, _Rate] = {}
        self._lost: dict[int, int] = {}  # bucket -> plain steps since drafting was found to lose
        self._losses: dict[int, int] = {}  # bucket -> probes lost in a row (the doubling)
        self._seen: set[tuple[int, bool]] = set()  # (bucket, drafted) whose first step came
        self._probed: dict[int, set[int]] = {}  # bucket -> the requests its drafting steps drew on

    def restart(self) -> None:
        """A new decoder: its first plain and first drafting step at each row count are one-off
        costs again, and the requests the verdicts were measured on have ended."""
        self._seen = set()
        for requests in self._probed.values():
            requests.clear()

    def forget(self, request_id: int) -> None:
        """A request ended."""
        for requests in self._probed.values():
            requests.discard(request_id)

    def losing(self, b: int) -> bool:
        """Whether drafting has lost in bucket ``b`` (probed, and measured against): clearly
        (below ``LOSS``), or by more than the two rates' scatter explains."""
        plain, draft = self._plain.get(b), self._draft.get(b)
        if draft is None or draft.count < PROBE or plain is None:
            return False
        if draft.rate < LOSS * plain.rate:
            return True
        return draft.rate + CONFIDENCE * math.sqrt(draft.variance + plain.variance) < plain.rate

    def allows(self, rows: int) -> bool:
        """Whether a drafting step may be taken with ``rows`` decode rows."""
        b = bucket(rows)
        draft = self._draft.get(b)
        if draft is None or draft.count < PROBE:
            return True  # probing on the prediction
        if b not in self._plain:
            return False  # a plain step to measure against
        if not self.losing(b):
            if self._plain[b].count < YARDSTICK:
                return False  # one more plain step, for its scatter (a clear loss needs none)
            self._losses[b] = 0  # it wins (or loses too little to tell): probes start over
            return True
        # probe again from scratch after the retry's plain steps, or at once when every request
        # the verdict was measured on has ended: it spoke of their acceptance
        if self._lost.get(b, 0) >= self.retry_steps(b) or not self._probed.get(b, True):
            self._losses[b] = self._losses.get(b, 0) + 1
            self._draft[b], self._lost[b] = _Rate(), 0
            self._probed.pop(b, None)
            return True
        return False

    def retry_steps(self, b: int) -> int:
        """Plain steps in bucket ``b``, where drafting lost, before it probes again: ``PROBE``
        drafting steps at the measured rates cost (draft tokens / plain tokens) * (plain rate /
        draft rate - 1) plain steps each beyond plain decoding, and the steps between probes
        keep that within ``RETRY_COST`` of them (at least ``MIN_RETRY``), doubled for each probe
        lost in a row before (up to ``MAX_RETRY``)."""
        plain, draft = self._plain[b], self._draft[b]
        if draft.rate <= 0 or plain.tokens <= 0:
            return MAX_RETRY
        lost = PROBE * (draft.tokens / plain.tokens) * max(plain.rate / draft.rate - 1.0, 0.0)
        steps = max(math.ceil(lost / RETRY_COST), MIN_RETRY) * 2 ** self._losses.get(b, 0)
        return int(min(steps, MAX_RETRY))

    def observe(
        self,
        rows: int,
        tokens: int,
        seconds: float,
        drafted: bool,
        requests: Iterable[int] = (),
    ) -> None:
        """A decode step of ``rows`` rows committed ``tokens`` in ``seconds`` (its target part
        and its drafting); ``drafted``: some row drafted, those of ``requests`` (ids)."""
        if rows <= 0 or seconds <= 0:
            return
        b = bucket(rows)
        requests = set(requests)
        if drafted and requests:
            self._probed.setdefault(b, set()).update(requests)
        # one-off costs (allocation, a drafter's first call, a kernel's first run at a new row
        # count): left out. A batch's first drafting step at one row, when its other request
        # ended, took 205 ms where the next took 50-59, and judged drafting lost at one row
        # for the next 70 plain steps, the next requests' included
        if (b, drafted) not in self._seen:
            self._seen.add((b, drafted))
            return
        kinds = self._draft if drafted else self._plain
        kinds.setdefault(b, _Rate()).observe(float(tokens), float(seconds))
        if not drafted and self.losing(b):
            self._lost[b] = self._lost.get(b, 0) + 1

    def describe(self) -> dict:
        """{rows bucket: {"plain": tokens/s, "draft": tokens/s}} for metrics and logs."""
        out = {}
        for b in sorted(set(self._plain) | set(self._draft)):
            low, high = (1, 1) if b == 0 else (2 ** (b - 1) + 1, 2**b)
            name = str(low) if low == high else f"{low}-{high}"
            out[name] = {
                kind: round(rates[b].rate, 1)
                for kind, rates in (("plain", self._plain), ("draft", self._draft))
                if b in rates
            }
        return out
