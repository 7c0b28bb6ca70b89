"""The built-in plugin ``numpy``: the float64 reference backend (``specdec.reference``), the core's
drafters (``specdec.drafting``), its prefix tree builder and verifiers, registered like any
third-party plugin."""

from __future__ import annotations

import numpy as np

from specdec.drafting import lookup
from specdec.drafting.none import NoDrafter
from specdec.drafting.store import resolve_store
from specdec.errors import InvalidInputError
from specdec.plugins.hookspecs import hookimpl
from specdec.plugins.support import lazy_factory, register_verifiers
from specdec.plugins.registry import ANY_BACKEND
from specdec.reference.model import ReferenceTarget, load_target


class NumpyBackend:
    """Runs the float64 reference on the CPU."""

    name = "numpy"

    def load_target(self, source, *, dtype=None, device=None, slots=1, capacity=None):
        if dtype not in (None, "float64"):
            raise InvalidInputError(
                f"the numpy backend computes in float64 only, got dtype={dtype!r}"
            )
        if device not in (None, "cpu"):
            raise InvalidInputError(
                f"the numpy backend runs on the cpu only, got device={device!r}"
            )
        if isinstance(source, ReferenceTarget):
            return source
        return load_target(source, slots=slots, capacity=capacity)

    def to_numpy(self, array):
        return np.asarray(array)

    def from_numpy(self, array, target):
        return np.asarray(array)


def _no_drafter(target, checkpoint=None, *, backend=None):
    if checkpoint is not None:
        raise InvalidInputError("drafter 'none' (plain decoding) takes no checkpoint")
    return NoDrafter()


def _lookup_drafter(
    target,
    checkpoint=None,
    *,
    backend,
    draft_length=None,
    max_ngram=None,
    min_ngram=None,
    unigram_length=None,
    store="auto",
):
    if checkpoint is not None:
        raise InvalidInputError("drafter 'lookup' (prompt lookup) takes no checkpoint")
    return lookup.LookupDrafter(
        backend,
        target,
        draft_length=lookup.DEFAULT_DRAFT_LENGTH if draft_length is None else draft_length,
        max_ngram=lookup.DEFAULT_MAX_NGRAM if max_ngram is None else max_ngram,
        min_ngram=lookup.DEFAULT_MIN_NGRAM if min_ngram is None else min_ngram,
        unigram_length=lookup.DEFAULT_UNIGRAM_LENGTH if unigram_length is None else unigram_length,
        store=resolve_store(store, target),
    )


@hookimpl
def specdec_register_backends(register):
    register("numpy", NumpyBackend)


@hookimpl
def specdec_register_drafters(register):
    register("none", ANY_BACKEND, _no_drafter)
    register("lookup", ANY_BACKEND, _lookup_drafter)


@hookimpl
def specdec_register_tree_builders(register):
    register(
        "prefix_tree",
        "numpy",
        lazy_factory(
            "numpy", "specdec.reference.tree:PrefixTreeBuilder", feature="the prefix tree builder"
        ),
    )


@hookimpl
def specdec_register_verifiers(register):
    register_verifiers(register, "numpy", "specdec.reference")
