"""Every hostile model and drafter folder of ``specdec.testing.hostile`` makes ``specdec generate``
(and ``specdec import`` for drafters) fail with one line on stderr that names the file or field,
never a traceback, on every backend under test."""

from __future__ import annotations


import pytest

import specdec
from specdec.cli.main import main
from specdec.errors import InvalidInputError
from specdec.testing import make_random_drafter
from specdec.testing.hostile import DRAFTER_CASES, MODEL_CASES, hostile_drafters, hostile_models

# what each case's line must say: the file or field it names
MODEL_SAYS = {
    "truncated weights": "model.safetensors is damaged",
    "a weights header of 2**60 bytes": "model.safetensors is damaged",
    "config.json not JSON": "config.json is not valid JSON",
    "config.json a list": "config.json holds a JSON list",
    "ten million layers": "num_hidden_layers=10000000",
    "hidden_size as text": "hidden_size must be an integer",
    "zero attention heads": "num_attention_heads must be a positive integer",
    "a negative vocabulary": "vocab_size must be a positive integer",
    "an unknown rope type": "'warp-drive'",
    "tokenizer.json not JSON": "tokenizer.json could not be read",
    "weights linked out of the folder": "model.safetensors is damaged",
    "a pickle instead of safetensors": "no weights in",
    "int8 weights": "is stored as I8",
    "a missing tensor": "lack tensor 'model.embed_tokens.weight'",
}
DRAFTER_SAYS = {
    "truncated weights": "model.safetensors is damaged",
    "a weights header of 2**60 bytes": "model.safetensors is damaged",
    "config.json not JSON": "config.json is not valid JSON",
    "an unknown model_type": "'warp_drive'",
    "beams of 100,000": "drafts trees of up to",
    "beam_width as text": "beam_width must be a positive integer",
    "weights linked out of the folder": "model.safetensors is damaged",
    "a pickle instead of safetensors": "model.safetensors is missing",
    "NaN weights": "holds NaN or infinite values",
    "a missing tensor": "missing ['head_proj.weight']",
    "a tensor of the wrong shape": "wrong shapes ['head_proj.weight",
}
IMPORT_SAYS = {
    **DRAFTER_SAYS,
    "config.json not JSON": "is not a drafter checkpoint specdec knows",
    "an unknown model_type": "is not a drafter checkpoint specdec knows",
    "beams of 100,000": "config.json (a redrafter drafter) drafts trees of up to",
}


def test_every_case_has_its_expected_line():
    assert set(MODEL_SAYS) == set(MODEL_CASES) and set(DRAFTER_SAYS) == set(DRAFTER_CASES)


@pytest.fixture(scope="module")
def folders(model_dir, tmp_path_factory):
    root = tmp_path_factory.mktemp("hostile")
    drafter = make_random_drafter(root / "redrafter", model_dir, kind="redrafter", seed=0)
    return (
        hostile_models(model_dir, root / "models"),
        hostile_drafters(drafter, root / "drafters"),
        root,
    )


def one_line_error(capsys, argv) -> str:
    code = main(argv)
    captured = capsys.readouterr()
    err = captured.err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and err.startswith("specdec: error: "), (
        argv,
        code,
        captured,
    )
    assert "Traceback" not in captured.out + captured.err
    return err


@pytest.mark.parametrize("backend", ["numpy", "torch", "mlx"])
@pytest.mark.parametrize("case", sorted(MODEL_CASES))
def test_a_hostile_model_folder_is_one_line(folders, capsys, backend, case):
    pytest.importorskip({"numpy": "numpy", "torch": "torch", "mlx": "mlx.core"}[backend])
    err = one_line_error(
        capsys,
        [
            "generate",
            "--model",
            str(folders[0][case]),
            "--prompt",
            "hi",
            "--drafter",
            "none",
            "--backend",
            backend,
            "--dtype",
            "float32" if backend != "numpy" else "float64",
            "--max-new-tokens",
            "2",
        ],
    )
    assert MODEL_SAYS[case] in err, err


@pytest.mark.parametrize("backend", ["numpy", "torch", "mlx"])
@pytest.mark.parametrize("case", sorted(DRAFTER_CASES))
def test_a_hostile_drafter_folder_is_one_line(model_dir, folders, capsys, backend, case):
    pytest.importorskip({"numpy": "numpy", "torch": "torch", "mlx": "mlx.core"}[backend])
    err = one_line_error(
        capsys,
        [
            "generate",
            "--model",
            str(model_dir),
            "--prompt",
            "hi",
            "--drafter",
            str(folders[1][case]),
            "--backend",
            backend,
            "--dtype",
            "float32" if backend != "numpy" else "float64",
            "--max-new-tokens",
            "2",
        ],
    )
    assert DRAFTER_SAYS[case] in err, err


@pytest.mark.parametrize("case", sorted(DRAFTER_CASES))
def test_import_of_a_hostile_drafter_folder_is_one_line(folders, capsys, case):
    out = folders[2] / "imported" / folders[1][case].name
    err = one_line_error(capsys, ["import", str(folders[1][case]), "--out", str(out)])
    assert IMPORT_SAYS[case] in err, err
    assert not out.exists()


def test_a_tree_larger_than_a_slot_is_refused_before_anything_is_measured(
    target, folders, monkeypatch
):
    """Beams of 100,000 can never fit a slot: refused before exact mode's decoding guard measures
    trees (which printed a "measuring ..." line before the error on a machine without that
    measurement cached)."""
    import specdec.generation.components as components

    def measured(*args, **kwargs):
        raise AssertionError("the guard measured before the tree size was refused")

    monkeypatch.setattr(components, "guard_exact_mode", measured)
    with pytest.raises(InvalidInputError, match="drafts trees of up to .* larger capacity"):
        specdec.generate(
            target, [1, 2], drafter=str(folders[1]["beams of 100,000"]), max_new_tokens=2
        )
