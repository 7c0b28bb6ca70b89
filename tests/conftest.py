"""Test configuration: a fixed Hypothesis profile and the backends under test.

SPECDEC_TEST_BACKENDS (default "numpy") is a comma-separated list of backends that must be
tested (names stripped of spaces). At session start every name must be a registered backend
whose framework imports, together with what its tests need (``BACKEND_MODULES``); otherwise
the run stops with a usage error. During the run, a skip for want of a named backend is
reported as a failure wherever the test is (``required_backend``): a skip whose reason names the
backend or a module its tests need (``BACKEND_MODULES``), and a skip of a test that names the
backend (a word of its path, name or parameters, as in ``test_mlx_verify.py`` or
``[torch-float64]``, or a path of ``BACKEND_TESTS``) whose reason says a module, package or
registration is missing. Unnamed backends are tested whenever their framework imports.

SPECDEC_TEST_SHIPPED=1 (set by ``.ci/run``, which fetches the bundled model first) makes the tests
of the shipped checkpoints on the real SmolLM2-135M mandatory: the ``shipped_model`` fixture then
fails where it would skip for want of the model in the specdec cache.
"""

from __future__ import annotations

import importlib
import os
import re

# One compute thread per framework unless asked otherwise: the models under test are tiny, and on a
# busy machine spinning thread pools made the torch training tests 5x slower. Set before torch
# loads.
os.environ.setdefault("OMP_NUM_THREADS", "1")

import pytest  # noqa: E402
from hypothesis import HealthCheck, settings  # noqa: E402

settings.register_profile(
    "ci",
    derandomize=True,
    deadline=None,
    max_examples=25,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
settings.register_profile("dev", deadline=None, max_examples=100)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

# dtype=None measures the fastest dtype on the machine (specdec.tuning.dtype); tests compute in
# float32 so that no result depends on timing (tests of the measurement unset this)
os.environ.setdefault("SPECDEC_DTYPE", "float32")
# speculation="auto" chooses each step's drafting from timings (specdec.decode.budget); tests draft
# every step unless they test the choice, so that step counts and acceptance figures do not depend
# on timing
os.environ.setdefault("SPECDEC_SPECULATION", "always")

# Modules the tests of each backend import (a missing one would skip them).
BACKEND_MODULES = {"numpy": (), "torch": ("torch", "transformers"), "mlx": ("mlx.core", "mlx_lm")}
# Test paths (under tests/) that need a backend without naming it (see names_backend).
BACKEND_TESTS = {
    "numpy": (),
    "torch": ("training/", "core/test_reference_vs_transformers.py"),
    "mlx": (),
}
# What a skip's reason says when something is missing (pytest.importorskip: "could not import").
MISSING = ("could not import", "no module named", "not installed", "not registered")
_REQUIRED: list[str] = []


def backends_under_test(environ=os.environ) -> list[str]:
    """The names in SPECDEC_TEST_BACKENDS (default "numpy"), stripped, empty items dropped."""
    return [
        n.strip() for n in environ.get("SPECDEC_TEST_BACKENDS", "numpy").split(",") if n.strip()
    ]


def check_backends(names: list[str]) -> None:
    """Raise ``pytest.UsageError`` unless every name is a registered backend whose framework
    imports."""
    from specdec.plugins.registry import default_registry

    registry = default_registry()
    installed = registry.names("backend")
    problems = []
    for name in names:
        if name not in installed:
            problems.append(
                f"{name!r} is not a registered backend (registered: {', '.join(installed)})"
            )
            continue
        try:
            registry.get("backend", name).factory()
            for module in BACKEND_MODULES.get(name, ()):
                importlib.import_module(module)
        except Exception as error:  # noqa: BLE001 - any failure to import is reported by name
            problems.append(f"{name!r} is not usable: {type(error).__name__}: {error}")
    if problems:
        raise pytest.UsageError(
            "SPECDEC_TEST_BACKENDS=" + ",".join(names) + ": " + "; ".join(problems)
        )


def pytest_sessionstart(session):
    names = backends_under_test()
    check_backends(names)
    _REQUIRED[:] = names


def _mentions(text: str, word: str) -> bool:
    """``word`` stands in ``text`` on its own: "mlx" in "mlx.core" or "[mlx-1]", not "numpy" in
    "numpy32"."""
    return re.search(rf"(?<![A-Za-z0-9_]){re.escape(word)}(?![A-Za-z0-9])", text) is not None


def names_backend(nodeid: str, name: str) -> bool:
    """The test's path, name or parameters name backend ``name`` as a word (``test_torch_ops.py``,
    ``test_on_torch_float64``, ``[mlx]``), or its path is one of ``BACKEND_TESTS[name]``."""
    path = nodeid.split("::")[0].removeprefix("tests/")
    return name in re.split(r"[^A-Za-z0-9]+", nodeid) or any(
        path.startswith(p) for p in BACKEND_TESTS.get(name, ())
    )


def required_backend(nodeid: str, reason: str, required) -> str | None:
    """The backend of ``required`` for want of which test ``nodeid`` skipped with ``reason``, if
    any: the reason names it or a module its tests need, or the test names it and the reason
    says something is missing."""
    missing = any(words in reason.lower() for words in MISSING)
    for name in required:
        if any(_mentions(reason, word) for word in (name, *BACKEND_MODULES.get(name, ()))):
            return name
        if missing and names_backend(nodeid, name):
            return name
    return None


def _fail_skip(report) -> None:
    """A skip for want of a named backend (``required_backend``) becomes a failure."""
    if not report.skipped or hasattr(report, "wasxfail"):
        return
    reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
    name = required_backend(report.nodeid, reason, _REQUIRED)
    if name is not None:
        report.outcome = "failed"
        report.longrepr = (
            f"skipped, but SPECDEC_TEST_BACKENDS names {name!r}, which requires it: {reason}"
        )


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
        tmp_path_factory.mktemp("model") / "llama",
        vocab_size=96,
        hidden_size=32,
        num_layers=2,
        num_heads=4,
        num_kv_heads=2,
        seed=1,
        with_tokenizer=True,
    )


@pytest.fixture(scope="session")
def shipped_model():
    """The folder of the bundled SmolLM2-135M in the specdec cache, for the tests of the shipped
    checkpoints on the real model. Skips when the model is not there, unless SPECDEC_TEST_SHIPPED=1
    (CI, whose ``.ci/run`` fetches it first): then that is a failure."""
    from specdec.models.cache import cache_dir

    folder = cache_dir() / "models" / "smollm2-135m"
    if not (folder / "model.safetensors").is_file():
        message = (
            f"the bundled smollm2-135m is not in the specdec cache ({folder}); `bash "
            "scripts/demo.sh` or specdec.models.bundled.resolve_model('smollm2-135m') fetches it"
        )
        if os.environ.get("SPECDEC_TEST_SHIPPED") == "1":
            pytest.fail(f"SPECDEC_TEST_SHIPPED=1 requires it: {message}")
        pytest.skip(message)
    return folder


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
        plain = specdec.generate(
            target, prompts, drafter="none", backend="torch", max_new_tokens=12
        )
        spec = specdec.generate(
            target,
            prompts,
            drafter=drafter,
            backend="torch",
            max_new_tokens=12,
            beam_width=2,
            beam_length=3,
        )
        return spec.tokens, plain.tokens

    return run
