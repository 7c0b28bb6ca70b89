"""Messages and listings say what applies to the drafter or setup at hand: the tree settings of a
tree drafter, a busy target without internal thread names, a backend whose framework is missing,
the export's stored type, and train options the drafter takes."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest
from safetensors import safe_open

import specdec
from specdec.errors import install_command
from specdec.cli.main import main
from specdec.plugins import support
from specdec.plugins.export import export, import_drafter, stored_dtype
from specdec.plugins.registry import default_registry
from specdec.testing import make_random_drafter


def test_an_eagle_tree_too_large_for_the_slot_names_eagles_tree_settings(model_dir, tmp_path):
    eagle = make_random_drafter(tmp_path / "eagle", model_dir, kind="eagle", seed=1)
    target = specdec.load(model_dir, backend="numpy", slots=1, capacity=32)
    with pytest.raises(specdec.InvalidInputError) as raised:
        specdec.generate(
            target,
            [1, 2, 3],
            drafter=str(eagle),
            backend="numpy",
            total_tokens=30,
            max_new_tokens=4,
        )
    message = str(raised.value)
    assert "trees of up to 41 nodes" in message, message  # 31, and the 10-token lookup beam
    assert "total_tokens" in message and "depth" in message and "tree_top_k" in message, message
    assert "--no-lookup" in message, message
    assert "beam-width" not in message and "beam_width" not in message, message
    with pytest.raises(specdec.InvalidInputError) as raised:
        specdec.generate(
            target,
            [1, 2, 3],
            drafter=str(eagle),
            backend="numpy",
            total_tokens=30,
            lookup=False,
            max_new_tokens=4,
        )
    message = str(raised.value)
    assert "trees of up to 31 nodes" in message and "total_tokens" in message, message
    assert "lookup" not in message and "beam-width" not in message, message


def test_a_busy_target_is_described_without_internal_thread_names(target):
    first = specdec.stream(target, [5, 6, 7], drafter="none", backend="numpy", max_new_tokens=4)
    next(first)
    try:
        with pytest.raises(specdec.TargetBusyError) as raised:
            specdec.generate(target, [1, 2], drafter="none", backend="numpy", max_new_tokens=2)
    finally:
        first.close()
    message = str(raised.value)
    assert "an earlier generation on it is still running" in message, message
    assert "MainThread" not in message and "specdec-compute" not in message, message


def test_plugins_lists_a_backend_whose_framework_is_missing_with_the_extra(monkeypatch, capsys):
    frameworks = {**support.FRAMEWORKS, "mlx": (("specdec_no_such_framework",), "mlx")}
    monkeypatch.setattr(support, "FRAMEWORKS", frameworks)
    rows = default_registry().describe()
    mlx = [r for r in rows if r["kind"] == "backend" and r["name"] == "mlx"]
    if not mlx:
        pytest.skip("the mlx backend plugin is not registered here")
    assert mlx[0]["install"] == install_command("mlx")
    numpy_rows = [r for r in rows if r["kind"] == "backend" and r["name"] == "numpy"]
    assert numpy_rows[0]["install"] is None
    assert main(["plugins"]) == 0
    lines = capsys.readouterr().out.splitlines()
    listed = [line for line in lines if line.strip().startswith("mlx ")]
    assert listed and listed[0].endswith(f"NOT INSTALLED: {install_command('mlx')}"), lines
    assert all("NOT INSTALLED" not in line for line in lines if "[numpy]" in line), lines
    # the components registered for it: no line of their own, the backend marked in their list
    # (each took a line with the install command: 11 lines for mlx)
    assert sum("NOT INSTALLED" in line for line in lines) == 1, lines
    redrafter = [line for line in lines if line.strip().startswith("redrafter [")]
    assert len(redrafter) == 1 and "mlx (not installed)" in redrafter[0], lines


def _dtypes(folder) -> set[str]:
    with safe_open(str(folder / "model.safetensors"), framework="np") as handle:
        return {
            handle.get_slice(name).get_dtype()
            for name in handle.keys()
            if len(handle.get_slice(name).get_shape()) == 2
        }


def test_export_and_import_keep_a_float16_checkpoint_in_float16_by_default(model_dir, tmp_path):
    from specdec_eagle3.checkpoint import load_eagle3_checkpoint, save_eagle3

    source = make_random_drafter(
        tmp_path / "eagle3", model_dir, kind="eagle3", seed=2, hidden_layers=(0, 0, 1)
    )
    config, weights = load_eagle3_checkpoint(source)
    half = save_eagle3(tmp_path / "half", config, weights, dtype=np.float16)
    assert stored_dtype(half) == "float16" and stored_dtype(source) == "float32"
    # a training run's folder: its float32 trainer state is not the checkpoint's weights
    from safetensors.numpy import save_file

    save_file(
        {"adam.exp_avg": np.zeros((4, 4), np.float32)}, str(half / "trainer_state.safetensors")
    )
    assert stored_dtype(half) == "float16"
    result = export(str(half), "speculators", tmp_path / "out16")
    assert _dtypes(result.path) == {"F16"}
    assert not any("rounding" in note for note in result.notes), result.notes
    assert _dtypes(export(str(source), "speculators", tmp_path / "out32").path) == {"F32"}
    assert _dtypes(export(str(half), "speculators", tmp_path / "wide", dtype="float32").path) == {
        "F32"
    }
    back = import_drafter(result.path, tmp_path / "back")
    assert _dtypes(back.path) == {"F16"}
    assert json.loads((back.path / "config.json").read_text())["model_type"] == "specdec_eagle3"


def test_train_help_lists_shortlist_only_for_drafters_that_take_it(capsys):
    """EAGLE-3 refuses --shortlist (its draft vocabulary is --draft-vocab): its help does not
    list it; ReDrafter's does."""
    listed = {}
    for drafter in ("eagle3", "redrafter"):
        with pytest.raises(SystemExit):
            main(["train", drafter, "--help"])
        listed[drafter] = "--shortlist" in capsys.readouterr().out
    assert listed == {"eagle3": False, "redrafter": True}


def test_written_weights_are_readable_by_others_as_the_umask_allows(model_dir, tmp_path):
    """safetensors' writer makes 0600 files; a checkpoint and an export get the mode a plain
    open gives (0666 less the umask), so a server running as another user can read them."""
    import os
    import stat

    mask = os.umask(0o022)
    try:
        source = make_random_drafter(
            tmp_path / "eagle3", model_dir, kind="eagle3", seed=2, hidden_layers=(0, 0, 1)
        )
        result = export(str(source), "speculators", tmp_path / "out")
        for path in (source / "model.safetensors", result.path / "model.safetensors"):
            assert stat.S_IMODE(os.stat(path).st_mode) == 0o644, path
    finally:
        os.umask(mask)


def test_the_install_hint_is_the_setup_script_in_a_checkouts_own_venv(monkeypatch):
    """In a source checkout's .venv the setup script (which pins torch's CPU build) installs an
    extra; anywhere else pip does."""
    root = Path(specdec.errors.__file__).resolve().parents[1]
    monkeypatch.setattr(sys, "prefix", str(root / ".venv"))
    assert install_command("serve") == f"bash scripts/setup.sh serve (in {root})"
    monkeypatch.setattr(sys, "prefix", "/somewhere/else")
    assert install_command("serve") == "pip install 'specdec[serve]'"


def test_help_states_each_valued_default_once(capsys, monkeypatch):
    """Every option with a value for its default says it in --help (plan's widths, lengths
    and top N had none), and an option whose own words give the default is not told twice."""
    monkeypatch.setenv("COLUMNS", "300")  # argparse wraps to the terminal: one line per option
    with pytest.raises(SystemExit):
        main(["plan", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    for shown in ("to try (default 1 2 4 8)", "to try (default 2 3 4 5 6)", "compare (default 3)"):
        assert shown in text, shown
    with pytest.raises(SystemExit):
        main(["bench", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert text.count("default bench-out") == 1 and "(default False)" not in text


@pytest.mark.parametrize(
    "argv",
    [
        ["bench", "--model", "x", "--repeats", "0"],
        ["bench", "--model", "x", "--max-new-tokens", "-1"],
        ["bench", "--model", "x", "--limit", "0"],
        ["plan", "--model", "x", "--widths", "0"],
        ["plan", "--model", "x", "--per-category", "0"],
    ],
)
def test_counts_below_one_are_refused_by_their_flag_before_any_work(argv, capsys):
    """``bench --repeats 0`` loaded, warmed up, then died in the plot with a traceback;
    ``plan --widths 0`` loaded the model before refusing ``beam_width=0``."""
    with pytest.raises(SystemExit) as raised:
        main(argv)
    err = capsys.readouterr().err
    assert raised.value.code == 2 and f"argument {argv[3]}: must be 1 or more" in err, err
