"""docs/serving.md, "The metrics snapshot", lists exactly the keys ``EngineMetrics.snapshot()``
returns (``counters.NAME``, ``finished.REASON``, ``histograms.NAME``, and the plain values), so
the page cannot drift from the code."""

from __future__ import annotations

import math
import re
from pathlib import Path

from specdec.serving.metrics import EngineMetrics

ROOT = Path(__file__).resolve().parents[2]
SECTION = "### The metrics snapshot"


def documented_keys() -> list[str]:
    text = (ROOT / "docs/serving.md").read_text()
    assert text.count(SECTION) == 1, f"docs/serving.md has no single {SECTION!r} section"
    section = text.split(SECTION, 1)[1].split("\n#", 1)[0]
    return re.findall(r"^\| `([a-z_]+(?:\.[a-z_]+)?)` \|", section, re.M)


def snapshot_keys(snapshot: dict) -> list[str]:
    keys = []
    for name, value in snapshot.items():
        keys += [f"{name}.{key}" for key in value] if isinstance(value, dict) else [name]
    return keys


def test_the_documented_keys_are_the_snapshots():
    documented = documented_keys()
    assert len(documented) == len(set(documented)), "a key is documented twice"
    assert sorted(documented) == sorted(snapshot_keys(EngineMetrics().snapshot()))


def test_the_snapshot_has_the_documented_shapes():
    metrics = EngineMetrics()
    metrics.add("requests_submitted", 2)
    metrics.observe("step_seconds", 0.02, times=3)
    snapshot = metrics.snapshot()
    assert set(snapshot) == {"counters", "finished", "prefill_budget", "histograms"}
    assert snapshot["counters"]["requests_submitted"] == 2
    assert isinstance(snapshot["prefill_budget"], int)
    assert all(
        isinstance(v, int) for part in ("counters", "finished") for v in snapshot[part].values()
    )
    buckets, total, count = snapshot["histograms"]["step_seconds"]
    assert math.isinf(buckets[-1][0]) and buckets[-1][1] == count == 3 and math.isclose(total, 0.06)
    assert dict(buckets)[0.025] == 3 and dict(buckets)[0.01] == 0, "cumulative, at or below"
