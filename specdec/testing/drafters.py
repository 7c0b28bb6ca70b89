"""Random drafter checkpoints for tests and plugin authors."""

from __future__ import annotations

from pathlib import Path


def make_random_drafter(path, model_path, *, kind: str, seed: int, **config) -> Path:
    """Write a random ReDrafter or Medusa checkpoint for the model folder at ``model_path``.

    ``config`` overrides fields of the drafter's config (e.g. ``beam_width=3``, ``head="full"``).
    """
    if kind == "redrafter":
        from specdec_redrafter.checkpoint import make_random_redrafter

        return Path(make_random_redrafter(path, model_path, seed=seed, **config))
    if kind == "medusa":
        from specdec_medusa.checkpoint import make_random_medusa

        return Path(make_random_medusa(path, model_path, seed=seed, **config))
    raise ValueError(f"unknown drafter kind {kind!r}; make_random_drafter knows: 'redrafter', 'medusa'")
