"""The mlx and torch backends in one process (``specdec_mlx.blas``): on Linux the mlx backend loads
an OpenBLAS into the process's global symbol scope for MLX, and torch's own BLAS calls must not
bind to it (its ``cblas_sgemm_batch`` crashed the process in torch's batched attention products).
Each case runs in a subprocess, so that a crash fails the test instead of ending pytest."""

from __future__ import annotations

import importlib.util
import os
import platform
import subprocess
import sys

import pytest

if importlib.util.find_spec("mlx_lm") is None:  # found, not imported: the subprocesses load it
    pytest.skip("mlx is not installed", allow_module_level=True)
torch = pytest.importorskip("torch")

MLX_THEN_TORCH = """
import faulthandler, sys
faulthandler.enable()
from specdec.testing import checks
model = sys.argv[1]
prompts = [[1, 2, 3], [4, 5, 6, 7, 8], [9], [10, 11]]
for backend in ("mlx", "torch", "mlx"):
    for drafter in ("none", "lookup"):
        checks.check_generation(backend, model, drafter, prompts=prompts, max_new_tokens=12)
import torch
torch.matmul(torch.randn(4, 8, 16), torch.randn(4, 16, 8))  # batched: cblas_sgemm_batch
print("done")
"""

TORCH_BLAS_AFTER_MLX = """
from specdec.plugins.registry import default_registry
default_registry().get("backend", "mlx").factory()  # loads OpenBLAS for MLX on Linux
import mlx.core as mx
mx.eval(mx.ones((8, 8)) @ mx.ones((8, 8)))
import torch
torch.matmul(torch.randn(4, 8, 16), torch.randn(4, 16, 8))
torch.randn(3, 64) @ torch.randn(64, 64)
print("done")
"""


def _run(script: str, *args: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", script, *args],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, **env},
    )


def test_mlx_then_torch_in_one_process_decodes_on_both(tmp_path):
    """MLX decodes first (loading OpenBLAS on Linux), then torch in float32 with a batch of
    requests and the lookup drafter (draft trees: batched attention products, timed by
    ``specdec_torch.timing.fastest`` on the compute thread), then MLX again; every run equals the
    numpy reference."""
    from specdec.testing import make_random_model

    model = make_random_model(
        tmp_path / "m",
        vocab_size=256,
        hidden_size=64,
        num_layers=2,
        num_heads=4,
        num_kv_heads=2,
        seed=0,
    )
    done = _run(MLX_THEN_TORCH, str(model), SPECDEC_CACHE=str(tmp_path / "cache"))
    assert done.returncode == 0 and done.stdout.strip().endswith("done"), (
        f"exit status {done.returncode}\n{done.stdout[-2000:]}\n{done.stderr[-4000:]}"
    )


@pytest.mark.skipif(
    not sys.platform.startswith("linux")
    or platform.machine() != "x86_64"
    or not torch.backends.mkl.is_available(),
    reason="torch's own BLAS is MKL in its x86-64 Linux wheels (MKL_VERBOSE shows its calls)",
)
def test_torch_products_stay_on_torchs_own_blas_after_the_mlx_backend_loads():
    """With ``MKL_VERBOSE=1`` MKL prints each call it serves: torch's batched and plain float32
    products are MKL's after the mlx backend has loaded its OpenBLAS."""
    done = _run(TORCH_BLAS_AFTER_MLX, MKL_VERBOSE="1")
    assert done.returncode == 0 and done.stdout.strip().endswith("done"), (
        f"exit status {done.returncode}\n{done.stdout[-2000:]}\n{done.stderr[-4000:]}"
    )
    calls = [line.split("(")[0] for line in done.stdout.splitlines() if "MKL_VERBOSE S" in line]
    assert "MKL_VERBOSE SGEMM_BATCH" in calls and "MKL_VERBOSE SGEMM" in calls, done.stdout
