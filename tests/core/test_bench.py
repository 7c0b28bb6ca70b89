"""The benchmark harness on the numpy backend: records, side-by-side speedups, outputs."""

from __future__ import annotations

import json
import re

import attrs
import numpy as np
import pytest

from specdec.bench import load_prompt_set, parse_method, run_bench
from specdec.bench.report import markdown, summarize, write_outputs
from specdec.errors import InvalidInputError
from specdec.testing import make_random_drafter


def test_prompt_sets():
    mt = load_prompt_set("mt-bench")
    assert len(mt) == 80 and len({p.category for p in mt}) == 8
    assert len(load_prompt_set("mt-bench", per_category=2)) == 16
    with pytest.raises(InvalidInputError, match="unknown prompt set"):
        load_prompt_set("nonexistent-set")


def test_jsonl_prompts(tmp_path):
    path = tmp_path / "p.jsonl"
    path.write_text(
        json.dumps({"prompt": "hi", "category": "x"})
        + "\n"
        + json.dumps({"messages": [{"role": "user", "content": "yo"}]})
        + "\n"
    )
    prompts = load_prompt_set(str(path))
    assert [p.category for p in prompts] == ["x", "uncategorised"] and prompts[0].prompt == "hi"


def test_parse_method():
    method = parse_method("redrafter:w=4,l=5,verifier=exact")
    assert method.kind == "redrafter" and method.options == {
        "beam_width": 4,
        "beam_length": 5,
        "verifier": "exact",
    }
    with pytest.raises(InvalidInputError, match="unknown method"):
        parse_method("hydra")
    with pytest.raises(InvalidInputError, match="needs a draft model"):
        parse_method("hf-assisted")
    assert parse_method("hf:dtype=own").options == {"dtype": "own"}
    with pytest.raises(InvalidInputError, match="dtype is a peer's option"):
        parse_method("redrafter:dtype=float32")
    assert parse_method("eagle:total_tokens=8,depth=4").options == {"total_tokens": 8, "depth": 4}
    with pytest.raises(InvalidInputError, match="bad option"):
        parse_method("hf-pld:depth=4")  # a peer takes only the listed keys
    with pytest.raises(InvalidInputError, match="bad option"):
        parse_method("eagle:total_tokens")


def test_a_drafters_own_option_reaches_its_factory(model_dir, target, tmp_path):
    """A drafter's own keyword (``beam_width=3`` spelled out) reaches its factory; one it does not
    take is named."""
    from specdec.bench.runner import specdec_runner

    drafter = make_random_drafter(tmp_path / "d", model_dir, kind="redrafter", seed=1)
    method = parse_method(f"redrafter:drafter={drafter},lookup=false,beam_width=3,beam_length=2")
    assert specdec_runner(method, model_dir, target, "numpy", 8).drafter.beam_width == 3
    wrong = parse_method(f"redrafter:drafter={drafter},depth=4")
    with pytest.raises(InvalidInputError, match="does not take option.*depth"):
        specdec_runner(wrong, model_dir, target, "numpy", 8)


def test_the_bench_records_each_methods_sizes_and_whether_a_plan_set_them(
    model_dir, target, tmp_path, monkeypatch
):
    """After `specdec plan` kept W=1 L=2, the same `redrafter` method ran those beams and
    neither bench.md nor bench.json said so: the same command meant other beams."""
    from specdec.bench.report import settings_note
    from specdec.bench.runner import BenchRecord, specdec_runner
    from specdec.plugins.builtin import NumpyBackend
    from specdec.tuning import plans

    monkeypatch.setenv("SPECDEC_CACHE", str(tmp_path / "cache"))
    drafter = make_random_drafter(tmp_path / "d", model_dir, kind="redrafter", seed=1)
    method = parse_method(f"redrafter:drafter={drafter}")
    own = specdec_runner(method, model_dir, target, "numpy", 8).settings
    assert own.startswith("beam_width=") and "lookup draft_length=10" in own, own
    assert "specdec plan" not in own
    options = {"beam_width": 1, "beam_length": 2}
    plans.save_drafter_plan(NumpyBackend(), target, str(drafter), options=options, details={})
    planned = specdec_runner(method, model_dir, target, "numpy", 8).settings
    assert planned.startswith("beam_width=1, beam_length=2, ") and planned.endswith(
        " (chosen by `specdec plan` here)"
    ), planned
    # a chain says its length alone (its beam shape follows from it), and its answer store
    assert specdec_runner(parse_method("lookup"), model_dir, target, "numpy", 8).settings == (
        "draft_length=10"
    )
    import types

    from specdec.decode.plan import drafter_settings

    stored = types.SimpleNamespace(beam_width=1, beam_length=11, draft_length=10, store=object())
    assert drafter_settings(stored) == ["draft_length=10", "with the answer store"]
    # Medusa: no option sizes its tree (bench's note named every method's sizes but its)
    medusa = make_random_drafter(tmp_path / "m", model_dir, kind="medusa", seed=1)
    settings = specdec_runner(
        parse_method(f"medusa:drafter={medusa}"), model_dir, target, "numpy", 8
    )
    assert re.fullmatch(r"top_t=\d+, trees of at most \d+ nodes", settings.settings), (
        settings.settings
    )
    # plain decoding has no settings to name (it read "trees of at most 1 nodes")
    assert specdec_runner(parse_method("plain"), model_dir, target, "numpy", 8).settings == ""
    named = parse_method(f"redrafter:drafter={drafter},w=2,l=3")  # the caller's beams win
    assert "plan" not in specdec_runner(named, model_dir, target, "numpy", 8).settings
    record = dict(backend="numpy", dtype="", temperature=0.0, prompt_id="1", category="c")
    records = [
        BenchRecord(method=m, repeat=0, new_tokens=1, seconds=1.0, settings=s, **record)
        for m, s in (("plain", ""), ("redrafter", planned))
    ]
    assert settings_note(records) == [f"note: the methods drafted with redrafter: {planned}"]


def test_the_bench_runs_the_default_path_and_records_peak_memory(model_dir, target, tmp_path):
    """``redrafter`` in a bench is generate's default (with the lookup beam); lookup=false is
    ReDrafter alone."""
    import sys

    from specdec.bench.runner import specdec_runner
    from specdec.drafting.lookup import LookupDrafter

    drafter = make_random_drafter(tmp_path / "d", model_dir, kind="redrafter", seed=1)
    default, alone = (
        parse_method(f"redrafter:drafter={drafter},w=2,l=3{extra}")
        for extra in ("", ",lookup=false")
    )
    assert isinstance(specdec_runner(default, model_dir, target, "numpy", 8).drafter, LookupDrafter)
    assert not isinstance(
        specdec_runner(alone, model_dir, target, "numpy", 8).drafter, LookupDrafter
    )
    with_lookup, without = (
        specdec_runner(m, model_dir, target, "numpy", 12)([5, 6, 7, 5, 6, 7, 5, 6], 0.0, 0)
        for m in (default, alone)
    )
    # this random target repeats itself, which the lookup beam copies and the random ReDrafter
    # cannot
    assert sum(with_lookup["accepted"]) > sum(without["accepted"]) == 0, (
        "lookup=false runs ReDrafter alone"
    )
    records = run_bench(
        model_dir,
        load_prompt_set("mt-bench", per_category=1)[:1],
        [default, alone],
        grid=[("numpy", None)],
        max_new_tokens=8,
        repeats=1,
        progress=False,
    )
    if sys.platform.startswith("linux"):
        assert all(r.peak_rss_mb > 10 for r in records)
        assert "peak RSS MB" in markdown(summarize(records)) or "note: peak memory" in markdown(
            summarize(records)
        )


def test_one_peak_memory_figure_is_a_note_and_several_a_column():
    """A column of one figure (1390 MB on every row) read as each method's own memory."""
    row = dict(
        backend="torch", dtype="float32", exact="off", temperature=0.0, category="all",
        method="plain", tokens_per_second=20.0, speedup=1.0, speedup_vs_peer=float("nan"),
        tokens_per_step=1.0, verified_per_step=1.0, tree_reduction=float("nan"),
        draft_share=0.0, verify_share=1.0, other_share=0.0, peak_rss_mb=1390.0,
    )  # fmt: skip
    same = [row, {**row, "method": "redrafter", "peak_rss_mb": 1402.0}]
    text = markdown(same)
    assert "peak RSS MB" not in text and text.count("| 1390 |") == 0
    assert "note: peak memory 1402 MB for every method: the process's" in text
    # first among the notes, in bench.md as in the terminal (the table, then it, then the rest)
    notes = [line for line in markdown(same, notes=["note: quiet"]).splitlines() if line]
    assert notes[-2:] == [notes[-2], "note: quiet"] and notes[-2].startswith("note: peak memory")
    apart = [row, {**row, "backend": "mlx", "peak_rss_mb": 2100.0}]
    text = markdown(apart)
    assert "peak RSS MB |" in text and "| 2100 |" in text and "note: peak memory" not in text


def test_run_bench_and_outputs(model_dir, tmp_path):
    drafter = make_random_drafter(tmp_path / "d", model_dir, kind="redrafter", seed=1)
    prompts = load_prompt_set("mt-bench", per_category=1)[:2]
    methods = [parse_method("plain"), parse_method(f"redrafter:drafter={drafter},w=2,l=3")]
    records = run_bench(
        model_dir,
        prompts,
        methods,
        grid=[("numpy", None)],
        max_new_tokens=6,
        repeats=2,
        temperatures=[0.0, 1.0],
        progress=False,
    )
    assert len(records) == 2 * 2 * 2 * 2
    rows = summarize(records)
    plain = [r for r in rows if r["method"] == "plain" and r["category"] == "all"]
    assert all(r["speedup"] == 1.0 and r["tokens_per_step"] == 1.0 for r in plain), plain
    spec = [r for r in rows if r["method"] != "plain" and r["category"] == "all"]
    # W=2 beams of L=3 and the default lookup chain of 10 drafted tokens: at most 1 + 2 x 2 + 10
    # nodes
    assert all(0.0 <= r["tree_reduction"] < 1.0 and r["verified_per_step"] <= 15 for r in spec), (
        spec
    )
    # every plain step is counted by its reason (plain decoding: its drafter drafts nothing)
    for r in records:
        assert sum(r.plain_reasons.values()) == r.plain_steps, r
    assert all(set(r["plain_reasons"]) == {"no draft"} for r in plain), plain
    greedy = [r for r in rows if r["temperature"] == 0 and r["method"] != "plain"]
    assert all(np.isnan(r["identical"]) for r in rows if r["method"] == "plain"), "itself"
    assert all(r["identical"] == 1.0 for r in greedy), (
        "greedy speculative output differs from plain decoding"
    )
    assert all(np.isnan(r["identical"]) for r in rows if r["temperature"] > 0), (
        "identity is a greedy check"
    )
    changed = [
        attrs.evolve(r, tokens=r.tokens[:-1] + (r.tokens[-1] + 1,)) if r.method != "plain" else r
        for r in records
    ]
    assert all(
        r["identical"] == 0.0
        for r in summarize(changed)
        if r["temperature"] == 0 and r["method"] != "plain"
    )
    write_outputs(records, tmp_path / "out", meta={"test": True})
    for name in ("bench.json", "bench.md", "speedup.png", "accepted.png"):
        assert (tmp_path / "out" / name).stat().st_size > 0, name

    def no_constant(name):  # strict JSON: NaN and Infinity are not JSON
        raise AssertionError(f"bench.json holds {name}")

    text = (tmp_path / "out" / "bench.json").read_text()
    data = json.loads(text, parse_constant=no_constant)
    assert any(value is None for row in data["summary"] for value in row.values()), (
        "the sampled rows' identity (a greedy check) is null, not NaN"
    )
    assert len(data["records"]) == len(records) and data["meta"] == {"test": True}
    # a dtype label such as "float32 (measured)" is the table's: bench.json splits it to filter on
    labels = {r.dtype for r in records}
    for row in data["summary"] + data["records"]:
        assert " (" not in row["dtype"] and f"{row['dtype']} ({row['dtype_source']})" in labels, row
    table = (tmp_path / "out" / "bench.md").read_text()
    said = [line for line in table.splitlines() if line.startswith("note:")]
    assert all(line.startswith("note: peak memory") for line in said), said  # no other notes
    plain_row = next(line for line in table.splitlines() if "| plain |" in line)
    assert plain_row.split("|")[12].strip() == "-", plain_row  # no-draft steps: none to draft
    # the notes go with the file, which is shared without the terminal's lines
    notes = ["note: measured while other work shared the machine (a test)", "note: few (a test)"]
    write_outputs(records, tmp_path / "busy", meta={"notes": notes})
    assert "\n\n".join(notes) in (tmp_path / "busy" / "bench.md").read_text()


def test_the_plots_marks_stand_upright_inside_the_axes(tmp_path, monkeypatch):
    """A bar resting on slowed runs (``*``) whose speedup is also above its tokens per step
    (``!``) was labelled "*!" turned on its side, where "!" read as "-" and ran into the title."""
    pytest.importorskip("matplotlib")
    import matplotlib.figure

    from specdec.bench import report

    base = dict(backend="torch", dtype="float32", temperature=0.0, category="all", runs=6)
    rows = [
        {**base, "method": "plain", "speedup": 1.0, "tokens_per_step": 1.0},
        {
            **base,
            "category": "code",
            "method": "a",
            "speedup": 1.2,
            "tokens_per_step": 1.5,
            "runs": 1,
        },
        {**base, "method": "a", "speedup": 2.5, "tokens_per_step": 2.0, "busy_runs": 3},
        {**base, "method": "b", "speedup": 1.1, "tokens_per_step": 1.5, "busy_runs": 1},
    ]
    figures = []
    monkeypatch.setattr(
        matplotlib.figure.Figure, "savefig", lambda fig, *a, **k: figures.append(fig)
    )
    import warnings

    with warnings.catch_warnings():  # no drafting step recorded: no empty legend's warning
        warnings.simplefilter("error")
        report.plot(rows, [], tmp_path, busy="4 of 6 runs")
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    ax = figures[0].axes[0]
    renderer = FigureCanvasAgg(figures[0]).get_renderer()  # the figure is closed once saved
    inside = ax.get_window_extent(renderer)
    marks = [t for t in ax.texts if t.get_text()]
    assert sorted(t.get_text() for t in marks) == ["*", "*!"]
    # a category's runs under its name: a bar of one run is an example, not a figure
    assert [t.get_text() for t in ax.get_xticklabels()] == ["all\n6 runs", "code\n1 run"]
    for mark in marks:
        box = mark.get_window_extent(renderer)
        assert mark.get_rotation() == 0 and box.y1 <= inside.y1, mark.get_text()


def test_planner_predicts_and_measures(model_dir, tmp_path):
    from specdec.bench.planner import accepted_length, measure, plan, tree_size
    import numpy as np

    beams = np.array([[7, 1, 2, 3], [7, 1, 5, 6], [7, 4, 4, 4]])
    assert accepted_length(beams, [1, 2, 9], width=3, length=4) == 2
    assert accepted_length(beams, [1, 2, 9], width=3, length=2) == 1
    assert accepted_length(beams, [4, 9], width=2, length=4) == 0
    assert tree_size(beams, 3, 4) == 1 + 3 + 3 + 2 and tree_size(beams, 1, 2) == 2
    # the lookup beam (the last) keeps its own length whatever L the model beams are cut to
    with_lookup, lengths = np.array([[7, 1, 2, 3, 3, 3], [7, 4, 4, 4, 9, 8]]), np.array([4, 6])
    assert accepted_length(with_lookup, [4, 4, 4, 9, 8, 0], 1, 3, True, lengths) == 5
    assert accepted_length(with_lookup, [1, 2, 3, 3, 0], 1, 6, False, lengths) == 3, (
        "beam 0 ends after 3 drafted"
    )
    assert tree_size(with_lookup, 1, 3, True, lengths) == 1 + 2 + 5
    drafter = make_random_drafter(tmp_path / "d", model_dir, kind="redrafter", seed=1)
    rows = plan(
        model_dir,
        str(drafter),
        [[1, 2, 3], [4, 5]],
        backend="numpy",
        widths=(1, 2),
        lengths=(2, 3),
        max_new_tokens=8,
    )
    assert len(rows) == 4 and rows == sorted(rows, key=lambda r: -r.predicted_speedup)
    assert all(r.tokens_per_step >= 1.0 and r.predicted_speedup > 0 for r in rows)
    checked = measure(
        model_dir,
        str(drafter),
        [[1, 2, 3]],
        rows[:1],
        backend="numpy",
        dtype=None,
        max_new_tokens=8,
    )
    assert checked[0].measured_speedup > 0


def test_the_planner_decodes_its_shapes_drafting_every_step(model_dir, tmp_path, monkeypatch):
    """The measured column and the comparison with generate's setting draft every step, as the
    prediction and the tree planner do: decoded under auto, a shape whose drafts did not pay
    decoded mostly plainly and measured near 1.00x whatever its beams. An untimed whole prompt
    comes first: the first decode pays for its first forwards, which counted against the first
    shape."""
    import specdec
    from specdec.bench.planner import Current, PlanRow, measure, measure_current

    monkeypatch.delenv("SPECDEC_SPECULATION", raising=False)  # generate's own default: auto
    seen, real = [], specdec.generate
    monkeypatch.setattr(
        specdec,
        "generate",
        lambda *a, **k: (
            seen.append((k["drafter"], k.get("speculation"), k["max_new_tokens"])) or real(*a, **k)
        ),
    )
    drafter = str(make_random_drafter(tmp_path / "d", model_dir, kind="redrafter", seed=1))
    row = PlanRow(
        beam_width=1, beam_length=2, tokens_per_step=1.5, tree_size=3.0, verify_ms=1.0,
        draft_ms=1.0, predicted_speedup=1.2,
    )  # fmt: skip
    options = dict(backend="numpy", dtype=None, max_new_tokens=4)
    measure(model_dir, drafter, [[1, 2, 3]], [row], **options)
    now = Current(beam_width=1, beam_length=2, lookup=True, speedup=0.0)
    measure_current(model_dir, drafter, [[1, 2, 3]], now=now, **options)
    warm_up, plain, drafting = (drafter, "always", 4), ("none", None, 4), (drafter, "always", 4)
    assert seen == [warm_up, plain, drafting, plain, drafting]


def test_the_tree_planner_warms_up_then_decodes_each_prompt_with_plain_and_the_settings(
    model_dir, tmp_path, monkeypatch
):
    """After a warm-up of 8 tokens the first setting decoded (generate's own) still ran at 17.2
    tokens/s against 18.9 for the same trees decoded next: the warm-up decodes a whole prompt.
    Then plain decoding and an option's settings take each prompt in turn: plain decoding timed
    over every prompt before and after all the settings let a virtual machine's drift of minutes
    into the figures (settings of the same trees measured 1.98x and 1.72x in one plan)."""
    import specdec
    from specdec.bench import tree_planner

    seen, real = [], specdec.generate
    monkeypatch.setattr(
        specdec,
        "generate",
        lambda target, prompt, **k: (
            seen.append((k["drafter"], tuple(prompt), k["max_new_tokens"]))
            or real(target, prompt, **k)
        ),
    )
    drafter = str(make_random_drafter(tmp_path / "e", model_dir, kind="eagle", seed=1))
    tree_planner.plan_tree(
        model_dir, drafter, [[1, 2, 3], [4, 5, 6]], backend="numpy", max_new_tokens=12, lookup=False
    )
    assert seen[0] == (drafter, (1, 2, 3), 12)  # the warm-up: a whole prompt, untimed
    blocks = []  # the decodes after it, in runs of one prompt
    for drafter_, prompt, _ in seen[1:]:
        if not blocks or blocks[-1][0] != prompt:
            blocks.append((prompt, []))
        blocks[-1][1].append(drafter_)
    assert [prompt for prompt, _ in blocks] == [(1, 2, 3), (4, 5, 6)] * (len(blocks) // 2)
    assert all(ran.count("none") == 1 and len(ran) >= 2 for _, ran in blocks), blocks
    assert blocks[0][1][0] == "none" and blocks[1][1][0] == drafter  # the order rotated


def test_bench_without_its_extra_stops_before_any_run(monkeypatch, tmp_path, capsys):
    """matplotlib missing: one line naming the extra, before a single prompt is decoded."""
    import sys

    from specdec.cli import main as cli
    from specdec.cli import measure
    from specdec.errors import install_command

    ran = []
    monkeypatch.setattr(measure, "run_bench", lambda *a, **k: ran.append(1) or [])
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    status = cli.main(["bench", "--model", "x", "--out", str(tmp_path / "o")])
    err = capsys.readouterr().err
    assert (
        status != 0
        and not ran
        and install_command("bench") in err
        and len(err.strip().splitlines()) == 1
    )


def test_a_methods_unknown_option_is_refused_before_any_run(monkeypatch, tmp_path, capsys):
    """``--methods redrafter:q=1``: one line naming the options the drafter takes (as
    ``specdec generate`` says it), before the model loads or a prompt is decoded."""
    from specdec.cli import main as cli
    from specdec.cli import measure

    ran = []
    monkeypatch.setattr(measure, "run_bench", lambda *a, **k: ran.append(1) or [])
    argv = ["bench", "--model", "x", "--backends", "numpy", "--out", str(tmp_path / "o")]
    status = cli.main([*argv, "--methods", "plain", "redrafter:q=1"])
    err = capsys.readouterr().err
    assert status == 2 and not ran and len(err.strip().splitlines()) == 1, err
    assert "does not take option(s) ['q']" in err and "beam_width" in err and "verifier" in err


def test_prompt_files_check_category_and_id_and_limit_keeps_the_first(tmp_path):
    """A prompt file's "category" is text and "id" text or a number, refused naming the line;
    ``limit`` keeps the first N prompts (after ``per_category``)."""
    from specdec.bench.prompts import load_prompt_set
    from specdec.errors import InvalidInputError

    good = tmp_path / "good.jsonl"
    good.write_text(
        "\n".join(
            json.dumps({"prompt": f"p{i}", "category": "ab"[i % 2], "id": i}) for i in range(6)
        )
    )
    assert [p.id for p in load_prompt_set(str(good), limit=2)] == ["0", "1"]
    assert [p.id for p in load_prompt_set(str(good), per_category=1, limit=5)] == ["0", "1"]
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "x", "category": 3}\n')
    with pytest.raises(InvalidInputError, match=r"line 1: 'category' must be text, got 3"):
        load_prompt_set(str(bad))


def test_an_uncategorised_prompt_is_counted_once_in_the_total_row(tmp_path):
    """A prompt file's line without "category" was put in category "all", the total row's name,
    and counted twice there; it is "uncategorised" now, and "all" is refused as a category."""
    good = tmp_path / "p.jsonl"
    good.write_text('{"prompt": "a", "category": "x"}\n{"prompt": "b"}\n')
    assert [p.category for p in load_prompt_set(str(good))] == ["x", "uncategorised"]
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "a", "category": "all"}\n')
    with pytest.raises(InvalidInputError, match="total row"):
        load_prompt_set(str(bad))


def test_progress_lines_work_as_a_context_manager(monkeypatch, capsys):
    """Teacher decoding holds its bar in a with block: as lines (not a terminal) it said nothing
    for minutes under tqdm, and the lines must close as the bar does."""
    from specdec import progress as progress_module

    monkeypatch.setattr(progress_module, "LINE_SECONDS", 0.0)
    with progress_module.progress(total=4, desc="teacher train", unit="token") as bar:
        bar.update(2)
    assert bar._closed.is_set()
    assert "teacher train: 2 of 4 tokens done" in capsys.readouterr().err


def test_progress_is_lines_where_stderr_is_not_a_terminal(monkeypatch, capsys):
    """A log file gets lines (no carriage returns), at most one every LINE_SECONDS; a run that is
    not to show progress gets nothing."""
    from specdec import progress as progress_module

    monkeypatch.setattr(progress_module, "LINE_SECONDS", 0.0)
    bar = progress_module.progress(total=3, desc="bench")
    for _ in range(3):
        bar.update(1)
    bar.close()
    assert list(progress_module.progress([1, 2], desc="timing", unit="shape")) == [1, 2]
    err = capsys.readouterr().err
    assert "\r" not in err
    lines = [line.split(",")[0] for line in err.splitlines()]
    assert lines == [f"bench: {i} of 3 runs done" for i in (1, 2, 3)] + [
        f"timing: {i} of 2 shapes done" for i in (1, 2)
    ]
    monkeypatch.setattr(progress_module, "LINE_SECONDS", 3600.0)
    list(progress_module.progress(range(5), desc="quiet"))  # within the minute: silent
    list(progress_module.progress(range(5), desc="off", enabled=False))
    assert capsys.readouterr().err == ""


def test_the_time_left_is_paced_from_the_reset_not_from_the_loading(monkeypatch, capsys):
    """bench said "about 35 min left" of a run that took 2.5: its first run's time held the
    loading and warm-up. The clock restarts when the timed runs begin (``reset``)."""
    from specdec import progress as progress_module

    clock = [0.0]
    monkeypatch.setattr(progress_module, "monotonic", lambda: clock[0])
    monkeypatch.setattr(progress_module, "LINE_SECONDS", 0.0)
    monkeypatch.setattr(progress_module, "BEAT_SECONDS", 3600.0)
    bar = progress_module.progress(total=11, desc="bench")
    clock[0] = 600.0  # ten minutes of loading and warm-up
    bar.reset()
    clock[0] = 660.0  # the first run: one minute
    bar.update(1)
    bar.close()
    # the minutes spent count from the start; the time left from the reset
    assert "bench: 1 of 11 runs done, 11.0 min, about 10.0 min left" in capsys.readouterr().err


def test_progress_lines_come_while_a_unit_takes_longer_than_a_line(monkeypatch, capsys):
    """A tree plan's settings took up to four minutes each on a busy machine, and its lines came
    at 1.0, 3.3, 7.3 and 11.3 minutes against "at least every minute": a heartbeat says how far
    it is (and, once a unit is done, how long the rest should take) while a unit runs, and stops
    at close."""
    import time

    from specdec import progress as progress_module

    monkeypatch.setattr(progress_module, "LINE_SECONDS", 3600.0)
    monkeypatch.setattr(progress_module, "BEAT_SECONDS", 0.05)
    bar = progress_module.progress(total=4, desc="plan: decoding tree settings", unit="setting")
    time.sleep(0.5)  # the first setting decodes
    bar.update(1)
    time.sleep(0.5)  # the second
    bar.close()
    time.sleep(0.2)
    lines = capsys.readouterr().err.splitlines()
    assert lines and lines[0].startswith("plan: decoding tree settings: 0 of 4 settings done"), (
        lines
    )
    assert any("1 of 4 settings done" in line and "min left" in line for line in lines), lines
    time.sleep(0.2)
    assert capsys.readouterr().err == ""  # closed: silent


def test_a_speedup_above_its_tokens_per_step_is_flagged_in_the_table():
    """A bench run whose plain decoding was slowed by other work printed 7.81x at 1.27 tokens per
    step with no word (plan flagged such figures; bench did not)."""
    from specdec.bench.report import markdown

    row = dict(
        backend="torch",
        dtype="bfloat16",
        exact="on",
        temperature=0.0,
        category="all",
        method="redrafter",
        tokens_per_second=50.0,
        speedup_vs_peer=float("nan"),
        verified_per_step=5.0,
        tree_reduction=0.1,
        draft_share=0.1,
        verify_share=0.8,
        other_share=0.1,
        identical=None,
    )
    sound = markdown([{**row, "speedup": 1.2, "tokens_per_step": 1.27}])
    spoilt = markdown([{**row, "speedup": 7.81, "tokens_per_step": 1.27}])
    assert "impossible" not in sound and "busy" not in sound
    assert "7.81 (impossible: above its tokens/step)" in spoilt
    # rows some of whose runs other work slowed say how many (each run has its own clock)
    busy = markdown([{**row, "speedup": 7.81, "tokens_per_step": 1.27, "busy_runs": 3, "runs": 16}])
    assert "| 50.0 (busy: 3 of 16 runs) |" in busy


def test_the_accepted_histogram_counts_drafting_steps_alone():
    """Under auto most steps decode plainly, and they read as "0 accepted": the plot showed how
    often auto declined, not how well the drafter accepts."""
    from specdec.bench.report import accepted_histogram
    from specdec.bench.runner import BenchRecord

    common = dict(
        backend="torch", dtype="float32", temperature=0.0, prompt_id="p", category="c", repeat=0,
        new_tokens=9, seconds=1.0,
    )  # fmt: skip
    records = [
        BenchRecord(method="plain", accepted=(0,) * 8, plain_steps=8, **common),
        # 5 plain steps, then drafting steps that accepted 0, 2 and 1
        BenchRecord(method="auto", accepted=(0,) * 5 + (0, 2, 1), plain_steps=5, **common),
    ]
    assert accepted_histogram(records) == {"auto": {0: 1, 1: 1, 2: 1}}


def test_a_method_that_mostly_decoded_plainly_gets_a_note_saying_why():
    """Auto declined 97% of a method's steps on a machine whose cost curve was measured busy,
    and only bench.json's plain_reasons said why: the notes under the table say it, with how to
    see what drafting every step gives."""
    from specdec.bench.report import plain_notes

    def row(method, share, reasons, category="all"):
        return dict(method=method, backend="torch", temperature=0, category=category,
                    plain_step_share=share, plain_reasons=reasons)  # fmt: skip

    rows = [
        row("plain", float("nan"), {}),
        row("redrafter", 0.97, {"prediction": 200, "measuring": 6}),
        row("lookup", 0.6, {"no draft": 50, "measuring": 3}),
        row("eagle", 0.3, {"prediction": 10}),  # drafted most steps: nothing to say
        row("medusa:speculation=never", 1.0, {"never": 90}),  # asked for: nothing to say
        row("redrafter", 0.97, {"prediction": 20}, category="writing"),  # the total row speaks
    ]
    notes = plain_notes(rows)
    assert notes == [
        "note: redrafter (torch, T=0) decoded 97% of its steps plainly (by reason: 200 "
        "prediction, 6 measuring): mostly auto judged drafting would not pay, from the "
        "drafter's acceptance so far and this machine's step costs; "
        "`redrafter:speculation=always` shows what drafting every step gives",
        "note: lookup (torch, T=0) decoded 60% of its steps plainly (by reason: 50 no draft, "
        "3 measuring): mostly the drafter proposed nothing (prompt lookup finds no match in new "
        "text)",
    ], notes
    # a method with options: the mode joins them (a second colon was refused as a bad option)
    (note,) = plain_notes([row("redrafter:w=2,l=3", 0.9, {"prediction": 90})])
    assert "`redrafter:w=2,l=3,speculation=always` shows" in note, note


def test_bench_and_plan_name_what_kept_the_prompts_few():
    """The few-prompts note told a run with --limit 4 to use --per-category 1 (the default
    already) and one on a file of one's own to use --per-category 2."""
    from types import SimpleNamespace

    from specdec.cli.plan import more_prompts

    def args(**given):
        return SimpleNamespace(**{"limit": None, "prompts": "mt-bench", "per_category": 1, **given})

    assert more_prompts(args(limit=4)) == "drop --limit 4"
    assert more_prompts(args(prompts="mine.jsonl")) == "add prompts to mine.jsonl"
    assert more_prompts(args(per_category=1)) == "--per-category 2"


def test_a_torch_run_on_fewer_threads_than_cores_says_so(monkeypatch):
    import sys

    from specdec.bench import trust

    class Torch:
        threads = 1

        def get_num_threads(self):
            return self.threads

    torch = Torch()
    monkeypatch.setitem(sys.modules, "torch", torch)
    monkeypatch.setattr(trust, "cores", lambda: 2)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    (note,) = trust.thread_notes()
    # pinning the count it took keeps runs comparable (it said OMP_NUM_THREADS=2, against the
    # docs' advice for a machine where another process keeps a core busy)
    assert note.startswith("note: torch computed on 1 thread(s) of 2 cores, chosen at its start")
    assert "(OMP_NUM_THREADS=1 pins it so for every run)" in note
    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # the user's count: said as theirs
    (note,) = trust.thread_notes()
    assert "1 thread(s) of 2 cores, as OMP_NUM_THREADS=1 asks" in note and "chosen" not in note
    torch.threads = 2
    assert trust.thread_notes() == [] and trust.torch_threads() == 2


def test_a_missing_prompt_file_or_an_unwritable_out_is_named_as_such(tmp_path):
    """A missing file was "unknown prompt set ...", and --out's errors were the system's own
    ("/etc/passwd: File exists") without naming --out."""
    from specdec.bench.prompts import load_prompt_set
    from specdec.cli.measure import _bench_out
    from specdec.errors import InvalidInputError

    with pytest.raises(InvalidInputError, match=r"--prompts '\S+nope.jsonl': no such file"):
        load_prompt_set(str(tmp_path / "nope.jsonl"))
    with pytest.raises(InvalidInputError, match=r"is a folder, not a file"):
        load_prompt_set(str(tmp_path))
    with pytest.raises(InvalidInputError, match=r"unknown prompt set 'mtbench'"):
        load_prompt_set("mtbench")
    file = tmp_path / "a-file"
    file.write_text("")
    with pytest.raises(InvalidInputError, match=r"--out '\S+a-file' is a file"):
        _bench_out(file)
    with pytest.raises(InvalidInputError, match=r"--out '\S+' cannot be written"):
        _bench_out(file / "under")
    # the check leaves nothing: not its probe, nor the folders it made (a refused bench left an
    # empty --out behind); a folder that was there stays
    _bench_out(tmp_path / "new" / "out")
    assert not (tmp_path / "new").exists()
    (tmp_path / "there").mkdir()
    _bench_out(tmp_path / "there")
    assert list((tmp_path / "there").iterdir()) == []


def test_a_refused_bench_leaves_no_out_folder(tmp_path, capsys):
    from specdec.cli.main import main

    out = tmp_path / "y"
    argv = ["bench", "--model", "smollm2-135m", "--methods", "plain", "redrafter:foo=1"]
    assert main([*argv, "--limit", "1", "--out", str(out)]) == 2
    assert "foo" in capsys.readouterr().err and not out.exists()


def test_methods_within_five_percent_of_each_other_are_named_as_tied():
    """redrafter 1.25x over lookup 1.24x read as a finding: nothing said that one run's noise
    moves a figure more than that."""
    from specdec.cli.measure import ties_note

    def row(method, speedup, backend="torch", category="all", dtype="float32"):
        return dict(method=method, speedup=speedup, backend=backend, temperature=0.0,
                    category=category, dtype=dtype)  # fmt: skip

    rows = [row("plain", 1.0), row("redrafter", 1.25), row("lookup", 1.24), row("eagle", 1.03)]
    rows += [row("medusa", 0.99), row("x", 1.24, category="writing")]
    (note,) = ties_note(rows)
    assert note == (
        "note: within 5% of each other: redrafter 1.25x and lookup 1.24x; eagle 1.03x and medusa "
        "0.99x; read each pair as tied unless more prompts and --repeats keep its order"
    ), note
    assert ties_note([row("plain", 1.0), row("redrafter", 1.3), row("eagle", 1.1)]) == []
    # on the figures as printed: 1.1505 over 1.0955 is 5.02% apart, printed 1.15x and 1.10x
    assert ties_note([row("redrafter", 1.1505), row("always", 1.0955)]) == [
        "note: within 5% of each other: redrafter 1.15x and always 1.10x; read each pair as "
        "tied unless more prompts and --repeats keep its order"
    ]
    # two dtypes in one grid: compared within each, and each pair says which ("redrafter 1.18x
    # and redrafter 1.18x" compared float32 with bfloat16)
    grid = [row("redrafter", 1.18), row("lookup", 1.30), row("redrafter", 1.18, dtype="bfloat16")]
    grid += [row("lookup", 1.16, dtype="bfloat16")]
    assert ties_note(grid) == [
        "note: within 5% of each other: redrafter 1.18x and lookup 1.16x (torch bfloat16, T=0); "
        "read each pair as tied unless more prompts and --repeats keep its order"
    ]


def test_auto_on_one_repeat_gets_a_note_on_its_spread():
    """A --repeats 1 run with 8 prompt runs had no caution, while auto's figure moves from run
    to run (docs/bench.md, "Auto's own spread")."""
    from specdec.cli.measure import auto_repeat_note

    def row(method, share, category="all"):
        return dict(method=method, category=category, plain_step_share=share)

    rows = [row("plain", float("nan")), row("redrafter", 0.48), row("lookup", 0.81)]
    rows += [row("redrafter:speculation=always", 0.0), row("eagle", 0.99), row("x", 0.5, "math")]
    (note,) = auto_repeat_note(rows, repeats=1)
    assert note.startswith("note: redrafter, lookup decoded under auto on one repeat: "), note
    assert "--repeats 3 shows how far" in note
    assert auto_repeat_note(rows, repeats=3) == []
    assert auto_repeat_note([row("plain", float("nan")), row("eagle", 0.99)], repeats=1) == []


def test_rows_of_two_dtypes_keep_their_exact_modes_and_plain_exact_false_shows_its_cost():
    """With float32 (exact off) and bfloat16 (exact on) in one grid, both float32 rows said
    "on"; and plain:exact=false beside plain read 1.00, its own baseline, where it ran 1.32x."""
    from specdec.bench.report import summarize
    from specdec.bench.runner import BenchRecord

    def record(method, dtype, exact, seconds):
        return BenchRecord(method=method, backend="torch", dtype=dtype, exact=exact,
                           temperature=0.0, prompt_id="p", category="c", repeat=0,
                           new_tokens=10, seconds=seconds, tokens=tuple(range(10)))  # fmt: skip

    records = [
        record("plain", "float32", "off", 1.0), record("redrafter", "float32", "off", 0.8),
        record("plain", "bfloat16", "on", 1.32), record("redrafter", "bfloat16", "on", 1.0),
        record("plain:exact=false", "bfloat16", "off", 1.0),
        record("redrafter:exact=false", "bfloat16", "off", 0.5),
    ]  # fmt: skip
    rows = {(r["dtype"], r["method"]): r for r in summarize(records) if r["category"] == "all"}
    assert [rows["float32", m]["exact"] for m in ("plain", "redrafter")] == ["off", "off"]
    assert [rows["bfloat16", m]["exact"] for m in ("plain", "redrafter")] == ["on", "on"]
    assert rows["bfloat16", "plain:exact=false"]["speedup"] == pytest.approx(1.32)
    assert rows["bfloat16", "redrafter:exact=false"]["speedup"] == pytest.approx(2.0)
    assert rows["bfloat16", "redrafter"]["speedup"] == pytest.approx(1.32)
    assert rows["float32", "redrafter"]["speedup"] == pytest.approx(1.25)


def test_a_category_where_drafting_every_step_ran_far_ahead_of_auto_gets_a_note():
    """Extraction ran 1.05x under auto (93% of its steps plain) and 2.01x drafting every step,
    while the total row showed auto ahead; nothing said so."""
    from specdec.bench.report import auto_behind_notes

    def row(method, category, speedup, plain=0.0, runs=8):
        return dict(method=method, category=category, speedup=speedup, backend="torch",
                    temperature=0.0, plain_step_share=plain, runs=runs)  # fmt: skip

    rows = [
        row("redrafter", "all", 1.15, 0.61), row("redrafter:speculation=always", "all", 1.10),
        row("redrafter", "extraction", 1.05, 0.93),
        row("redrafter:speculation=always", "extraction", 2.01),
        row("redrafter", "writing", 0.95, 0.95),
        row("redrafter:speculation=always", "writing", 1.0),
        row("eagle:w=2", "coding", 1.0, 0.9, runs=1),
        row("eagle:w=2,speculation=always", "coding", 1.3, runs=1),
    ]  # fmt: skip
    notes = auto_behind_notes(rows)
    assert len(notes) == 2, notes
    assert notes[0].startswith(
        "note: in extraction, redrafter:speculation=always ran 2.01x against redrafter's 1.05x "
        "under auto (93% of its steps plain): auto judged drafting would not pay there, from the "
        "acceptance it learnt over the requests before"
    ), notes[0]
    # a row of one run is an example (the few-runs note says so of such rows)
    assert notes[1].startswith(
        "note: in coding (1 run: an example), eagle:w=2,speculation=always ran 1.30x"
    ), notes
    # auto drafted in every step but cut its trees: "0% of its steps plain: auto judged
    # drafting would not pay" read as a contradiction
    cut = [
        dict(row("redrafter", "coding", 1.39, 0.0, runs=1), verified_per_step=3.8),
        dict(row("redrafter:speculation=always", "coding", 1.91, runs=1), verified_per_step=6.4),
    ]
    (note,) = auto_behind_notes(cut)
    assert (
        "(0% of its steps plain): auto drafted in nearly every step but cut its trees to " in note
    )
    assert "(3.8 nodes verified a step against 6.4)" in note and "would not pay there" not in note


def test_the_busy_note_never_calls_quiet_a_run_whose_rows_say_busy():
    """The whole command's share of the cores was fine, so the note said "the machine was
    quiet", while a burst had slowed one run of plain decoding, whose row said (busy: 1 of 3
    runs) and made another method's speedup impossible."""

    from specdec.bench.trust import CpuClock, busy_note
    from specdec.tuning.machine import cores

    quiet = CpuClock()
    quiet.wall, quiet.cpu = 10.0, 10.0 * cores()  # all of the cores, all the time
    note = busy_note(quiet, 1, 4)
    assert note.startswith("note: other work slowed 1 of 4 timed runs"), note
    assert busy_note(quiet, 0, 4) is None


def test_repeats_far_apart_get_a_note_with_their_spread(model_dir, tmp_path):
    """The same method ran 1.05x, 1.25x and 1.13x in three quiet runs of one prompt set, and
    the table showed one figure each time: with --repeats, a spread of 10% or more is said."""
    from specdec.bench.report import spread_notes

    prompts = load_prompt_set("mt-bench", per_category=1)[:1]
    records = run_bench(
        model_dir, prompts, [parse_method("plain"), parse_method("lookup")],
        grid=[("numpy", None)], max_new_tokens=4, repeats=2, progress=False,
    )  # fmt: skip
    total = next(
        r for r in summarize(records) if r["method"] == "lookup" and r["category"] == "all"
    )
    assert len(total["speedup_repeats"]) == 2 and all(v > 0 for v in total["speedup_repeats"])

    def row(values):
        return dict(method="redrafter", category="all", backend="torch", temperature=0.0,
                    speedup_repeats=values)  # fmt: skip

    (note,) = spread_notes([row([1.05, 1.25, 1.13])])
    assert note == (
        "note: redrafter (torch, T=0) ran 1.05-1.25x over its 3 repeats (the table pools "
        "them): read a difference smaller than that spread as noise"
    )
    assert spread_notes([row([1.10, 1.15])]) == [] and spread_notes([row([1.2])]) == []


def test_a_speedup_is_the_ratio_of_the_printed_tok_s_over_repeats():
    """With --repeats 3 the table printed 63.2 tok/s beside plain's 31.2 and a speedup of 1.79x
    (the median of each repeat's speedup, while tok/s was the median of each repeat's tok/s):
    two methods 14% apart in tok/s were then called tied. Both columns now pool the repeats."""
    from specdec.bench.runner import BenchRecord

    common = dict(backend="torch", dtype="float32", temperature=0.0, prompt_id="p", category="c")
    runs = {"plain": (1.0, 1.0, 1.0), "fast": (0.56, 0.5, 0.56)}  # seconds of 10 tokens a repeat
    records = [
        BenchRecord(method=m, repeat=k, new_tokens=10, seconds=s, **common)
        for m, seconds in runs.items()
        for k, s in enumerate(seconds)
    ]
    rows = {r["method"]: r for r in summarize(records) if r["category"] == "all"}
    assert rows["plain"]["tokens_per_second"] == pytest.approx(10.0)
    assert rows["fast"]["tokens_per_second"] == pytest.approx(30 / 1.62)
    assert rows["fast"]["speedup"] == pytest.approx(
        rows["fast"]["tokens_per_second"] / rows["plain"]["tokens_per_second"]
    )
    assert rows["fast"]["speedup_repeats"] == pytest.approx([1 / 0.56, 2.0, 1 / 0.56], abs=1e-3)
