"""The command line, run as a user would."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import attrs
import pytest


def run(*args, env=None):
    import os

    return subprocess.run(
        [sys.executable, "-m", "specdec.cli.main", *args],
        capture_output=True,
        text=True,
        env=None if env is None else {**os.environ, **env},
    )


def test_demo_on_a_random_model():
    done = run("demo", "--random", "--backend", "numpy", "--max-new-tokens", "6", "--repeats", "1")
    assert done.returncode == 0, done.stderr[-2000:]
    # two prompts by default, five drafting methods each, then all prompts together
    assert (
        done.stdout.count("assistant:") == 2
        and done.stdout.count("identical to plain decoding") == 10
    ), done.stdout
    assert len(re.findall(r"; drafted in \d+ of \d+ steps; identical", done.stdout)) == 10
    assert re.search(
        r"all 2 prompts: plain [\d.]+ tokens/s, default [\d.]+ tokens/s \([\d.]+x\)", done.stdout
    ), done.stdout
    # quiet or busy, the demo says which, as bench and plan do (silence read as "not checked")
    assert ("quiet during the timed runs" in done.stdout) != ("other work" in done.stdout)
    one = run(
        "demo",
        "--random",
        "--backend",
        "numpy",
        "--max-new-tokens",
        "4",
        "--repeats",
        "1",
        "--prompt",
        "Hi",
    )
    assert one.returncode == 0 and "user: Hi" in one.stdout and "all " not in one.stdout, one.stdout


def test_generate_from_token_ids(model_dir):
    def generate(ids: str):
        return run(
            "generate",
            "--model",
            str(model_dir),
            "--prompt-ids",
            ids,
            "--drafter",
            "none",
            "--backend",
            "numpy",
            "--max-new-tokens",
            "4",
        )

    done = generate("[1, 2, 3]")
    assert done.returncode == 0, done.stderr[-2000:]
    assert "1.00 tokens/step" in done.stderr, done.stderr
    commas = generate("1,2,3")  # the README's spelling (refused as "not valid JSON" before)
    assert commas.returncode == 0, commas.stderr[-2000:]
    assert commas.stdout == done.stdout


def test_generate_says_what_speculation_chose(model_dir):
    done = run(
        "generate",
        "--model",
        str(model_dir),
        "--prompt-ids",
        "[1, 2, 3, 1, 2, 3, 1, 2]",
        "--drafter",
        "lookup",
        "--backend",
        "numpy",
        "--max-new-tokens",
        "6",
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "decode steps" in done.stderr and "tokens per step" in done.stderr, done.stderr
    # what it decoded with, before it decodes: the dtype, exact mode, the drafter's settings
    setup = done.stderr.splitlines()[:2]
    assert setup[0].startswith("specdec: the numpy backend's own dtype; exact mode"), setup
    assert "drafter 'lookup'" in setup[1] and "draft_length=" in setup[1], setup


def test_generate_a_chat_turn(model_dir, monkeypatch, capsys):
    from specdec.cli import decode
    from specdec.cli import main as cli

    asked = []
    real = decode.begin
    monkeypatch.setattr(
        decode,
        "begin",
        lambda model, prompt, *a, **kw: asked.append(prompt) or real(model, prompt, *a, **kw),
    )
    common = [
        "--model",
        str(model_dir),
        "--drafter",
        "none",
        "--backend",
        "numpy",
        "--max-new-tokens",
        "3",
    ]
    assert cli.main(["generate", "--prompt", "hello there", "--chat", *common]) == 0
    assert cli.main(["generate", "--prompt", "hello there", *common]) == 0
    assert asked == [[{"role": "user", "content": "hello there"}], "hello there"]
    capsys.readouterr()
    refused = run("generate", "--prompt-ids", "[1, 2]", "--chat", *common)
    assert (
        refused.returncode == 2 and "--chat" in refused.stderr and "--prompt TEXT" in refused.stderr
    ), refused.stderr


def test_generate_suggests_chat_where_a_text_prompt_ends_at_once(model_dir, monkeypatch, capsys):
    """An instruct model given plain text often ends at once; nothing said why."""
    from specdec.cli import decode
    from specdec.cli import main as cli

    real = decode.begin
    # the model ends after one token (as an instruct model on plain text does)
    monkeypatch.setattr(decode, "begin", lambda *a, **kw: real(*a, **{**kw, "max_new_tokens": 1}))
    common = ["--model", str(model_dir), "--drafter", "none", "--backend", "numpy"]
    assert cli.main(["generate", "--prompt", "hello", *common, "--max-new-tokens", "8"]) == 0
    assert "add --chat" in capsys.readouterr().err
    assert cli.main(["generate", "--prompt", "hello", "--chat", *common]) == 0
    assert "add --chat" not in capsys.readouterr().err


def test_errors_are_reported_without_a_traceback(model_dir):
    done = run(
        "generate",
        "--model",
        str(model_dir),
        "--prompt-ids",
        "[1, 999]",
        "--drafter",
        "none",
        "--backend",
        "numpy",
    )
    assert (
        done.returncode == 2 and "specdec: error:" in done.stderr and "Traceback" not in done.stderr
    ), done.stderr


def test_generate_with_lookup(model_dir):
    done = run(
        "generate",
        "--model",
        str(model_dir),
        "--prompt-ids",
        "[1, 2, 3, 1, 2, 3]",
        "--drafter",
        "lookup",
        "--backend",
        "numpy",
        "--max-new-tokens",
        "4",
    )
    assert done.returncode == 0, done.stderr[-2000:]
    refused = run(
        "generate",
        "--model",
        str(model_dir),
        "--prompt-ids",
        "[1, 2]",
        "--drafter",
        "none",
        "--lookup",
        "--backend",
        "numpy",
        "--max-new-tokens",
        "4",
    )
    assert refused.returncode == 2 and "drafter='lookup'" in refused.stderr, refused.stderr


def test_generate_with_a_lookup_length(model_dir, tmp_path):
    from specdec.testing import make_random_drafter

    drafter = make_random_drafter(tmp_path / "d", model_dir, kind="redrafter", seed=1)
    args = [
        "generate",
        "--model",
        str(model_dir),
        "--prompt-ids",
        "[1, 2, 3, 1, 2, 3]",
        "--drafter",
        str(drafter),
        "--backend",
        "numpy",
        "--max-new-tokens",
        "4",
        "--beam-width",
        "2",
        "--beam-length",
        "2",
    ]
    done = run(*args, "--lookup-length", "5")
    assert done.returncode == 0, done.stderr[-2000:]
    refused = run(*args, "--lookup-length", "5", "--no-lookup")
    assert refused.returncode == 2 and "drop one of them" in refused.stderr, refused.stderr
    alone = run(
        "generate",
        "--model",
        str(model_dir),
        "--prompt-ids",
        "[1, 2, 3, 1, 2, 3]",
        "--drafter",
        "lookup",
        "--backend",
        "numpy",
        "--max-new-tokens",
        "4",
        "--lookup-length",
        "3",
    )
    assert alone.returncode == 0, alone.stderr[-2000:]


def test_bench_writes_its_outputs(model_dir, tmp_path):
    from specdec.testing import make_random_drafter

    drafter = make_random_drafter(tmp_path / "d", model_dir, kind="redrafter", seed=1)
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(
        '{"prompt": "bada beda", "category": "a"}\n{"prompt": "bida", "category": "b"}\n'
    )
    done = run(
        "bench",
        "--model",
        str(model_dir),
        "--prompts",
        str(prompts),
        "--methods",
        "plain",
        f"redrafter:drafter={drafter},w=2,l=3",
        "--backends",
        "numpy",
        "--max-new-tokens",
        "4",
        "--repeats",
        "1",
        "--warmup",
        "0",
        "--out",
        str(tmp_path / "out"),
    )
    assert done.returncode == 0, done.stderr[-2000:]
    data = json.loads((tmp_path / "out" / "bench.json").read_text())
    methods = sorted({r["method"] for r in data["records"]})
    assert methods == ["plain", f"redrafter:drafter={drafter},w=2,l=3"], methods
    assert len(data["records"]) == 2 * 2 and (tmp_path / "out" / "bench.md").stat().st_size > 0
    # two prompts once each: a figure one run's noise can move, which it says
    assert "note: 2 prompt(s) x 1 repeat(s): one run's noise" in done.stdout, done.stdout
    assert "note: 2 prompt(s) x 1 repeat(s)" in (tmp_path / "out" / "bench.md").read_text()
    assert data["meta"]["runs"] == 4 and 0 <= data["meta"]["quiet_runs"] <= 4


def test_a_command_on_the_numpy_fallback_says_so(monkeypatch):
    """A server installed with its own extra alone measured on the float64 reference for minutes
    with no word: where torch is missing and no backend is named, one line says so."""
    import importlib.util

    from specdec.cli.common import numpy_fallback_note

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "torch" else real(name, *a)
    )
    note = numpy_fallback_note(None)
    assert note.startswith("specdec: torch is not installed, so this runs on the numpy reference")
    assert "torch,hf" in note
    assert numpy_fallback_note("numpy") is None  # named: the user chose it
    monkeypatch.setattr(importlib.util, "find_spec", real)
    assert numpy_fallback_note(None) is None


def test_rows_above_their_tokens_per_step_get_a_note_on_the_terminal():
    """bench.md flagged rows "impossible" where a slowed plain run lifted them, and the terminal,
    showing only the totals (lifted too), said nothing."""
    from specdec.cli.measure import impossible_note

    rows = [
        dict(method="plain", category="extraction", speedup=1.0, tokens_per_step=1.0),
        dict(method="medusa", category="extraction", speedup=2.2, tokens_per_step=1.02),
        dict(method="medusa", category="all", speedup=1.07, tokens_per_step=1.02),
        dict(method="redrafter", category="all", speedup=1.15, tokens_per_step=1.5),
    ]
    (note,) = impossible_note(rows)
    assert note.startswith("note: 1 row(s) measured above their tokens/step (extraction: medusa;")
    assert impossible_note(rows[2:]) == []


def test_rows_per_category_on_few_runs_get_a_note():
    """--per-category 1: each category's row rested on one run, with no word."""
    from specdec.cli.measure import category_note

    (note,) = category_note(["writing", "roleplay", "writing"], 1)
    assert "a row per category rests on as few as 1 run(s)" in note
    assert category_note(["writing", "roleplay"], 8) == []
    assert category_note(["writing"] * 3, 1) == []  # one category: its row is the total's


def test_the_few_runs_note_asks_for_what_the_run_lacked():
    """Two prompts, three repeats: the note asked for --repeats 3 all the same."""
    import types

    from specdec.cli.measure import few_runs_note

    args = types.SimpleNamespace(limit=2, prompts="mt-bench", per_category=1, repeats=3)
    (note,) = few_runs_note(2, args)
    assert "2 prompt(s) x 3 repeat(s)" in note and "(drop --limit 2) before" in note
    (note,) = few_runs_note(2, types.SimpleNamespace(**{**vars(args), "repeats": 1}))
    assert "(drop --limit 2, or --repeats 3) before" in note
    assert few_runs_note(8, args) == []


class _QuietShapeClock:
    """A shape's clock that reads as quiet (the machine running the tests may be busy)."""

    quiet = True

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return None


def _beam_plan_pinned(model_dir, tmp_path, monkeypatch, **decoded):
    """(a random ReDrafter, a one-prompt file) for `specdec plan`, with the figures a random
    drafter would make noise of pinned: every shape timed quiet, generate's W=4 L=5 slower than
    any candidate (the rule: test_tuning.py), the shapes decoded for real but measured 1.3x (one
    below 1.0 is rightly not "recommended": test_plan_where_nothing_beats_plain_decoding...) and
    with ``decoded``'s fields; the cache under ``tmp_path``."""
    from specdec.bench import planner, side_by_side
    from specdec.cli import plan as plan_cli
    from specdec.testing import make_random_drafter

    drafter = make_random_drafter(tmp_path / "d", model_dir, kind="redrafter", seed=1)
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text('{"prompt": "bada beda bida"}\n')
    monkeypatch.setenv("SPECDEC_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(planner, "Measured", _QuietShapeClock)  # each shape's own clock
    monkeypatch.setattr(side_by_side, "Measured", _QuietShapeClock)  # each decode's own clock
    now = planner.Current(beam_width=4, beam_length=5, lookup=True, speedup=0.0)
    monkeypatch.setattr(plan_cli, "measure_current", lambda *a, **k: now)
    decode = plan_cli.measure
    monkeypatch.setattr(
        plan_cli,
        "measure",
        lambda *a, **k: [attrs.evolve(r, measured_speedup=1.3, **decoded) for r in decode(*a, **k)],
    )
    return drafter, prompts


@pytest.mark.parametrize("trusted", [True, False])
def test_plan_recommends_a_configuration(model_dir, tmp_path, monkeypatch, capsys, trusted):
    """The command's plumbing: a table, a recommendation, and the choice kept for generate only
    when ``specdec.bench.trust`` finds nothing against it (its rules: tests/core/test_tuning.py;
    pinned here, as this machine may be busy and a random drafter's figures are noise)."""
    from specdec.bench import planner
    from specdec.cli.main import main

    cache = tmp_path / "cache"  # the recommendation is kept there, not in the user's cache
    drafter, prompts = _beam_plan_pinned(model_dir, tmp_path, monkeypatch)
    reasons = [] if trusted else ["the machine was made busy by this test"]
    monkeypatch.setattr(planner, "reasons_not_to_keep", lambda *a, **k: list(reasons))
    import specdec

    loads, load = [], specdec.load
    monkeypatch.setattr(
        specdec, "load", lambda model, *a, **k: loads.append(model) or load(model, *a, **k)
    )
    status = main(
        [
            "plan",
            "--model",
            str(model_dir),
            "--drafter",
            str(drafter),
            "--backend",
            "numpy",
            "--prompts",
            str(prompts),
            "--widths",
            "1",
            "2",
            "--lengths",
            "2",
            "3",
            "--max-new-tokens",
            "6",
            "--measure-top",
            "1",
        ]
    )
    out, err = capsys.readouterr()
    assert status == 0, err[-2000:]
    recommended = re.search(r"recommended: beam_width=(\d+) beam_length=(\d+)", out)
    assert recommended and recommended.group(1) in ("1", "2") and recommended.group(2) in ("2", "3")
    # the model read from its folder once (each step of the plan loaded it again before)
    assert [m for m in loads if isinstance(m, (str, type(model_dir)))] == [str(model_dir)]
    kept = list((cache / "tuning").glob("plan-numpy-*.json"))
    if not trusted:
        assert not kept and "not saved: the machine was made busy by this test" in out
        # how to use it anyway, on a machine that other work always shares
        by_hand = f"name it per call: --drafter {drafter}:w={recommended.group(1)},l="
        assert by_hand in out and "(generate(..., beam_width=" in out, out
        return
    (kept,) = kept
    assert json.loads(kept.read_text())["options"]["beam_width"] == int(recommended.group(1))
    assert "generate's setting now: beam_width=4 beam_length=5" in out
    assert "plan with --prompts" not in err  # the user's own prompts: no hint
    # generate says that the kept plan set its beams
    args = ["generate", "--model", str(model_dir), "--drafter", str(drafter), "--backend", "numpy"]
    assert main([*args, "--prompt-ids", "1,2,3", "--max-new-tokens", "2"]) == 0
    err = capsys.readouterr().err
    shape = f"beam_width={recommended.group(1)}, beam_length={recommended.group(2)}"
    assert shape in err and "its settings chosen by `specdec plan` here" in err, err


def test_a_beam_shape_decoded_busy_is_marked_in_the_measured_column(
    model_dir, tmp_path, monkeypatch, capsys
):
    """A shape timed quiet and then decoded while other work took the cores had its figure shown
    bare in the measured column: it carries its own mark."""
    from specdec.cli.main import main

    drafter, prompts = _beam_plan_pinned(model_dir, tmp_path, monkeypatch, busy=True)
    args = ["plan", "--model", str(model_dir), "--drafter", str(drafter), "--backend", "numpy"]
    args += ["--prompts", str(prompts), "--widths", "1", "--lengths", "2", "3"]
    assert main([*args, "--max-new-tokens", "6", "--measure-top", "1", "--no-save"]) == 0
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| 1 |")]
    measured = sorted(line.split("|")[-2].strip() for line in rows)  # the last column
    assert measured == ["-", "1.30x (busy: decoded while other work took the cores)"], rows


def test_plan_decodes_generates_shape_once_and_keeps_it_when_no_other_is_faster(
    model_dir, tmp_path, monkeypatch, capsys
):
    """generate's shape among the candidates was decoded twice, its row saying 1.57x and the
    summary 1.59x; then "recommended: beam_width=4 ..." was followed by "not saved", as it was
    no faster than generate's."""
    from specdec.bench import planner
    from specdec.cli import plan as plan_cli
    from specdec.cli.main import main

    def row(width, speedup):
        return planner.PlanRow(
            beam_width=width, beam_length=3, tokens_per_step=2.0, tree_size=5.0, verify_ms=30.0,
            draft_ms=3.0, predicted_speedup=1.5, measured_speedup=speedup,
        )  # fmt: skip

    monkeypatch.setenv("SPECDEC_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(plan_cli, "plan", lambda *a, **k: [row(4, None), row(2, None)])
    monkeypatch.setattr(plan_cli, "measure", lambda *a, **k: [row(4, 1.58), row(2, 1.59)])
    now = planner.Current(beam_width=2, beam_length=3, lookup=True, speedup=0.0)
    monkeypatch.setattr(plan_cli, "current_beams", lambda *a, **k: now)
    monkeypatch.setattr(plan_cli, "measure_current", lambda *a, **k: pytest.fail("again"))
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text('{"prompt": "bada beda bida"}\n')
    argv = ["plan", "--model", str(model_dir), "--drafter", "redrafter", "--backend", "numpy"]
    assert main(argv + ["--prompts", str(prompts), "--measure-top", "2", "--no-save"]) == 0
    out = capsys.readouterr().out
    assert "| 2 | 3 |" in out and "(generate's now) (chosen) | 1.59x |" in out, out
    # the row the choice names is marked: it was the second row, and hard to find
    assert out.count("(chosen)") == 1 and "| 4 | 3 |" in out.split("(chosen)")[0], out
    assert (
        "recommended: beam_width=2 beam_length=3 (measured 1.59x, predicted 1.50x, with the "
        "prompt-lookup beam of 10 tokens): generate's setting now" in out
    ), out

    monkeypatch.setattr(plan_cli, "measure", lambda *a, **k: [row(4, 1.58), row(1, 1.2)])
    monkeypatch.setattr(plan_cli, "measure_current", lambda *a, **k: attrs.evolve(now, speedup=1.6))
    assert main(argv + ["--prompts", str(prompts), "--measure-top", "2", "--no-save"]) == 0
    out = capsys.readouterr().out
    assert (
        "recommended: keep generate's setting now, beam_width=2 beam_length=3, with the "
        "prompt-lookup beam (measured 1.60x); the best other shape decoded: beam_width=4 "
        "beam_length=3 (measured 1.58x" in out
    ), out
    assert "(generate's now) (chosen) | 1.60x |" in out, (
        out
    )  # the figure the advice rests on, in its row
    assert "times their predictions" not in out  # 1.05-1.07 times: close enough to say nothing
    assert "name it per call" not in out and "specdec bench" not in out  # nothing new to use

    # every other shape below plain decoding, generate's above it: keep it, and say nothing of
    # drafting not paying, nor how to use a slower shape per call (both were said)
    monkeypatch.setattr(plan_cli, "measure", lambda *a, **k: [row(1, 0.98), row(4, 0.92)])
    monkeypatch.setattr(
        plan_cli, "measure_current", lambda *a, **k: attrs.evolve(now, speedup=1.05)
    )
    assert main(argv + ["--prompts", str(prompts), "--measure-top", "2", "--no-save"]) == 0
    out = capsys.readouterr().out
    assert "recommended: keep generate's setting now" in out and "(measured 1.05x)" in out, out
    assert "no setting here beat plain decoding" not in out, out
    # predicted 1.50x each, decoded 0.61-0.70 of that: the note says which column to go by
    assert "note: the shapes decoded measured 0.61-0.70 times their predictions" in out, out
    assert "name it per call" not in out and "redrafter:w=1,l=3" not in out, out

    # the best prediction timed busy: not decoded, and the note says why it is missing
    busy = attrs.evolve(row(4, None), predicted_speedup=1.9, busy=True)
    monkeypatch.setattr(plan_cli, "plan", lambda *a, **k: [busy, row(2, None)])
    monkeypatch.setattr(plan_cli, "measure", lambda *a, **k: [row(2, 1.3)])
    assert main(argv + ["--prompts", str(prompts), "--measure-top", "1", "--no-save"]) == 0
    out = capsys.readouterr().out
    assert "note: 1 shape above (marked busy) was timed while other work" in out, out
    assert "quiet during the timed runs" not in out, out  # not beside a shape timed busy
    assert "a shape timed busy was not decoded" in out, out
    assert "the predicted column assumes drafting every step" in out, out


def test_plan_with_every_shape_timed_busy_decodes_the_best_anyway_and_keeps_nothing(
    model_dir, tmp_path, monkeypatch, capsys
):
    """On a machine that other work always shares, every shape is timed busy: the best are
    still decoded beside plain decoding (before, none was, and the measured column stayed
    empty), flagged, and nothing is kept."""
    from specdec.bench import planner
    from specdec.cli import plan as plan_cli
    from specdec.cli.main import main
    from specdec.testing import make_random_drafter

    class BusyShapeClock(_QuietShapeClock):
        quiet = False

    drafter = make_random_drafter(tmp_path / "d", model_dir, kind="redrafter", seed=1)
    monkeypatch.setenv("SPECDEC_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(planner, "Measured", BusyShapeClock)
    decoded = []

    def measure(target, drafter, prompts, rows, **options):  # a figure fixed, not noise
        decoded.extend(rows)
        return [attrs.evolve(r, measured_speedup=0.9, busy=True) for r in rows]

    monkeypatch.setattr(plan_cli, "measure", measure)
    # what generate uses now, not among the shapes: decoded beside them
    now = planner.Current(beam_width=4, beam_length=4, lookup=True, speedup=0.0)
    monkeypatch.setattr(plan_cli, "current_beams", lambda *a, **k: now)
    monkeypatch.setattr(plan_cli, "measure_current", lambda *a, **k: attrs.evolve(now, speedup=0.8))
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text('{"prompt": "bada beda bida"}\n')
    argv = ["plan", "--model", str(model_dir), "--drafter", str(drafter), "--backend", "numpy"]
    argv += ["--prompts", str(prompts), "--widths", "1", "--lengths", "2", "3"]
    assert main(argv + ["--max-new-tokens", "4", "--measure-top", "1"]) == 0
    out, err = capsys.readouterr()
    assert "plan: recording the beams: 1 prompt to do" in err, err
    assert "plan: timing 2 beam shapes in 4 rounds: 8 timings to do" in err, err
    # generate's shape, not among those decoded, is decoded too: a line says so (it counted 3 of
    # 3 shapes and decoded 4)
    assert "plan: decoding generate's setting now, beside them" in err, err
    assert len(decoded) == 1 and decoded[0].busy, decoded
    # every row busy: the mark is short, and one note says what it means
    rows = [line for line in out.splitlines() if line.startswith("| 1 |")]
    assert len(rows) == 2 and all("x (busy) |" in line for line in rows), rows
    assert "| 0.90x |" in out and "while other work" not in "".join(rows), out
    assert "note: every shape above was timed while other work took the cores" in out, out
    assert (
        "best guess (timed while other work took the cores), and slower than plain decoding: "
        in out
    ), out
    assert "note: no setting here beat plain decoding" in out
    assert "no shape was decoded" not in out
    assert "not saved: " in out and not list((tmp_path / "cache").glob("tuning/plan-*.json"))
    # the "not saved" line says why a plan on few prompts keeps nothing; the note, how to keep one
    assert "note: planned on 1 prompt(s); to keep a choice, plan on more (" in out, out
    assert out.count("one run's noise") == 1, out


def test_plan_decodes_a_tree_drafters_settings(model_dir, tmp_path, monkeypatch, capsys):
    from specdec.bench import side_by_side, tree_planner
    from specdec.cli.main import main
    from specdec.testing import make_random_drafter

    drafter = make_random_drafter(tmp_path / "e3", model_dir, kind="eagle3", seed=1)
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text('{"prompt": "bada beda bida"}\n')
    cache = tmp_path / "cache"
    monkeypatch.setenv("SPECDEC_CACHE", str(cache))
    # the trust rules are tests/core/test_tuning.py's; here the machine may be busy
    monkeypatch.setattr(tree_planner, "why_not_kept", lambda *a, **k: [])
    monkeypatch.setattr(side_by_side, "Measured", _QuietShapeClock)  # each setting's clock
    args = ["plan", "--model", str(model_dir), "--drafter", str(drafter), "--backend", "numpy"]
    status = main([*args, "--prompts", str(prompts), "--max-new-tokens", "4"])
    out, err = capsys.readouterr()
    assert status == 0, err[-2000:]
    # a log or a pipe sees what the plan is doing from its start (it said nothing for minutes)
    assert re.search(r"plan: decoding at most \d+ tree settings: \d+ prompts to do", err), err
    table = [line for line in out.splitlines() if line.startswith("| ")][1:]  # header left out
    # what generate uses now, then one option at a time, then lookup (levels past the verified
    # nodes chosen are skipped: all 5 are tried where the 24-node tree measured fastest)
    assert 1 + 6 + 3 + 1 <= len(table) <= 1 + 6 + 5 + 3 + 1, out
    speedups = [float(line.split("|")[5].strip().split("x")[0]) for line in table]
    flagged = ["impossible" in line for line in table]
    assert flagged == sorted(flagged), "impossible figures last"
    plausible = [v for v, f in zip(speedups, flagged) if not f]
    assert plausible == sorted(plausible, reverse=True), "best first"
    recommended = re.search(
        r"(?:recommended|fastest found, but (?:slower than|within 5% of) plain decoding): (.*), "
        r"lookup (on|off)",
        out,
    )
    (kept,) = (cache / "tuning").glob("plan-numpy-*.json")
    plan = json.loads(kept.read_text())
    assert recommended and plan["lookup"] == (recommended.group(2) == "on"), out
    assert set(plan["options"]) <= {"total_tokens", "depth", "tree_top_k"}
    given = " ".join(f"{k}={v}" for k, v in sorted(plan["options"].items())) or "its defaults"
    assert recommended.group(1) == given


def _plan_tree_printing(rows, model_dir, tmp_path, monkeypatch, capsys) -> str:
    """What ``specdec plan --no-save`` prints for an EAGLE-3 checkpoint whose tree plan decoded
    ``rows`` (the planner pinned to them: its figures, not this machine's)."""
    from specdec.cli import plan as plan_cli
    from specdec.cli.main import main
    from specdec.testing import make_random_drafter

    monkeypatch.setattr(plan_cli, "plan_tree", lambda *a, **k: rows)
    drafter = make_random_drafter(tmp_path / "e3", model_dir, kind="eagle3", seed=1)
    args = ["plan", "--model", str(model_dir), "--drafter", str(drafter), "--backend", "numpy"]
    assert main([*args, "--no-save"]) == 0
    return capsys.readouterr().out


def test_plan_where_nothing_beats_plain_decoding_recommends_nothing_and_keeps_nothing(
    model_dir, tmp_path, monkeypatch, capsys
):
    """Every setting decoded slower than plain decoding (an AVX2-only CPU): the plan printed
    "recommended: depth=2 ... (measured 0.68x ...)"."""
    from specdec.bench import trust
    from specdec.bench.tree_planner import TreePlanRow

    rows = [
        TreePlanRow(options={"depth": 2}, lookup=False, tokens_per_step=1.1, nodes_per_step=5.0,
                    speedup=0.68),
        TreePlanRow(options={}, lookup=None, tokens_per_step=1.1, nodes_per_step=9.0,
                    speedup=0.6, current=True),
    ]  # fmt: skip
    out = _plan_tree_printing(rows, model_dir, tmp_path, monkeypatch, capsys)
    assert "recommended" not in out, out
    assert "fastest found, but slower than plain decoding: depth=2, lookup off" in out, out
    from specdec.cli.plan import _recommended

    # a lead over plain decoding within one plan's noise is not called a recommendation
    assert _recommended(False, 1.02) == "fastest found, but within 5% of plain decoding"
    assert _recommended(False, 1.3) == "recommended"
    assert "note: no setting here beat plain decoding" in out
    # nothing to use per call, nor to check with bench: auto already decodes plainly there
    assert "not saved (--no-save)\n" in out and "name it per call" not in out, out
    assert "specdec bench" not in out, out
    # what the figures are (always drafting)
    assert 'decoded with speculation="always"' in out
    assert "its 0.68x is slower than plain decoding" in trust.reasons_not_to_keep(
        trust.Measured(), 0.68, 1.1
    )


@pytest.mark.parametrize("every", [True, False])
def test_tree_rows_decoded_busy_say_so_once_where_every_row_is(
    model_dir, tmp_path, monkeypatch, capsys, every
):
    """A tree plan run beside other work repeated "(busy: decoded while other work took the
    cores)" on each of its rows: where every row is busy, the mark is short and one note says it;
    where some are, each busy row says it in words."""
    from specdec.bench.tree_planner import TreePlanRow

    rows = [
        TreePlanRow(options={"depth": d}, lookup=False, tokens_per_step=1.5, nodes_per_step=d,
                    speedup=1.2 - d / 100, busy=every or d == 3)
        for d in (2, 3)
    ]  # fmt: skip
    from specdec.cli import plan as plan_cli

    monkeypatch.setattr(plan_cli, "busy_line", lambda clock: None)  # the whole run quiet
    out = _plan_tree_printing(rows, model_dir, tmp_path, monkeypatch, capsys)
    # plan says the machine was quiet, as bench does (it said nothing either way)
    assert 'note: no other work took the cores during the timed runs (docs/bench.md, "A' in out, out
    table = [line for line in out.splitlines() if line.startswith("| depth")]
    marks = ["(busy: decoded while other work took the cores)" in line for line in table]
    assert marks == ([False, False] if every else [False, True]), table
    assert [line.endswith("x (busy) |") for line in table] == (
        [True, True] if every else [False] * 2
    )
    note = "note: every setting above was decoded while other work took the cores"
    assert (note in out) == every, out


def test_plan_marks_tree_settings_that_decoded_the_same_trees(
    model_dir, tmp_path, monkeypatch, capsys
):
    """total_tokens=12, 16 and 24 decoded the same 14.2 nodes a step where the tree's top-k and
    depth capped it, and measured speeds 8% apart: rows a reader took for different settings."""
    from specdec.bench.tree_planner import TreePlanRow
    from specdec.cli import plan as plan_cli
    from specdec.cli.main import main
    from specdec.testing import make_random_drafter

    def row(speedup, tokens, **options):
        return TreePlanRow(
            options=options, lookup=True, tokens_per_step=tokens, nodes_per_step=14.2,
            speedup=speedup,
        )  # fmt: skip

    rows = [row(1.52, 1.92, total_tokens=16), row(1.45, 1.80, total_tokens=8)]
    rows.append(row(1.40, 1.92, total_tokens=24))
    monkeypatch.setattr(plan_cli, "plan_tree", lambda *a, **k: rows)
    drafter = make_random_drafter(tmp_path / "e3", model_dir, kind="eagle3", seed=1)
    args = ["plan", "--model", str(model_dir), "--drafter", str(drafter), "--backend", "numpy"]
    assert main([*args, "--no-save"]) == 0
    table = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| total")]
    assert [
        ("the same tokens and nodes per step as total_tokens=16, lookup yes)" in line)
        for line in table
    ] == [
        False,
        False,
        True,
    ], table  # named with its lookup: rows of the same settings can differ by it alone


def test_plan_of_a_drafter_without_beams_or_tree_settings_says_so(model_dir, tmp_path, capsys):
    """It said "drafter 'lookup' does not take option(s) ['beam_length', 'beam_width']": true, but
    not that plan chooses beams or tree settings only."""
    from specdec.cli.main import main

    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text('{"prompt": "bada beda bida"}\n')
    args = ["plan", "--model", str(model_dir), "--drafter", "lookup", "--backend", "numpy"]
    assert main([*args, "--prompts", str(prompts)]) == 2
    err = capsys.readouterr().err
    # the drafters it can plan, by name (it named spec fields, as redrafter's and eagle's)
    assert "drafter 'lookup' has neither" in err, err
    assert "give one of eagle, eagle3, " in err and "redrafter" in err, err


def test_plan_on_a_shipped_prompt_set_says_to_plan_on_ones_own(model_dir, tmp_path):
    from specdec.testing import make_random_drafter

    drafter = make_random_drafter(tmp_path / "d", model_dir, kind="redrafter", seed=1)
    done = run(
        "plan",
        "--model",
        str(model_dir),
        "--drafter",
        str(drafter),
        "--backend",
        "numpy",
        "--prompts",
        "mt-bench",
        "--per-category",
        "1",
        "--limit",
        "2",
        "--widths",
        "1",
        "--lengths",
        "2",
        "--max-new-tokens",
        "2",
        "--measure-top",
        "0",
        "--no-save",
        env={"SPECDEC_CACHE": str(tmp_path / "cache")},
    )
    assert done.returncode == 0, done.stderr[-2000:]
    # two prompts are two kinds of text: the note names them
    assert "note: planned on 2 prompt(s) (writing, roleplay): one run's noise" in done.stdout
    assert (
        "planned on the mt-bench prompts" in done.stderr and "--prompts FILE.jsonl" in done.stderr
    )


def test_the_demo_marks_a_method_slowed_by_other_work_or_faster_than_it_can_be():
    """On a busy machine the demo printed "eagle: 1.00 tokens/step ... 1.18x plain; drafted in 0
    of 83 steps" and "medusa: ... 0.16x plain" with one note at the very end: each line now
    carries bench's marks."""
    from types import SimpleNamespace

    from specdec.cli.decode import _flags

    def result(tps, tau):
        return SimpleNamespace(stats=SimpleNamespace(tokens_per_second=tps, tokens_per_step=tau))

    plain = result(10.0, 1.0)
    assert _flags(result(11.8, 1.0), plain, 0, 3) == " (impossible: above its tokens/step)"
    assert _flags(result(1.6, 1.02), plain, 2, 3) == " (busy: 2 of 3 runs)"
    assert _flags(result(15.0, 1.9), plain, 0, 3) == ""
    assert _flags(plain, plain, 1, 3) == " (busy: 1 of 3 runs)"


def test_the_demo_says_why_a_method_decoded_mostly_plainly(monkeypatch):
    """The demo's lines said "drafted in 7 of 80 steps" and nothing of why; bench's note says it,
    with the bench command that shows what drafting every step gives."""
    from collections import Counter

    from specdec.cli.decode import _bench_hint, _plain_notes
    from specdec.errors import install_command

    steps = {
        "plain": Counter({"decode steps": 80}),
        "default": Counter({"prediction": 60, "measuring": 13, "decode steps": 80}),
        "lookup": Counter({"no draft": 10, "decode steps": 80}),  # drafted in most: no note
    }
    (note,) = _plain_notes(steps, "torch")
    assert note.startswith(
        "note: default (torch, T=0) decoded 91% of its steps plainly (by reason: 60 prediction, "
        "13 measuring): mostly auto judged drafting would not pay"
    ), note
    assert "default:speculation=always" not in note  # not a method bench knows
    hint = "specdec bench --model smollm2-135m --per-category 1 --max-new-tokens 128 --repeats 1 "
    hint += "--methods plain redrafter redrafter:speculation=always --backends torch (docs/bench.md"
    import importlib.util

    # the demo's answer length; the install line only where bench's extra is missing (the
    # demo's setup has torch, hf only; it read so after the extra was installed too)
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    assert _bench_hint("torch", "smollm2-135m", 128).endswith(
        f"{hint}; bench needs the bench extra: {install_command('bench')})"
    )
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: object())
    assert _bench_hint("torch", "smollm2-135m", 128).endswith(f"{hint})")
    quiet = {"default": Counter({"prediction": 3, "decode steps": 80})}
    assert _plain_notes(quiet, "torch") == []


def test_the_demos_notes_go_with_the_prompt_whose_steps_they_count(monkeypatch, capsys):
    """Over both prompts, prompt lookup "decoded 52% of its steps plainly ... mostly its drafting
    steps delivered fewer tokens per second than plain steps", printed beside its 1.19x on the
    second prompt, where it drafted 47 of 50 steps: the plain steps were all the first prompt's.
    Each prompt's notes now follow its own lines, and the bonus token is said once."""
    import attrs

    import specdec
    from specdec.cli import main as cli

    real = specdec.generate

    def generate(target, prompt, *, drafter, **kwargs):
        result = real(target, prompt, drafter=drafter, **kwargs)
        first = prompt[0]["content"] == "one"
        if drafter != "lookup" or kwargs.get("max_new_tokens") == 4:  # the warm-up: as it is
            return result
        stats = result.stats
        decode = stats.decode_row_steps
        reasons = {"realized": decode} if first else {}  # plain in every step of the first
        drafting = 0 if first else decode
        stats = attrs.evolve(stats, plain_reasons=reasons, drafting_row_steps=drafting)
        return attrs.evolve(result, stats=stats)

    monkeypatch.setattr(specdec, "generate", generate)
    argv = ["demo", "--random", "--backend", "numpy", "--repeats", "1", "--max-new-tokens", "6"]
    assert cli.main([*argv, "--prompt", "one", "--prompt", "two"]) == 0
    out = capsys.readouterr().out
    first, second = out.split("user: two")
    note = "note: lookup (numpy, T=0) decoded 100% of its steps plainly"
    assert note in first and "note: lookup" not in second, out
    assert "(bonus token counted)" not in out and "tokens/step counts the bonus token" in out


def test_a_tree_plan_whose_best_decodes_generates_own_trees_says_keep_them(
    model_dir, tmp_path, monkeypatch, capsys
):
    """The best setting (1.08x) decoded the same tokens and nodes per step as generate's own
    (0.71x): the same trees, apart by noise; the plan still told the user to switch to it."""
    from specdec.bench.tree_planner import TreePlanRow

    rows = [
        TreePlanRow(options={"total_tokens": 6}, lookup=True, tokens_per_step=1.62,
                    nodes_per_step=8.1, speedup=1.08),
        TreePlanRow(options={}, lookup=None, tokens_per_step=1.62, nodes_per_step=8.1,
                    speedup=0.71, current=True),
    ]  # fmt: skip
    out = _plan_tree_printing(rows, model_dir, tmp_path, monkeypatch, capsys)
    assert "the same trees: keep generate's setting" in out, out
    assert "name it per call" not in out and "specdec bench" not in out, out


def test_the_demos_total_line_says_which_figures_a_row_marked_impossible_lifted(
    monkeypatch, capsys
):
    """Plain decoding's one run of the first prompt ran slow: medusa's row there was marked
    impossible (1.63x at 1.02 tokens/step), and the total line under both prompts still said
    "medusa 43.5 tokens/s (1.28x)" with no word."""
    import attrs

    import specdec
    from specdec.cli import main as cli
    from specdec.cli.decode import IMPOSSIBLE_NOTE, REPEATS_HINT

    real = specdec.generate

    def generate(target, prompt, *, drafter, **kwargs):
        result = real(target, prompt, drafter=drafter, **kwargs)
        if drafter != "none" or prompt[0]["content"] != "one" or kwargs["max_new_tokens"] == 4:
            return result
        stats = attrs.evolve(result.stats, time_verify=100 * result.stats.time_total)  # slowed
        return attrs.evolve(result, stats=stats)

    monkeypatch.setattr(specdec, "generate", generate)
    argv = ["demo", "--random", "--backend", "numpy", "--repeats", "1", "--max-new-tokens", "6"]
    assert cli.main([*argv, "--prompt", "one", "--prompt", "two"]) == 0
    out = capsys.readouterr().out
    (total,) = [line for line in out.splitlines() if line.startswith("all 2 prompts:")]
    assert "plain" in total and "lifted" not in total.split(",")[0], total
    assert total.count(", lifted by a row marked impossible)") == total.count("x"), total
    assert IMPOSSIBLE_NOTE + REPEATS_HINT in out, out
