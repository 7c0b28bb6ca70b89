"""Random drafter checkpoints for tests and plugin authors."""

from __future__ import annotations

from pathlib import Path

from specdec.plugins.registry import default_registry


def make_random_drafter(path, model_path, *, kind: str, seed: int, registry=None, **config) -> Path:
    """Write a random checkpoint of drafter ``kind`` (any installed drafter whose spec has a
    ``make_random_checkpoint``) for the model folder at ``model_path``.

    ``config`` overrides fields of the drafter's config (e.g. ``beam_width=3``, ``head="full"``).
    """
    registry = registry or default_registry()
    makers = {
        spec.name: spec.make_random_checkpoint
        for spec in registry.drafter_specs()
        if spec.make_random_checkpoint
    }
    if kind not in makers:
        raise ValueError(
            f"unknown drafter kind {kind!r}; make_random_drafter knows: {', '.join(sorted(makers))}"
        )
    return Path(makers[kind](path, model_path, seed=seed, **config))
