"""Test configuration: a fixed Hypothesis profile and the backends under test.

SPECDEC_TEST_BACKENDS (default "numpy") is a comma-separated list of backends that must be
tested (names stripped of spaces). At session start every name must be a registered backend
whose framework imports, together with what its tests need (``BACKEND_MODULES``); otherwise
the run stops with a usage error. During the run, a test that a named backend covers
(``BACKEND_TESTS``: the backend's own tests, and for torch the training and ``transformers``
tests) and that skips for want of that backend's modules is reported as a failure. Unnamed backends are tested whenever their framework imports.
"""

from __future__ import annotations

import importlib
import os

# One compute thread per framework unless asked otherwise: the models under test are tiny, and on a
# busy machine spinning thread pools made the torch training tests 5x slower. Set before torch loads.
os.environ.setdefault("OMP_NUM_THREADS", "1")

import pytest  # noqa: E402
from hypothesis import HealthCheck, settings  # noqa: E402

settings.register_profile(
    "ci", derandomize=True, deadline=None, max_examples=25, print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
settings.register_profile("dev", deadline=None, max_examples=100)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

# dtype=None measures the fastest dtype on the machine (specdec.tuning); tests compute in float32
# so that no result depends on timing (tests of the measurement unset this)
os.environ.setdefault("SPECDEC_DTYPE", "float32")

# Modules the tests of each backend import (a missing one would skip them).
BACKEND_MODULES = {"numpy": (), "torch": ("torch", "transformers"), "mlx": ("mlx.core", "mlx_lm")}
# Test paths (under tests/) a named backend must run: a skip there fails the run.
BACKEND_TESTS = {
    "numpy": (),
    "torch": ("backends/test_torch_", "training/", "core/test_reference_vs_transformers.py"),
    "mlx": ("backends/test_mlx_",),
}
_REQUIRED: list[str] = []


def backends_under_test(environ=os.environ) -> list[str]:
    """The names in SPECDEC_TEST_BACKENDS (default "numpy"), stripped, empty items dropped."""
    return [n.strip() for n in environ.get("SPECDEC_TEST_BACKENDS", "numpy").split(",") if n.strip()]


def check_backends(names: list[str]) -> None:
    """Raise ``pytest.UsageError`` unless every name is a registered backend whose framework imports."""
    from specdec.plugins import default_registry

    registry = default_registry()
    installed = registry.names("backend")
    problems = []
    for name in names:
        if name not in installed:
            problems.append(f"{name!r} is not a registered backend (registered: {', '.join(installed)})")
            continue
        try:
            registry.get("backend", name).factory()
            for module in BACKEND_MODULES.get(name, ()):
                importlib.import_module(module)
        except Exception as error:  # noqa: BLE001 - any failure to import is reported by name
            problems.append(f"{name!r} is not usable: {type(error).__name__}: {error}")
    if problems:
        raise pytest.UsageError("SPECDEC_TEST_BACKENDS=" + ",".join(names) + ": " + "; ".join(problems))


def pytest_sessionstart(session):
    names = backends_under_test()
    check_backends(names)
    _REQUIRED[:] = names


def _covering_backend(nodeid: str) -> str | None:
    """The named backend whose tests include ``nodeid`` (None when none is named)."""
    path = nodeid.split("::")[0].removeprefix("tests/")
    for name in _REQUIRED:
        if any(path.startswith(prefix) for prefix in BACKEND_TESTS.get(name, ())):
            return name
    return None


def _fail_skip(report) -> None:
    """A skip of a named backend's test, for want of that backend's framework, becomes a failure."""
    name = _covering_backend(report.nodeid) if report.skipped else None
    if name is None or hasattr(report, "wasxfail"):
        return
    reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
    if any(word in reason for word in (name, *BACKEND_MODULES[name])):
        report.outcome = "failed"
        report.longrepr = f"skipped, but SPECDEC_TEST_BACKENDS names {name!r}, which requires it: {reason}"


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector):
    outcome = yield
    _fail_skip(outcome.get_result())


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    _fail_skip(outcome.get_result())


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
    """``model_dir`` loaded on the numpy backend with 4 slots, once per test module."""
    import specdec

    return specdec.load(model_dir, backend="numpy", slots=4)


@pytest.fixture
def torch_float32_speculation(model_dir, tmp_path):
    """A callable -> (speculative tokens, plain tokens) of a random ReDrafter on ``model_dir``,
    torch float32, two prompts: for tests that force one kernel choice and check exactness."""
    def run():
        import specdec
        from specdec.testing import make_random_drafter

        drafter = make_random_drafter(tmp_path / "d", model_dir, kind="redrafter", seed=3)
        target = specdec.load(model_dir, backend="torch", dtype="float32")
        prompts = [[1, 2, 3], [4, 5]]
        plain = specdec.generate(target, prompts, drafter="none", backend="torch", max_new_tokens=12)
        spec = specdec.generate(target, prompts, drafter=drafter, backend="torch", max_new_tokens=12,
                                beam_width=2, beam_length=3)
        return spec.tokens, plain.tokens

    return run
