"""Draft trees checked against the room a slot keeps for them before any step runs: beams too
large for it (options, a drafter folder's config, a lookup beam, an engine's tree_room) are
refused by ``generate``, ``Engine`` and the CLI with the limit and the fix, and the drafter never
proposes."""

from __future__ import annotations

import json
import shutil

import pytest

import specdec
from specdec.capabilities import DrafterCaps
from specdec.cli.main import main
from specdec.errors import InvalidInputError
from specdec.slots import TREE_ROOM
from specdec.types import Draft


class CountingDrafter:
    """Declares trees of ``size`` nodes and counts its proposals (it drafts the root alone)."""

    def __init__(self, size: int):
        self.caps = DrafterCaps(max_tree_size=size)
        self.proposals = 0

    def propose(self, context):
        self.proposals += 1
        return Draft(root_tokens=context.root_tokens, beams=context.root_tokens[:, None, None])


@pytest.fixture(scope="module")
def drafter_dir(model_dir, tmp_path_factory):
    """A random ReDrafter folder for ``model_dir``."""
    spec = specdec.default_registry().drafter_spec("redrafter")
    return spec.make_random_checkpoint(
        tmp_path_factory.mktemp("redrafter") / "drafter", model_dir, seed=0
    )


@pytest.fixture(scope="module")
def huge_drafter(drafter_dir, tmp_path_factory):
    """A ReDrafter folder whose config asks for beams of 100,000 x 100,000."""
    folder = tmp_path_factory.mktemp("huge") / "drafter"
    shutil.copytree(drafter_dir, folder)
    config = json.loads((folder / "config.json").read_text())
    config.update(beam_width=100_000, beam_length=100_000)
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def test_huge_beam_options_are_refused_with_the_limit_and_the_fix(model_dir, drafter_dir):
    with pytest.raises(InvalidInputError) as caught:
        specdec.generate(
            model_dir,
            [1, 2, 3],
            drafter_dir,
            "numpy",
            max_new_tokens=4,
            beam_width=100_000,
            beam_length=100_000,
            lookup=False,
        )
    message = str(caught.value)
    assert f"{1 + 100_000 * 99_999} nodes" in message and f"{TREE_ROOM + 1} positions" in message, (
        message
    )
    assert "--beam-width" in message and "capacity" not in message, message


def test_a_drafter_folder_with_huge_beams_is_refused_by_generate_and_the_engine(
    model_dir, huge_drafter
):
    with pytest.raises(InvalidInputError, match="drafts trees of up to"):
        specdec.generate(model_dir, [1, 2, 3], huge_drafter, "numpy", max_new_tokens=4)
    with pytest.raises(InvalidInputError, match="larger tree_room"):
        specdec.Engine(model_dir, drafter=huge_drafter, backend="numpy", slots=1)


def test_the_cli_says_it_in_one_line(model_dir, huge_drafter, capsys):
    code = main(
        [
            "generate",
            "--model",
            str(model_dir),
            "--prompt",
            "hello",
            "--drafter",
            str(huge_drafter),
            "--backend",
            "numpy",
            "--max-new-tokens",
            "2",
        ]
    )
    err = capsys.readouterr().err.strip()
    assert code != 0 and len(err.splitlines()) == 1 and "drafts trees of up to" in err, err


def test_moderate_beams_over_the_room_are_refused_before_any_step(model_dir):
    drafter = CountingDrafter(TREE_ROOM + 2)
    with pytest.raises(InvalidInputError, match="drafts trees of up to"):
        specdec.generate(model_dir, [1, 2, 3], drafter, "numpy", max_new_tokens=4)
    assert drafter.proposals == 0
    fits = CountingDrafter(TREE_ROOM + 1)
    specdec.generate(model_dir, [1, 2, 3], fits, "numpy", max_new_tokens=4)
    assert fits.proposals > 0


def test_a_loaded_target_is_checked_against_what_its_slots_leave(model_dir):
    target = specdec.load(model_dir, backend="numpy", capacity=16)
    # a prompt of 3 and 8 new tokens leave 16 - 11 + 1 = 6 positions for the last step's tree
    specdec.generate(target, [1, 2, 3], CountingDrafter(6), "numpy", max_new_tokens=8)
    with pytest.raises(InvalidInputError, match="6 positions.*larger capacity"):
        specdec.generate(target, [1, 2, 3], CountingDrafter(7), "numpy", max_new_tokens=8)


def test_the_lookup_beam_counts_toward_the_tree(model_dir, drafter_dir):
    # 1 + 4 * 63 = 253 nodes fit 257; a lookup chain of 8 more does not
    specdec.generate(
        model_dir,
        [1, 2, 3],
        drafter_dir,
        "numpy",
        max_new_tokens=2,
        beam_width=4,
        beam_length=64,
        lookup=False,
    )
    with pytest.raises(InvalidInputError, match="up to 261 nodes"):
        specdec.generate(
            model_dir,
            [1, 2, 3],
            drafter_dir,
            "numpy",
            max_new_tokens=2,
            beam_width=4,
            beam_length=64,
            lookup=8,
        )


def test_an_engine_checks_its_own_tree_room(model_dir):
    with pytest.raises(InvalidInputError, match=r"9 positions.*tree_room \(now 8\)"):
        specdec.Engine(
            model_dir, drafter=CountingDrafter(10), backend="numpy", slots=1, tree_room=8
        )
    with specdec.Engine(
        model_dir, drafter=CountingDrafter(9), backend="numpy", slots=1, tree_room=8
    ) as engine:
        assert engine.generate([1, 2], max_new_tokens=2).tokens


def test_an_engine_advises_a_tree_drafter_in_its_own_settings(model_dir, tmp_path):
    """An EAGLE head whose trees outgrow the engine's tree_room is told to lower its tree
    settings (total_tokens, depth), not beam options it does not have."""
    from specdec.testing.drafters import make_random_drafter

    head = make_random_drafter(tmp_path / "eagle", model_dir, kind="eagle", seed=0)
    with pytest.raises(InvalidInputError, match="tree_room") as caught:
        specdec.Engine(model_dir, drafter=head, backend="numpy", slots=1, tree_room=4, lookup=False)
    message = str(caught.value)
    assert "total_tokens" in message and "--beam-width" not in message, message


def test_caps_refuse_a_tree_without_its_root():
    with pytest.raises(ValueError, match="max_tree_size"):
        DrafterCaps(max_tree_size=0)


@pytest.mark.parametrize("kind", ["redrafter", "medusa", "eagle", "eagle3"])
def test_a_specs_tree_size_from_the_config_is_what_its_drafter_declares(
    target, model_dir, tmp_path, kind
):
    """``DrafterSpec.tree_size`` reads a checkpoint's config as ``specdec import`` does, without
    building the drafter; the drafter built with no options declares the same trees."""
    from specdec.capabilities import drafter_caps
    from specdec.generation.api import prepare

    spec = specdec.default_registry().drafter_spec(kind)
    folder = spec.make_random_checkpoint(tmp_path / kind, model_dir, seed=0)
    config, _ = spec.load_checkpoint(folder)
    plan, *_ = prepare(
        target,
        [1, 2],
        folder,
        "numpy",
        max_new_tokens=2,
        temperature=0.0,
        top_k=None,
        top_p=None,
        dtype=None,
        device=None,
        registry=None,
        options={"lookup": False},
    )
    assert spec.tree_size(config) == drafter_caps(plan.drafter).max_tree_size > 1
