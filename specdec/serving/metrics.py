"""An engine's metrics: its counters and histograms (``EngineMetrics``, updated by the scheduler
thread, read with ``snapshot``), and their rendering in the Prometheus text exposition format
(version 0.0.4, ``render``).

Counters end in ``_total``; histograms have ``_bucket{le=...}``, ``_sum`` and ``_count``. Every
name starts with ``specdec_``. Written out here so that the core needs no Prometheus client.
"""

from __future__ import annotations

import math
import threading
from typing import Sequence

import numpy as np

from specdec.decode.requests import FINISH_REASONS

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

HISTOGRAM_HELP = {
    "time_to_first_token_seconds": (
        "Time from submission to a request's first token (queueing and prefill included)."
    ),
    "inter_token_latency_seconds": "Time per output token after the first: the gap between a "
    "request's deliveries divided by the tokens delivered (observed once per token).",
    "request_latency_seconds": "Time from submission to the end of a request (any finish reason).",
    "queue_time_seconds": "Time from submission until the prompt's prefill ended (its last chunk).",
    "step_seconds": (
        "Duration of one scheduler step (admissions and one decode step of every running request)."
    ),
    "tokens_per_step": (
        "Tokens a running request gets from one decode step (accepted drafted tokens plus the "
        "bonus)."
    ),
    "draft_nodes_per_row_step": "Drafted tree nodes a running request verified in one decode step "
    "(its tree budget as used; 0: decoded plainly).",
}


class Histogram:
    """Counts of observations per upper bound (cumulative on read), their sum and count."""

    def __init__(self, buckets: Sequence[float]):
        self.buckets = tuple(sorted(float(b) for b in buckets))
        self.counts = [0] * (len(self.buckets) + 1)  # the last: above every bound
        self.sum = 0.0
        self.count = 0

    def observe(self, value: float, times: int = 1) -> None:
        index = next(
            (i for i, bound in enumerate(self.buckets) if value <= bound), len(self.buckets)
        )
        self.counts[index] += times
        self.sum += value * times
        self.count += times

    def cumulative(self) -> list[tuple[float, int]]:
        """(upper bound, observations <= it) for every bound and +Inf."""
        total, out = 0, []
        for bound, count in zip(self.buckets + (math.inf,), self.counts):
            total += count
            out.append((bound, total))
        return out


LATENCY_BUCKETS = (
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.075,
    0.1,
    0.15,
    0.2,
    0.3,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    10.0,
    20.0,
    40.0,
    80.0,
)


class EngineMetrics:
    """Counters and histograms of an engine, updated by its scheduler thread; read with
    ``snapshot``."""

    COUNTERS = {
        "requests_submitted": "requests accepted by submit",
        "requests_rejected": "requests refused because the queue was full",
        "prompt_tokens": "prompt tokens admitted",
        "generation_tokens": "tokens emitted",
        "prefilled_prompts": "prompts whose prefill finished (their last chunk ran)",
        "decode_steps": (
            "steps that decoded (one target forward each, with the prompt chunks of that step)"
        ),
        "decode_row_steps": "request rows in decode steps",
        "decode_tokens": "tokens emitted by decode steps (bonus tokens counted)",
        "draft_tokens": "drafted tokens verified (distinct beams)",
        "accepted_tokens": "drafted tokens accepted",
        "draft_nodes": (
            "drafted tree nodes verified (past the root, after each request's budget cut its tree)"
        ),
        "drafting_row_steps": "request rows in decode steps that drafted (a tree budget above 0)",
        "plain_steps": "decode steps in which no request drafted",
        "engine_resets": "steps that raised for no request in particular (every slot freed)",
    }

    def __init__(self):
        self.lock = threading.Lock()
        self.counters = dict.fromkeys(self.COUNTERS, 0)
        self.finished = dict.fromkeys(FINISH_REASONS, 0)
        self.histograms = {
            "time_to_first_token_seconds": Histogram(LATENCY_BUCKETS),
            "inter_token_latency_seconds": Histogram(LATENCY_BUCKETS),
            "request_latency_seconds": Histogram(LATENCY_BUCKETS),
            "queue_time_seconds": Histogram(LATENCY_BUCKETS),
            "step_seconds": Histogram(LATENCY_BUCKETS),
            "tokens_per_step": Histogram(tuple(range(1, 17))),
            "draft_nodes_per_row_step": Histogram((0, 1, 2, 4, 8, 16, 32, 64)),
        }
        self.prefill_budget = 0  # prompt tokens the last step could carry

    def account_step(self, result, prefill_budget) -> None:
        """Count a decode step: its rows, drafts, acceptance and the budgets chosen."""
        # drafted nodes each row verified
        nodes = np.asarray(result.num_verified, dtype=np.int64) - 1
        with self.lock:
            counters = self.counters
            counters["decode_steps"] += 1
            counters["decode_row_steps"] += len(result.requests)
            counters["draft_tokens"] += int(result.num_drafted.sum())
            counters["accepted_tokens"] += int(result.num_accepted.sum())
            counters["draft_nodes"] += int(nodes.sum())
            counters["drafting_row_steps"] += int(np.count_nonzero(nodes))
            counters["plain_steps"] += int(not nodes.any())
            for count in nodes.tolist():
                self.histograms["draft_nodes_per_row_step"].observe(count)
            self.prefill_budget = prefill_budget if isinstance(prefill_budget, int) else 0

    def add(self, name: str, value: int = 1) -> None:
        with self.lock:
            self.counters[name] += value

    def observe(self, name: str, value: float, times: int = 1) -> None:
        with self.lock:
            self.histograms[name].observe(value, times)

    def snapshot(self) -> dict:
        """{"counters", "finished" (per finish reason), "prefill_budget", "histograms": {name:
        (cumulative buckets, sum, count)}}."""
        with self.lock:
            return {
                "counters": dict(self.counters),
                "finished": dict(self.finished),
                "prefill_budget": self.prefill_budget,
                "histograms": {
                    name: (h.cumulative(), h.sum, h.count) for name, h in self.histograms.items()
                },
            }


def _number(value) -> str:
    if isinstance(value, float):
        if math.isinf(value):
            return "+Inf" if value > 0 else "-Inf"
        return repr(value)
    return f"{value}.0" if isinstance(value, int) else str(value)


def render(engine, *, model_name: str) -> str:
    """The exposition text of ``engine`` (a ``specdec.Engine``)."""
    snap = engine.metrics.snapshot()
    stats = engine.stats()
    counters = snap["counters"]
    label = f'model_name="{_escape(model_name)}"'
    lines: list[str] = []

    def metric(name: str, kind: str, help_text: str, samples: list[tuple[str, str, object]]):
        lines.append(f"# HELP {name} {help_text}")
        lines.append(f"# TYPE {name} {kind}")
        for suffix, labels, value in samples:
            lines.append(f"{name}{suffix}{{{labels}}} {_number(value)}")

    metric(
        "specdec_requests_running",
        "gauge",
        "Requests holding a slot (being decoded).",
        [("", label, stats["running"])],
    )
    metric(
        "specdec_requests_waiting",
        "gauge",
        "Requests waiting for a slot (queue depth).",
        [("", label, stats["waiting"])],
    )
    metric("specdec_slots", "gauge", "Request slots of the target.", [("", label, stats["slots"])])
    metric(
        "specdec_slots_free",
        "gauge",
        "Request slots holding no request.",
        [("", label, stats["free_slots"])],
    )
    metric(
        "specdec_queue_capacity",
        "gauge",
        "Requests that may wait before new ones get HTTP 429.",
        [("", label, engine.max_queue)],
    )
    for key, help_text in engine.metrics.COUNTERS.items():
        metric(
            f"specdec_{key}_total",
            "counter",
            help_text[0].upper() + help_text[1:] + ".",
            [("", label, counters[key])],
        )
    metric(
        "specdec_requests_finished_total",
        "counter",
        "Requests ended, by finish reason.",
        [
            ("", f'{label},finish_reason="{reason}"', count)
            for reason, count in snap["finished"].items()
        ],
    )
    drafted, accepted = counters["draft_tokens"], counters["accepted_tokens"]
    metric(
        "specdec_acceptance_rate",
        "gauge",
        "Accepted drafted tokens / drafted tokens since start (0 before any).",
        [("", label, accepted / drafted if drafted else 0.0)],
    )
    rows = counters["decode_row_steps"]
    metric(
        "specdec_mean_tokens_per_step",
        "gauge",
        "Tokens per request per decode step since start (bonus counted; plain decoding 1.0; 0 "
        "before any).",
        [("", label, counters["decode_tokens"] / rows if rows else 0.0)],
    )
    steps = counters["decode_steps"]
    metric(
        "specdec_mean_draft_nodes_per_row_step",
        "gauge",
        "Drafted tree nodes verified per request per decode step since start (after the budgets; 0 "
        "before any).",
        [("", label, counters["draft_nodes"] / rows if rows else 0.0)],
    )
    metric(
        "specdec_plain_step_share",
        "gauge",
        "Share of decode steps in which no request drafted, since start (0 before any).",
        [("", label, counters["plain_steps"] / steps if steps else 0.0)],
    )
    metric(
        "specdec_prefill_budget_tokens",
        "gauge",
        "Prompt tokens the last step with prompts to prefill could carry.",
        [("", label, snap["prefill_budget"])],
    )
    for name, (buckets, total, count) in snap["histograms"].items():
        samples = [("_bucket", f'{label},le="{_number(float(bound))}"', n) for bound, n in buckets]
        samples += [("_sum", label, float(total)), ("_count", label, count)]
        metric(f"specdec_{name}", "histogram", HISTOGRAM_HELP[name], samples)
    return "\n".join(lines) + "\n"


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')
