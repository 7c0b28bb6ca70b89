"""The ngram drafter with specdec's conformance kit. Run after ``pip install -e .``."""

import importlib.util

import numpy as np
import pytest

import specdec
from specdec.protocols import StepKinds
from specdec.testing import checks, make_random_model


def _found(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:
        return False


BACKENDS = ["numpy"] + [
    name
    for name, module in (("torch", "torch"), ("mlx", "mlx.core"))
    if name in specdec.default_registry().names("backend") and _found(module)
]


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return make_random_model(
        tmp_path_factory.mktemp("m") / "llama",
        vocab_size=64,
        hidden_size=32,
        num_layers=2,
        num_heads=4,
        num_kv_heads=2,
        seed=0,
    )


@pytest.mark.parametrize("backend", BACKENDS)
def test_lossless_on_every_backend(model, backend):
    checks.check_drafter("ngram", model, backends=[backend])
    checks.check_drafter("ngram", model, backends=[backend], ngram=1, beam_width=3, beam_length=3)


def test_same_tokens_as_the_reference(model):
    for backend in BACKENDS[1:]:
        checks.check_generation(
            backend, model, "ngram", prompts=[[1, 2, 3, 1, 2], [9]], max_new_tokens=12
        )


def test_repeated_text_is_accepted(model):
    """Plain decoding of a random model soon repeats itself; the drafter then proposes what
    follows."""
    result = specdec.generate(
        model, [5, 6, 7], drafter="ngram", backend="numpy", max_new_tokens=48, stop_at_eos=False
    )
    assert result.stats.accepted_tokens > 0, result.tokens


def test_proposals():
    from specdec_example_drafter.drafter import NgramDrafter

    backend = specdec.default_registry().get("backend", "numpy").factory()
    drafter = NgramDrafter(backend, None, ngram=2, beam_width=2, beam_length=3)
    history = (np.array([1, 2, 3, 1, 2, 4, 1, 2]), np.array([9]))
    context = specdec.DraftContext(
        root_tokens=np.array([2, 9]), hidden=np.zeros((2, 4)), history=history
    )
    draft = drafter.propose(context)
    assert draft.beams.tolist() == [[[2, 4, 1], [2, 3, 1]], [[9, 9, 9], [9, 9, 9]]]
    assert draft.beam_lengths.tolist() == [[3, 3], [1, 1]], (
        "a row without a proposal is the root alone"
    )
    # near the end of the text a continuation is short, and so is its beam
    short = NgramDrafter(backend, None, ngram=2, beam_width=2, beam_length=5).propose(
        specdec.DraftContext(
            root_tokens=np.array([2]), hidden=np.zeros((1, 4)), history=(np.array([1, 2, 3, 1, 2]),)
        )
    )
    assert short.beams[0, 0, :4].tolist() == [2, 3, 1, 2] and short.beam_lengths.tolist() == [
        [4, 1]
    ]


def test_step_kinds():
    from specdec_example_drafter.drafter import NgramDrafter

    backend = specdec.default_registry().get("backend", "numpy").factory()
    drafter = NgramDrafter(backend, None, ngram=2)
    assert drafter.step_kind(np.array([1, 2, 3, 1, 2])) == 1  # "1 2" occurred before
    assert drafter.step_kind(np.array([1, 2, 3, 2, 1])) == 0
    assert isinstance(drafter, StepKinds)


def test_options_are_checked(model):
    with pytest.raises(specdec.InvalidInputError, match="ngram must be an integer >= 1"):
        specdec.generate(model, [1, 2], drafter="ngram", backend="numpy", ngram=0)
    with pytest.raises(specdec.InvalidInputError, match="does not take option"):
        specdec.generate(model, [1, 2], drafter="ngram", backend="numpy", width=2)
