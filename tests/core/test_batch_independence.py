"""Seeded sampling does not depend on the rest of the batch, for every installed drafter: a row
decoded alone with ``seed=[s]`` matches the same row of a batch with ``seed[b] = s``."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import specdec
from specdec.plugins.registry import default_registry
from specdec.testing import make_random_drafter

CHECKPOINT_KINDS = (
    "redrafter",
    "medusa",
    "draft_model",
    "eagle",
    "eagle3",
)  # installed drafters that need a checkpoint folder


@pytest.fixture(scope="module")
def checkpoints(model_dir, tmp_path_factory):
    root = tmp_path_factory.mktemp("independence")
    return {
        kind: make_random_drafter(root / kind, model_dir, kind=kind, seed=7)
        for kind in CHECKPOINT_KINDS
    }


def installed_drafters() -> list[str]:
    return sorted(default_registry().names("drafter"))


CASES = [(name, {}) for name in installed_drafters()] + [("redrafter", {"lookup": True})]
# rows that repeat themselves (lookup finds matches) beside rows that do not
prompt = st.one_of(
    st.lists(st.integers(0, 95), min_size=1, max_size=6),
    st.lists(st.integers(0, 95), min_size=1, max_size=3).map(lambda p: p * 3),
)


@pytest.mark.parametrize(
    "name, options", CASES, ids=[f"{n}{'+lookup' if o else ''}" for n, o in CASES]
)
@settings(max_examples=6)
@given(
    prompts=st.lists(prompt, min_size=2, max_size=3),
    seeds=st.lists(st.integers(0, 2**31), min_size=3, max_size=3),
    temperature=st.sampled_from([0.7, 1.0, 1.5]),
)
def test_a_row_alone_matches_the_same_row_in_a_batch(
    target, checkpoints, name, options, prompts, seeds, temperature
):
    drafter = checkpoints.get(name, name)
    seeds = seeds[: len(prompts)]
    common = dict(
        drafter=drafter, backend="numpy", max_new_tokens=10, temperature=temperature, **options
    )
    batch = specdec.generate(target, prompts, seed=seeds, **common)
    for row, p in enumerate(prompts):
        alone = specdec.generate(target, p, seed=[seeds[row]], **common)
        assert batch.tokens[row] == alone.tokens, (
            f"{name} {options}: row {row} of {prompts} differs alone"
        )
