"""Test configuration: a fixed Hypothesis profile and the backends under test.

SPECDEC_TEST_BACKENDS (default "numpy") names the backends to test; a name that is not
installed fails the run instead of being skipped.
"""

from __future__ import annotations

import os

import pytest
from hypothesis import HealthCheck, settings

settings.register_profile(
    "ci", derandomize=True, deadline=None, max_examples=25, print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
settings.register_profile("dev", deadline=None, max_examples=100)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

# dtype=None measures the fastest dtype on the machine (specdec.tuning); tests compute in float32
# so that no result depends on timing (tests of the measurement unset this)
os.environ.setdefault("SPECDEC_DTYPE", "float32")


def backends_under_test() -> list[str]:
    names = [n.strip() for n in os.environ.get("SPECDEC_TEST_BACKENDS", "numpy").split(",") if n.strip()]
    from specdec.plugins import default_registry

    installed = default_registry().names("backend")
    missing = [n for n in names if n not in installed]
    if missing:
        raise pytest.UsageError(f"SPECDEC_TEST_BACKENDS names {missing}, not installed; installed: {installed}")
    return names


@pytest.fixture(scope="session")
def model_dir(tmp_path_factory):
    """A small random llama folder with a tokenizer, shared by the session's tests."""
    from specdec.testing import make_random_model

    return make_random_model(
        tmp_path_factory.mktemp("model") / "llama", vocab_size=96, hidden_size=32, num_layers=2, num_heads=4,
        num_kv_heads=2, seed=1, with_tokenizer=True,
    )


@pytest.fixture(scope="module")
def target(model_dir):
    """``model_dir`` loaded on the numpy backend, once per test module."""
    import specdec

    return specdec.load(model_dir, backend="numpy")
