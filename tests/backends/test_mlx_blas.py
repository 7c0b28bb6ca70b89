"""MLX on Linux gets the pip package's OpenBLAS (the mlx extra's ``ngsolve-openblas``), else the
system's, else a one-line hint (``specdec_mlx.blas``)."""

from __future__ import annotations

import os
import platform
import subprocess
import sys

import pytest

pytest.importorskip("mlx.core")

from specdec.tuning.machine import cores  # noqa: E402
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


BUSY = """
import specdec.plugins.registry
from specdec.tuning.machine import cores
from specdec_mlx import blas
blas.steady_busy_cores = lambda: cores() - 1  # every core but one busy elsewhere
specdec.plugins.registry.default_registry().get("backend", "mlx").factory()
print(repr((blas.blas_threads(), cores())))
"""


def _busy_probe(**env) -> tuple[tuple[int, int], str]:
    """BUSY in a new process whose environment chooses no thread count (but ``env``)."""
    clean = {k: v for k, v in os.environ.items() if k not in blas.THREAD_VARIABLES}
    done = subprocess.run(
        [sys.executable, "-c", BUSY], capture_output=True, text=True, check=True, env=clean | env
    )
    return eval(done.stdout), done.stderr


@pytest.mark.skipif(
    not sys.platform.startswith("linux") or cores() < 2 or not blas.pip_openblas(),
    reason="the extra's OpenBLAS on a Linux machine of several cores",
)
def test_openblas_computes_on_the_cores_other_work_leaves_free():
    """OpenBLAS started a thread per core, which waited on a core kept busy elsewhere: plain
    decoding ran at 5.2 tokens/s against 9.5 on one thread beside one busy process. The count is
    fitted to the free cores, with a line; a count the user chose is kept."""
    (threads, total), err = _busy_probe()
    assert threads == 1, err
    assert f"{total - 1:.1f} of {total} cores busy elsewhere: mlx's OpenBLAS on 1 thread" in err
    (threads, _), err = _busy_probe(OPENBLAS_NUM_THREADS="2")
    assert threads == 2 and "OpenBLAS" not in err


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
