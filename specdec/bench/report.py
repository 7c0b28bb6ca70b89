"""Aggregate benchmark records: interleaved repeats pooled, speedups measured side by side.

Conventions (named in every table): tokens per step counts the bonus token (plain decoding =
1.0); speedup = tokens/s of a method over tokens/s of our plain decoding on the same backend,
dtype, temperature and prompts, each the tokens of every repeat over their seconds (so a speedup
is the ratio of two printed tok/s; a median of each repeat's speedup beside a median of each
repeat's tok/s had printed 1.79x beside 63.2 and 31.2 tok/s), each repeat's own in
``speedup_repeats``; tree reduction = 1 - verified drafted tokens / drafted tokens of the
distinct beams (roots not counted; the share deduplication into the prefix tree saved);
identical (greedy only) = the share of generations whose tokens equal our plain decoding's for
the same prompt and repeat, with the tokens up to the first difference of all tokens beside it;
speedup and identity compare with the plain method of the same backend, dtype and exact mode
(``plain`` or ``plain:exact=false``), and a plain method of another exact mode than ``plain``'s
with ``plain`` (``plain:exact=false``: what exact mode costs)."""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from pathlib import Path
from typing import Sequence

import attrs
import numpy as np

from specdec.bench.runner import BenchRecord
from specdec.bench.trust import impossible

PEER_BASELINE = {"torch": "hf", "mlx": "mlx-lm"}


def _group(records, keys):
    groups = defaultdict(list)
    for r in records:
        groups[tuple(getattr(r, k) for k in keys)].append(r)
    return groups


def _throughput(records) -> float:
    seconds = sum(r.seconds for r in records)
    return sum(r.new_tokens for r in records) / seconds if seconds > 0 else float("nan")


def _plain_labels(records, plain: str) -> dict[tuple, str]:
    """(backend, dtype, exact mode) -> the label of the plain method that ran there (``plain``
    first)."""
    labels: dict[tuple, str] = {}
    for r in sorted(records, key=lambda r: r.method != plain):
        if _is_plain(r.method, plain):
            labels.setdefault((r.backend, r.dtype, r.exact), r.method)
    return labels


def _is_plain(method: str, plain: str = "plain") -> bool:
    return method == plain or method.startswith(plain + ":")


def _baseline(method: str, where: tuple, plains: dict, plain: str) -> str:
    """The plain method ``method``'s speedup and identity compare with, at ``where`` (backend,
    dtype, exact mode): the plain of the same exact mode; for a plain method, ``plain`` itself
    (``plain:exact=false`` beside ``plain`` shows what exact mode costs, not 1.00)."""
    if _is_plain(method, plain):
        return plain
    return plains.get(where, plain)


def summarize(records: Sequence[BenchRecord], *, plain: str = "plain") -> list[dict]:
    """One row per (backend, dtype, temperature, method, category), plus category "all"."""
    records = list(records) + [attrs.evolve(r, category="all") for r in records]
    plains = _plain_labels(records, plain)
    exact_of = {(r.backend, r.dtype, r.method): r.exact for r in records}  # per backend and dtype
    cells = _group(records, ("backend", "dtype", "temperature", "category", "method", "repeat"))
    rows = []
    for (backend, dtype, temperature, category, method), group in _group(
        records, ("backend", "dtype", "temperature", "category", "method")
    ).items():
        repeats = sorted({r.repeat for r in group})
        tps = [
            _throughput(cells[(backend, dtype, temperature, category, method, k)]) for k in repeats
        ]

        def ratios(baseline: str) -> list[float]:  # one per repeat
            return [
                t / _throughput(cells[key])
                for t, k in zip(tps, repeats)
                if (key := (backend, dtype, temperature, category, baseline, k)) in cells
            ]

        def ratio(baseline: str) -> float:  # the pooled figures' (the tok/s column's) ratio
            runs = [
                r
                for k in repeats
                for r in cells.get((backend, dtype, temperature, category, baseline, k), ())
            ]
            return _throughput(group) / _throughput(runs) if runs else float("nan")

        steps = sum(r.steps for r in group)
        exact = exact_of[(backend, dtype, method)]
        baseline = _baseline(method, (backend, dtype, exact), plains, plain)
        compared = (
            [
                _compare(
                    r, cells.get((backend, dtype, temperature, category, baseline, r.repeat), ())
                )
                for r in group
            ]
            if temperature == 0
            else []
        )
        compared = [v for v in compared if v is not None]
        same = [
            matched == total and len(r_tokens) == total for matched, total, r_tokens in compared
        ]
        decode_steps = sum(len(r.accepted) for r in group)
        decode_time = sum(r.time_draft + r.time_verify + r.time_other for r in group)
        drafted = sum(r.drafted for r in group)
        row = dict(
            backend=backend,
            dtype=dtype,
            temperature=temperature,
            category=category,
            method=method,
            prompts=len({r.prompt_id for r in group}),
            repeats=len(repeats),
            exact=exact,
            # every repeat pooled (their tokens over their seconds), so that a speedup is the
            # ratio of two printed tok/s; each repeat's own speedup is in speedup_repeats
            tokens_per_second=_throughput(group),
            busy_runs=sum(r.busy for r in group),  # runs while other work took the cores
            runs=len(group),
            speedup=ratio(baseline),
            speedup_repeats=[round(v, 3) for v in ratios(baseline)],  # each repeat's, in order
            speedup_vs_peer=ratio(PEER_BASELINE.get(backend, "")),
            tokens_per_step=sum(r.new_tokens for r in group) / steps if steps else float("nan"),
            verified_per_step=sum(r.verified for r in group) / decode_steps
            if decode_steps
            else float("nan"),
            # the budgets chosen (specdec.decode.budget): share of decode steps that verified the
            # root alone
            plain_step_share=sum(r.plain_steps for r in group) / decode_steps
            if decode_steps
            else float("nan"),
            plain_reasons=dict(sum((Counter(r.plain_reasons) for r in group), Counter())),
            # share of the beams' drafted tokens that deduplication into the tree did not verify
            tree_reduction=1 - (sum(r.verified for r in group) - decode_steps) / drafted
            if drafted
            else float("nan"),
            draft_share=sum(r.time_draft for r in group) / decode_time
            if decode_time
            else float("nan"),
            verify_share=sum(r.time_verify for r in group) / decode_time
            if decode_time
            else float("nan"),
            other_share=sum(r.time_other for r in group) / decode_time
            if decode_time
            else float("nan"),
            # the plain method beside itself says nothing (the table shows "-")
            identical=float(np.mean(same)) if same and method != baseline else float("nan"),
            identical_tokens=sum(m for m, _, _ in compared),
            compared_tokens=sum(t for _, t, _ in compared),
            peak_rss_mb=max(
                (r.peak_rss_mb for r in group if not np.isnan(r.peak_rss_mb)), default=float("nan")
            ),
        )
        rows.append(row)
    order = {m: i for i, m in enumerate(dict.fromkeys(r.method for r in records))}
    rows.sort(
        key=lambda r: (
            r["backend"],
            r["dtype"],
            r["temperature"],
            r["category"] != "all",
            r["category"],
            order[r["method"]],
        )
    )
    return rows


def _compare(record: BenchRecord, plain_records) -> tuple[int, int, tuple] | None:
    """(tokens equal to our plain decoding's before the first difference, plain decoding's token
    count, the record's tokens) for ``record``'s prompt (None: no tokens on either side)."""
    reference = next((r for r in plain_records if r.prompt_id == record.prompt_id), None)
    if reference is None or not reference.tokens or not record.tokens:
        return None
    matched = next(
        (i for i, (a, b) in enumerate(zip(record.tokens, reference.tokens)) if a != b),
        min(len(record.tokens), len(reference.tokens)),
    )
    return matched, len(reference.tokens), tuple(record.tokens)


def identity_line(row: dict) -> str:
    """ "identical to plain decoding: N of M tokens" for a summary row (greedy rows only)."""
    if not row.get("compared_tokens"):
        return "-"
    return f"{row['identical_tokens']} of {row['compared_tokens']} tokens"


def _fmt(value, spec: str) -> str:
    return (
        "-"
        if value is None or (isinstance(value, float) and np.isnan(value))
        else format(value, spec)
    )


def busy_mark(row: dict) -> str:
    """A mark for a row some of whose runs other work slowed (their own clocks said so)."""
    busy = row.get("busy_runs") or 0
    return f" (busy: {busy} of {row.get('runs', '?')} runs)" if busy else ""


def impossible_mark(row: dict) -> str:
    """A flag for a speedup above the tokens per step it rests on (``specdec.bench.trust``): its
    plain decoding was timed slower than it runs, by other work on the machine."""
    speedup, tau = row.get("speedup"), row.get("tokens_per_step")
    if speedup is None or tau is None or np.isnan(speedup) or np.isnan(tau):
        return ""
    return " (impossible: above its tokens/step)" if impossible(speedup, tau) else ""


RSS_SPREAD = 0.05  # peak memory figures this close together are one figure: said once


def rss_note(rows: Sequence[dict]) -> str | None:
    """One line for the peak resident memory where every row's is within ``RSS_SPREAD`` of the
    others (the table then leaves its column out: a column of one figure read as each method's
    own memory, while it is the process's, the target and every method's drafter loaded); None
    where the rows differ (another backend or dtype in the grid), and the column stays."""
    values = [r.get("peak_rss_mb", float("nan")) for r in rows]
    values = [v for v in values if not np.isnan(v)]
    if not values:
        return "note: peak memory not measured (it is read from /proc, on Linux)"
    if max(values) > (1 + RSS_SPREAD) * min(values):
        return None
    return (
        f"note: peak memory {max(values):.0f} MB for every method: the process's, with the "
        "target and every method's drafter loaded (bench.json has each run's)"
    )


def markdown(rows: Sequence[dict], *, categories: bool = True, notes: Sequence[str] = ()) -> str:
    """A Markdown table of ``summarize`` rows, and ``notes`` after it (whether the machine was
    busy, whether the prompts were too few to trust a difference). The peak-memory column is
    one line instead where every row's figure is the same (``rss_note``)."""
    nan = float("nan")
    memory = rss_note(rows)
    header = (
        "| backend | dtype | exact | T | category | method | tok/s | speedup vs plain (x) | vs "
        "peer's plain (x) | tokens/step | verified/step | no-draft steps | tree reduction | draft "
        "/ verify / other | identical to plain |" + (" peak RSS MB |" if memory is None else "")
    )
    lines = [header, "|" + "---|" * (header.count("|") - 1)]
    for r in rows:
        if not categories and r["category"] != "all":
            continue
        split = (
            "-"
            if np.isnan(r["draft_share"])
            else (f"{r['draft_share']:.0%} / {r['verify_share']:.0%} / {r['other_share']:.0%}")
        )
        lines.append(
            f"| {r['backend']} | {r['dtype']} | {r.get('exact') or '-'} | {r['temperature']:g} | "
            f"{r['category']} | {r['method']} | "
            f"{_fmt(r['tokens_per_second'], '.1f')}{busy_mark(r)} | "
            f"{_fmt(r['speedup'], '.2f')}{impossible_mark(r)} | "
            f"{_fmt(r['speedup_vs_peer'], '.2f')} | "
            f"{_fmt(r['tokens_per_step'], '.2f')} | {_fmt(r['verified_per_step'], '.1f')} | "
            f"{'-' if r['method'] == 'plain' else _fmt(r.get('plain_step_share', nan), '.0%')} | "
            f"{_fmt(r['tree_reduction'], '.0%')} | {split} | "
            f"{'-' if r['method'] == 'plain' else identity_line(r)} |"
            + ("" if memory else f" {_fmt(r.get('peak_rss_mb', nan), '.0f')} |")
        )
    notes = ([memory] if memory else []) + list(notes)  # as the terminal shows them
    return "\n".join(lines + [f"\n{note}" for note in notes])


# why a method's steps decoded plainly, in words (the reasons of specdec.decode.budget)
WHY_PLAIN = {
    "prediction": "auto judged drafting would not pay, from the drafter's acceptance so far and "
    "this machine's step costs",
    "realized": "its drafting steps delivered fewer tokens per second than plain steps here",
    "no draft": "the drafter proposed nothing (prompt lookup finds no match in new text)",
    "measuring": "plain steps that auto times to price drafting against",
    "prompt": "steps that carried prompt tokens",
}
MOSTLY_PLAIN = 0.5  # a method whose steps decoded plainly this often gets a note saying why


def settings_note(records: Sequence[BenchRecord]) -> list[str]:
    """One line: the beam or tree sizes each method drafted with, where it has them, and whether
    a plan kept by ``specdec plan`` set them (the same method line runs other beams once a plan
    is kept)."""
    found = {r.method: r.settings for r in records if r.settings}
    if not found:
        return []
    return ["note: the methods drafted with " + "; ".join(f"{m}: {s}" for m, s in found.items())]


def plain_notes(rows: Sequence[dict], *, hint: bool = True) -> list[str]:
    """A note per method (its total row) that decoded most of its steps plainly, other than by
    ``speculation="never"``: how often, the main reason in words, and (``hint``) how to see what
    drafting every step gives (the table shows only the share)."""
    notes = []
    methods = {r["method"] for r in rows}
    for r in rows:
        reasons = {k: v for k, v in r.get("plain_reasons", {}).items() if k != "never"}
        if r["category"] != "all" or r["method"] == "plain" or not reasons:
            continue
        if not r["plain_step_share"] >= MOSTLY_PLAIN:
            continue
        why = max(reasons.items(), key=lambda item: item[1])[0]
        counts = ", ".join(f"{n} {k}" for k, n in sorted(reasons.items(), key=lambda i: -i[1]))
        # one method's options follow one colon, comma separated (w=2,l=3:speculation=always
        # was refused)
        always = r["method"] + ("," if ":" in r["method"] else ":") + "speculation=always"
        always = (
            f"; `{always}` shows what drafting every step gives"
            if hint
            and "speculation=" not in r["method"]
            and why in ("prediction", "realized")
            and always not in methods
            else ""
        )
        notes.append(
            f"note: {r['method']} ({r['backend']}, T={r['temperature']:g}) decoded "
            f"{r['plain_step_share']:.0%} of its steps plainly (by reason: {counts}): mostly "
            f"{WHY_PLAIN.get(why, why)}{always}"
        )
    return notes


AUTO_BEHIND = 1.25  # a category where drafting every step ran this many times auto's gets a note
FEW_RUNS = 8  # a category row on fewer runs is an example, as bench's few-runs note says


def auto_behind_notes(rows: Sequence[dict]) -> list[str]:
    """A note per category where a method's ``speculation=always`` twin ran ``AUTO_BEHIND``
    times its auto figure: auto learns acceptance over the requests before, so text far more
    predictable than them (a prompt's text copied into the answer) drafted in few steps at first
    (extraction: 1.05x under auto, 93% of its steps plain, 2.01x drafting every step), while the
    total row showed auto ahead."""
    notes = []
    for r in rows:
        method = r["method"]
        if "speculation=always" not in method or r["category"] == "all":
            continue
        base = method.replace(",speculation=always", "").replace(":speculation=always", "")
        auto = next(
            (
                a
                for a in rows
                if a["method"] == base
                and (a["backend"], a["temperature"], a["category"])
                == (r["backend"], r["temperature"], r["category"])
            ),
            None,
        )
        if (
            auto is None
            or not auto["speedup"] > 0
            or not r["speedup"] >= AUTO_BEHIND * auto["speedup"]
        ):
            continue
        runs = min(r.get("runs", 0), auto.get("runs", 0))
        few = f" ({runs} run{'' if runs == 1 else 's'}: an example)" if runs < FEW_RUNS else ""
        plain = auto.get("plain_step_share", float("nan"))
        # auto drafted in (nearly) every step: it cut the trees rather than declining to draft
        # ("0% of its steps plain: auto judged drafting would not pay" read as a contradiction)
        how = (
            f"auto drafted in nearly every step but cut its trees to what it judged would pay "
            f"({auto.get('verified_per_step', float('nan')):.1f} nodes verified a step against "
            f"{r.get('verified_per_step', float('nan')):.1f}), "
            if plain < 0.05
            else "auto judged drafting would not pay there, "
        )
        notes.append(
            f"note: in {r['category']}{few}, {method} ran {r['speedup']:.2f}x against {base}'s "
            f"{auto['speedup']:.2f}x under auto ({plain:.0%} of its steps plain): {how}from the "
            "acceptance it learnt over the requests before and this machine's step costs, and a "
            "kind of text more predictable than those drafts in few steps at first; for such a "
            'workload, bench it on prompts of its own (--prompts FILE.jsonl) or decode with '
            'speculation="always"'
        )
    return notes


SPREAD = 1.10  # repeats of one method this far apart get a note: the spread a figure carries


def spread_notes(rows: Sequence[dict]) -> list[str]:
    """A note per method (its total row) whose repeats' speedups lie ``SPREAD`` or more apart:
    the pooled figure the table shows hides how far one run moves it (under auto on a 2-core
    AVX2-only CPU the same method ran 1.05x, 1.25x and 1.13x in three runs of the same prompts)."""
    notes = []
    for r in rows:
        values = [v for v in r.get("speedup_repeats", []) if v > 0]
        if r["category"] != "all" or r["method"] == "plain" or len(values) < 2:
            continue
        if max(values) >= SPREAD * min(values):
            notes.append(
                f"note: {r['method']} ({r['backend']}, T={r['temperature']:g}) ran "
                f"{min(values):.2f}-{max(values):.2f}x over its {len(values)} repeats (the table "
                "pools them): read a difference smaller than that spread as noise"
            )
    return notes


def accepted_histogram(records: Sequence[BenchRecord]) -> dict[str, dict[int, int]]:
    """Per method, how many drafting steps accepted 0, 1, 2, ... drafted tokens: the steps that
    decoded plainly (``plain_steps``: auto declined, or nothing was drafted) are left out, or
    under auto the bar at 0 would say how often it declined, not how well the drafter accepts.
    A method that drafted in no step has no entry."""
    hist: dict[str, dict[int, int]] = defaultdict(lambda: defaultdict(int))
    for r in records:
        for n in r.accepted:
            hist[r.method][n] += 1
        hist[r.method][0] -= r.plain_steps  # each accepted 0 drafted tokens
    return {
        m: {n: c for n, c in sorted(h.items()) if c > 0}
        for m, h in hist.items()
        if sum(h.values()) > 0
    }


def _finite(value):
    """``value`` with every NaN or infinity (a figure that does not exist, e.g. the speedup of a
    method that ran no step) as null: JSON has no NaN."""
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    if isinstance(value, (float, np.floating)):
        return float(value) if np.isfinite(value) else None
    if isinstance(value, np.integer):
        return int(value)
    return value


def _split_dtype(row: dict) -> dict:
    """``row`` with a dtype label such as "bfloat16 (cached)" (the table's) as ``dtype``
    "bfloat16" and ``dtype_source`` "cached", for filtering bench.json; a label without a source
    (a dtype given, or a peer's) keeps ``dtype`` and has ``dtype_source`` null."""
    name, _, source = str(row.get("dtype", "")).partition(" (")
    return {**row, "dtype": name, "dtype_source": source.removesuffix(")") or None}


def write_outputs(
    records: Sequence[BenchRecord], out: Path, *, meta: dict, summary: list | None = None
) -> dict:
    """bench.json (records, summary, meta; valid JSON: a missing figure is null), bench.md, and
    plots speedup.png, accepted.png (each method in the same colour in both). ``summary``:
    ``summarize(records)`` where the caller has it already."""
    out.mkdir(parents=True, exist_ok=True)
    rows = summarize(records) if summary is None else summary
    report = dict(
        meta=meta,
        summary=[_split_dtype(r) for r in rows],
        records=[_split_dtype(attrs.asdict(r)) for r in records],
        accepted_histogram=accepted_histogram(records),
    )
    (out / "bench.json").write_text(json.dumps(_finite(report), indent=1, allow_nan=False))
    (out / "bench.md").write_text(markdown(rows, notes=meta.get("notes", ())) + "\n")
    spoilt = sum(r.busy for r in records)
    plot(rows, records, out, busy=f"{spoilt} of {len(records)} runs" if spoilt else "")
    return dict(summary=rows)


def _bar_flag(row: dict | None) -> str:
    """A bar's mark: ``*`` where other work slowed some of its runs, ``!`` where its speedup is
    above its tokens per step (what the table says in words)."""
    if row is None:
        return ""
    flag = "*" if row.get("busy_runs") else ""
    return flag + ("!" if impossible_mark(row) else "")


def plot(
    rows: Sequence[dict], records: Sequence[BenchRecord], out: Path, *, busy: str = ""
) -> None:
    """Speedup by category (bars per method) and the distribution of accepted lengths; ``busy``:
    how many timed runs other work on the machine slowed ("3 of 16 runs"), which the speedup
    plot's title says, and where each bar rests on such runs or cannot be (a speedup above its
    tokens per step), its label says."""
    import matplotlib  # optional: matplotlib (bench extra)

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # optional: matplotlib (bench extra)
    import matplotlib.ticker  # optional: matplotlib (bench extra)

    methods_all = [m for m in dict.fromkeys(r["method"] for r in rows) if m != "plain"]
    methods_all += [m for m in accepted_histogram(records) if m not in methods_all]
    palette = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    colour = {m: palette[i % len(palette)] for i, m in enumerate(methods_all)}
    configs = sorted({(r["backend"], r["dtype"], r["temperature"]) for r in rows})
    fig, axes = plt.subplots(len(configs), 1, figsize=(10, 3.5 * len(configs)), squeeze=False)
    for ax, (backend, dtype, temperature) in zip(axes[:, 0], configs):
        sub = [
            r
            for r in rows
            if (r["backend"], r["dtype"], r["temperature"]) == (backend, dtype, temperature)
        ]
        categories = list(dict.fromkeys(r["category"] for r in sub))
        methods = [m for m in dict.fromkeys(r["method"] for r in sub) if m != "plain"]
        width = 0.8 / max(len(methods), 1)
        for i, method in enumerate(methods):
            values = [
                next(
                    (r["speedup"] for r in sub if r["category"] == c and r["method"] == method),
                    np.nan,
                )
                for c in categories
            ]
            flags = [
                _bar_flag(
                    next((r for r in sub if (r["category"], r["method"]) == (c, method)), None)
                )
                for c in categories
            ]
            bars = ax.bar(
                np.arange(len(categories)) + i * width,
                values,
                width,
                label=method,
                color=colour[method],
            )
            ax.bar_label(bars, labels=flags, fontsize=9, padding=1)  # upright: "!" read as "-"
        ax.axhline(1.0, color="black", linewidth=0.8)
        ax.margins(y=0.08)  # room above the tallest bar for its mark
        runs = {c: max(r["runs"] for r in sub if r["category"] == c) for c in categories}
        ax.set_xticks(  # each category's runs: one run's bar is an example, not a figure
            np.arange(len(categories)) + width * (len(methods) - 1) / 2,
            [f"{c}\n{runs[c]} run{'' if runs[c] == 1 else 's'}" for c in categories],
            rotation=30,
        )
        ax.set_ylabel("speedup vs plain")
        ax.set_title(
            f"{backend} {dtype} T={temperature:g}"
            + (f"  ({busy} slowed by other work: * unreliable, ! impossible)" if busy else "")
        )
        # beside the bars, not over them (it covered the last category's)
        ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0)
    fig.tight_layout()
    fig.savefig(out / "speedup.png", dpi=110, bbox_inches="tight")
    plt.close(fig)
    hist = accepted_histogram(records)
    fig, ax = plt.subplots(figsize=(8, 3.5))
    for i, (method, counts) in enumerate(hist.items()):
        total = sum(counts.values())
        keys = np.array(list(counts))
        ax.bar(
            keys + (i - (len(hist) - 1) / 2) * 0.8 / max(len(hist), 1),  # centred on the count
            [c / total for c in counts.values()],
            0.8 / max(len(hist), 1),
            label=f"{method} ({total} drafting step{'' if total == 1 else 's'})",
            color=colour.get(method),
        )
    ax.xaxis.set_major_locator(matplotlib.ticker.MaxNLocator(integer=True))  # whole tokens
    ax.set_xlabel("drafted tokens accepted per drafting step")
    ax.set_ylabel("share of drafting steps")
    if hist:
        ax.legend(fontsize=8)
    else:  # no method drafted in any step (auto declined every one): say so, not an empty legend
        ax.text(0.5, 0.5, "no drafting step", ha="center", va="center", transform=ax.transAxes)
    fig.tight_layout()
    fig.savefig(out / "accepted.png", dpi=110)
    plt.close(fig)
