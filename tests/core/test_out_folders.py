"""Commands that write a folder never destroy what they did not write: ``export`` and ``import``
write beside ``--out`` and swap it in whole, refuse the source, the home and working folders, and
``--overwrite`` replaces only a folder an earlier export or import wrote
(``specdec.models.outfolder``); training refuses the same folders."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest

from specdec.cli.main import main
from specdec.errors import InvalidInputError, TrainingOutputError
from specdec.models.outfolder import WRITTEN
from specdec.plugins.export import export, import_drafter
from specdec.training.outdir import claim_out
from specdec_medusa.checkpoint import make_random_medusa
from specdec_redrafter.checkpoint import make_random_redrafter


def _snapshot(folder: Path) -> dict[str, str]:
    """Every path under ``folder`` with the SHA-256 of its bytes (folders as '/')."""
    return {
        str(p.relative_to(folder)): "/"
        if p.is_dir()
        else hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
    }


@pytest.fixture(scope="module")
def medusa(model_dir, tmp_path_factory):
    root = tmp_path_factory.mktemp("out-folders")
    return make_random_medusa(root / "med", model_dir, seed=6, head="full", choices="small8")


@pytest.fixture(scope="module")
def redrafter(model_dir, tmp_path_factory):
    root = tmp_path_factory.mktemp("out-folders-rd")
    return make_random_redrafter(root / "rd", model_dir, seed=3, head="full", beam_width=2)


def _user_folder(path: Path) -> Path:
    path.mkdir(parents=True)
    (path / "README").write_text("keep")
    (path / "notes").mkdir()
    (path / "notes" / "plan.txt").write_text("mine")
    return path


def test_a_refused_export_leaves_out_byte_for_byte(medusa, model_dir, tmp_path, capsys):
    prev = _user_folder(tmp_path / "prev")
    before = _snapshot(prev)
    # vLLM drafts one chain: refused by the layout writer, after --out was checked
    status = main(["export", str(medusa), "--format", "vllm", "--out", str(prev), "--overwrite"])
    assert status != 0 and _snapshot(prev) == before
    # the same with a folder an earlier export wrote: the refusal comes from the writer itself
    ours = tmp_path / "ours"
    export(medusa, "fasterdecoding", ours)
    before = _snapshot(ours)
    with pytest.raises(InvalidInputError, match="choices='chain'"):
        export(medusa, "vllm", ours, overwrite=True)
    assert _snapshot(ours) == before
    assert not [p for p in tmp_path.iterdir() if ".partial-" in p.name or ".old-" in p.name]


def test_overwrite_replaces_only_a_folder_specdec_wrote(medusa, tmp_path):
    prev = _user_folder(tmp_path / "prev")
    before = _snapshot(prev)
    with pytest.raises(InvalidInputError, match="did not write there.*README.*notes"):
        export(medusa, "fasterdecoding", prev, overwrite=True)
    assert _snapshot(prev) == before
    out = tmp_path / "out"
    export(medusa, "fasterdecoding", out)
    assert (out / WRITTEN).is_file()
    result = export(medusa, "vllm", out, overwrite=True, choices="chain")
    assert result.path == out and (out / "config.json").is_file()
    assert str(out) in " ".join(result.commands) and ".partial-" not in " ".join(result.commands)
    (out / "mine.txt").write_text("added by hand")
    with pytest.raises(InvalidInputError, match="mine.txt"):
        export(medusa, "fasterdecoding", out, overwrite=True)
    assert (out / "mine.txt").read_text() == "added by hand"


def test_the_source_and_a_folder_holding_it_are_refused(redrafter, tmp_path):
    project = tmp_path / "project"
    project.mkdir()
    (project / "notes.md").write_text("notes")
    apple = tmp_path / "project" / "apple_rd"
    export(redrafter, "apple", apple)
    before = _snapshot(project)
    for out in (project, apple):
        with pytest.raises(InvalidInputError, match="the source"):
            import_drafter(apple, out, overwrite=True)
        assert _snapshot(project) == before
    with pytest.raises(InvalidInputError, match="is the source"):
        export(redrafter, "apple", redrafter, overwrite=True)
    assert (redrafter / "model.safetensors").is_file()


def test_home_and_working_folder_are_refused(medusa, tmp_path, monkeypatch):
    home = _user_folder(tmp_path / "home")
    monkeypatch.setenv("HOME", str(home))
    work = _user_folder(tmp_path / "work")
    monkeypatch.chdir(work)
    for out, name in ((home, "home"), (work, "working"), (tmp_path, "working")):
        with pytest.raises(InvalidInputError, match=name):
            export(medusa, "fasterdecoding", out, overwrite=True)
    assert (home / "README").is_file() and (work / "README").is_file()
    assert main(["export", str(medusa), "--format", "fasterdecoding", "--out", "."]) != 0
    with pytest.raises(TrainingOutputError, match="working folder"):
        claim_out(".", kind="medusa", settings={}, resume=False, overwrite=True)
    with pytest.raises(TrainingOutputError, match="the source"):
        claim_out(
            medusa, kind="medusa", settings={}, resume=False, overwrite=True, sources=[medusa]
        )
    assert sorted(p.name for p in work.iterdir()) == ["README", "notes"]


def test_a_link_as_out_is_refused(medusa, tmp_path):
    real = _user_folder(tmp_path / "real")
    link = tmp_path / "link"
    os.symlink(real, link)
    with pytest.raises(InvalidInputError, match="is a link"):
        export(medusa, "fasterdecoding", link, overwrite=True)
    assert (real / "README").read_text() == "keep"
