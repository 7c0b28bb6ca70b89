"""Drafter specs: everything the core needs to know about a drafter, in one record its package
registers (hook ``specdec_register_drafter_specs``), so that nothing in ``specdec/`` names a
drafter.

Loading (a checkpoint's ``model_type``), training (``specdec train NAME``), the bench and the
conformance kit (random checkpoints) iterate over the registered specs. See
docs/decisions/0004-drafter-specs.md.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Mapping

import attrs


@attrs.frozen(kw_only=True)
class CliOption:
    """One option of ``specdec train NAME``: ``flag`` ("--beam-width"), its type, default and
    help."""

    flag: str
    type: Callable[[str], Any] = str
    default: Any = None
    help: str = ""

    @property
    def dest(self) -> str:
        return self.flag.lstrip("-").replace("-", "_")


@attrs.frozen(kw_only=True)
class Layout:
    """A serving engine's checkpoint layout that a drafter exports to and imports from
    (``specdec.plugins.export``, docs/scale-out.md).

    name: the format's name (``specdec export --format NAME``); aliases: other names for it (an
    engine that reads it); detect(folder, config) -> whether a folder (its parsed config.json, or
    {}) is in this layout, or a file given in its place (config {}: a single-file format);
    read(folder) -> (drafter config, float64 weights, notes); write(config, weights, out, *,
    lm_head, dtype, **options) -> (notes, engine commands), which refuses, with the fix, what it
    cannot carry over exactly. takes_model: ``write`` is also given ``model=`` (the target as the
    caller named it, or None), for a layout that copies something from the target. dtypes: the
    ``dtype`` values ``write`` stores (``specdec export`` refuses others before writing anything).
    """

    name: str
    detect: Callable[[Path, dict], bool]
    read: Callable[[Path], tuple]
    write: Callable[..., tuple]
    aliases: tuple[str, ...] = ()
    takes_model: bool = False
    dtypes: tuple[str, ...] = ("float32", "float16")


@attrs.frozen(kw_only=True)
class DrafterSpec:
    """One drafter.

    name: what users pass as ``drafter=``. implementations: backend name (or "*") -> factory
    ``factory(target, checkpoint=None, *, backend, **options)`` returning a Drafter (``backend``:
    the Backend object the target runs on) (registered as the ``drafter`` plugins of that name).
    model_type: the ``model_type`` of the drafter's checkpoint ``config.json`` (None: it reads no
    checkpoint). make_random_checkpoint(path, model_path, *, seed, **config) -> Path: a random
    checkpoint for a model folder (tests, the conformance kit). train(model, out, **options) ->
    report: ``specdec train NAME`` (options: those of ``specdec.training.run.train_drafter`` and
    ``train_options``). evaluation_task(checkpoint, target, overrides) -> the training task holding
    a saved checkpoint, for held-out evaluation. default_shortlist: ``specdec train --shortlist``
    when not given; takes_shortlist: False for a drafter whose training refuses ``--shortlist``
    (it has its own draft vocabulary option), which ``specdec train NAME --help`` then does not
    list. beam_options: takes ``beam_width`` / ``beam_length`` (``specdec plan`` chooses
    them from one recorded run). tree_options: {option: candidate values} of a tree drafter's
    settings, which ``specdec plan`` searches by decoding with them, one option at a time in this
    order (``specdec.bench.tree_planner``); generate then uses the best when the caller names none.
    pairs_with_lookup: a prompt-lookup beam is added beside its beams by default.
    load_checkpoint(path) -> (config, float64 weights) and save_checkpoint(path, config, weights, *,
    dtype): its own checkpoint files; package: the package whose ``weights/<model name>/`` holds the
    shipped checkpoints; layouts: the engines' layouts it exports to and imports from.
    tree_size(config) -> the most nodes (root included) one row's draft tree holds under the tree
    settings of a checkpoint's config (what ``load_checkpoint`` or a layout's ``read`` returns),
    read without building the drafter: ``specdec import`` and ``export`` refuse a checkpoint whose
    trees cannot fit the room a slot keeps for them (None: not checked there).
    """

    name: str
    implementations: Mapping[str, Callable[..., Any]]
    model_type: str | None = None
    make_random_checkpoint: Callable[..., Path] | None = None
    train: Callable[..., dict] | None = None
    evaluation_task: Callable[..., Any] | None = None
    train_options: tuple[CliOption, ...] = ()
    default_shortlist: int = 0
    takes_shortlist: bool = True
    beam_options: bool = False
    tree_options: Mapping[str, tuple[int, ...]] = attrs.field(factory=dict)
    pairs_with_lookup: bool = False
    load_checkpoint: Callable[..., tuple] | None = None
    save_checkpoint: Callable[..., Any] | None = None
    package: str | None = None
    layouts: tuple[Layout, ...] = ()
    tree_size: Callable[[Any], int] | None = None
