"""An engine's metrics in the Prometheus text exposition format (version 0.0.4).

Counters end in ``_total``; histograms have ``_bucket{le=...}``, ``_sum`` and ``_count``. Every
name starts with ``specdec_``. Written out here so that the core needs no Prometheus client.
"""

from __future__ import annotations

import math

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
