"""MLX on Linux gets the pip package's OpenBLAS (the mlx extra's ``ngsolve-openblas``), else the
system's, else a one-line hint (``specdec_mlx.blas``)."""

from __future__ import annotations

import platform
import subprocess
import sys

import pytest

pytest.importorskip("mlx.core")

from specdec_mlx import blas  # noqa: E402

PROBE = """
import sys
import specdec.plugins.registry
registry = specdec.plugins.registry.default_registry()
from specdec_mlx.blas import _mapped_openblas
assert "mlx.core" not in sys.modules and not _mapped_openblas(), (
    "OpenBLAS loaded before the mlx backend was asked for"
)
registry.get("backend", "mlx").factory()   # asking for the mlx backend loads OpenBLAS, then mlx
import mlx.core as mx
from specdec_mlx.blas import _state, blas_hint
mapped = _mapped_openblas()
print(repr((_state["loaded"], mapped, blas_hint())))
"""

PRODUCT = """
import numpy as np
rng = np.random.default_rng(0)
a, w = rng.normal(size=(16, 64)).astype(np.float32), rng.normal(size=(64, 48)).astype(np.float32)
print(repr(float(np.abs(np.array(mx.array(a) @ mx.array(w)) - a @ w).max())))
"""


@pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="the bundled reference BLAS is the Linux wheel's"
)
def test_the_pip_or_system_openblas_is_loaded_before_mlx_or_the_hint_says_how():
    loaded, mapped, hint = eval(
        subprocess.run(
            [sys.executable, "-c", PROBE], capture_output=True, text=True, check=True
        ).stdout
    )
    if blas.pip_openblas():
        assert loaded == blas.pip_openblas()[0] and mapped and hint is None
    elif blas.system_blas_candidates():
        assert loaded in blas.system_blas_candidates() and mapped and hint is None
    else:
        assert loaded is None and "pip install ngsolve-openblas" in hint


@pytest.mark.skipif(
    not sys.platform.startswith("linux") or platform.machine() != "x86_64",
    reason="ngsolve-openblas is built for x86-64 Linux",
)
def test_the_mlx_extra_brings_an_openblas_that_mlx_computes_with():
    """The extra's package is installed (setup.sh installs the extra) and MLX's products run on it
    and agree with numpy's."""
    assert blas.pip_openblas() is not None, "ngsolve-openblas (the mlx extra's) is not installed"
    check = PROBE + PRODUCT
    lines = subprocess.run(
        [sys.executable, "-c", check], capture_output=True, text=True, check=True
    ).stdout
    (loaded, mapped, hint), err = map(eval, lines.splitlines())
    assert loaded == blas.pip_openblas()[0] and mapped and hint is None
    assert err < 1e-3, f"MLX on the pip OpenBLAS is off numpy's product by {err}"


@pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="the bundled reference BLAS is the Linux wheel's"
)
def test_specdec_mlx_blas_bundled_keeps_mlx_own_blas():
    env = {"SPECDEC_MLX_BLAS": "bundled", "PATH": "/usr/bin:/bin"}
    loaded, _, hint = eval(
        subprocess.run(
            [sys.executable, "-c", PROBE], capture_output=True, text=True, check=True, env=env
        ).stdout
    )
    assert loaded is None and hint is None


def test_the_hint_names_the_fix(monkeypatch):
    monkeypatch.setattr(sys, "platform", "linux")
    monkeypatch.setattr(blas, "_state", {"loaded": None, "tried": True})
    monkeypatch.setattr(blas, "_mapped_openblas", lambda: False)
    monkeypatch.setattr(blas, "system_blas_candidates", lambda: [])
    monkeypatch.setattr(blas, "pip_openblas", lambda: None)
    assert (
        "apt-get install libopenblas0-pthread" in blas.blas_hint()
        and "pip install ngsolve-openblas" in blas.blas_hint()
        and "$SPECDEC_MLX_BLAS" in blas.blas_hint()
    )
    monkeypatch.setattr(blas, "system_blas_candidates", lambda: ["/usr/lib/libopenblas.so.0"])
    assert "import specdec before mlx" in blas.blas_hint()
    monkeypatch.setattr(blas, "_mapped_openblas", lambda: True)
    assert blas.blas_hint() is None
