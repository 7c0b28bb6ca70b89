"""The torch backend's compiled attention kernel: what a process says before it waits on the
build (``specdec_torch.kernels``). torch's build is replaced here by a stand-in; the kernel's
results are pinned by test_torch_exact.py."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")  # required when SPECDEC_TEST_BACKENDS names torch (conftest)

from torch.utils import cpp_extension

from specdec_torch import kernels


@pytest.fixture
def build_folder(tmp_path, monkeypatch):
    monkeypatch.setattr(cpp_extension, "_get_build_directory", lambda *a, **k: str(tmp_path))
    monkeypatch.setattr(cpp_extension, "load", lambda **kwargs: "module")
    return tmp_path


@pytest.mark.parametrize(
    "there, said",
    [
        ((), "specdec: compiling the exact attention kernel"),
        (("lock",), "specdec: waiting for another process compiling"),
        (("lock", "{name}.so"), "specdec: waiting for another process compiling"),
        (("{name}.so",), ""),
    ],
)
def test_a_process_says_whether_it_builds_waits_or_loads_the_kernel(
    build_folder, capsys, there, said
):
    """A process that found another's build under way waited on torch's lock with no word (a
    build killed part way leaves the lock, and the wait never ends): it names the lock."""
    for name in there:
        (build_folder / name.format(name=kernels._build_name())).write_text("")
    module, status = kernels._load()
    err = capsys.readouterr().err
    assert module == "module" and err.startswith(said) and bool(err) == bool(said), err
    if "lock" in there:
        assert f"{build_folder / 'lock'}: delete it" in err
    cached = any(name.endswith(".so") for name in there)
    assert status.endswith("(cached)" if cached else "(built now)"), status


def test_each_environment_builds_into_its_own_folder(monkeypatch):
    """Two virtual environments sharing torch's extension cache rebuilt one folder in turn (its
    build file names each one's include paths), each waiting on the other's lock: the folder's
    name carries where torch is installed."""
    import torch

    here = kernels._build_name()
    monkeypatch.setattr(torch, "__file__", "/elsewhere/.venv/lib/torch/__init__.py")
    assert kernels._build_name() != here
