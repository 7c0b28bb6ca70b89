"""A drafter or tree builder on a backend that has none of its own runs its NumPy reference.

A new backend (``docs/writing-a-backend.md``) brings a target, a prefix-tree builder and the
verifiers; a drafter package registers implementations for the backends it knows (numpy, torch,
mlx). On any other backend, ``PluginRegistry.get`` answers with the drafter's (or tree
builder's) NumPy registration wrapped here: the reference is built over the target's weights
read to the host, every array it is given is copied to the host (``Backend.to_numpy``) and every
array it returns is put where the target computes (``Backend.from_numpy``). It is the
reference's arithmetic, so it is correct (greedy output equals plain decoding) and slow; a
warning says so once per drafter and backend.
"""

from __future__ import annotations

import functools
import warnings
from collections.abc import Mapping
from typing import Any

import attrs
import numpy as np

from specdec.capabilities import request_end
from specdec.plugins.loading import PluginWarning
from specdec.slots import on_target
from specdec.types import Accepted, Draft, DraftContext, PromptOutput

__all__ = [
    "HOST_BACKEND",
    "HostDrafter",
    "HostTreeBuilder",
    "ReferenceOnHostWarning",
    "on_host_factory",
]

HOST_BACKEND = "numpy"  # where the references run


class ReferenceOnHostWarning(PluginWarning):
    """A drafter or tree builder runs its NumPy reference on a backend that has none of its own."""


@functools.cache
def _warn_once(kind: str, name: str, backend: str) -> None:
    warnings.warn(
        f"{kind.replace('_', ' ')} {name!r} has no implementation for backend {backend!r}: it "
        f"runs its NumPy reference on the host (correct, slow); register one for {backend!r} "
        "to make it fast (docs/writing-a-drafter.md)",
        ReferenceOnHostWarning,
        stacklevel=4,
    )


def _host(value, backend) -> Any:
    """A backend array (or a mapping of them) copied to the host; host values as they are."""
    if value is None or isinstance(value, (bool, int, float, str, tuple, np.ndarray, np.generic)):
        return value
    if isinstance(value, Mapping):
        return {k: _host(v, backend) for k, v in value.items()}
    return backend.to_numpy(value)


def _fields_on_host(record, backend, skip=()):
    return attrs.evolve(
        record,
        **{
            f.name: _host(getattr(record, f.name), backend)
            for f in attrs.fields(type(record))
            if f.name not in skip and not f.name.startswith("_")
        },
    )


class HostTarget:
    """The target as a host drafter reads it: its weights (``embed_tokens``, ``lm_head``) as
    NumPy arrays, everything else the target's own."""

    def __init__(self, target, backend):
        self._target, self._backend = target, backend

    def __getattr__(self, name):
        value = getattr(self._target, name)
        if name in ("embed_tokens", "lm_head") and value is not None:
            return np.asarray(_host(value, self._backend))
        return value


class HostDrafter:
    """A NumPy reference drafter on another backend (module docstring)."""

    def __init__(self, inner, backend, target):
        self.inner, self.backend, self.target = inner, backend, target

    def __getattr__(self, name):  # caps, beam_width, slot_tokens and the like: the reference's
        return getattr(self.inner, name)

    def _on_target(self, value):
        return None if value is None else on_target(value, self.backend, self.target)

    def propose(self, context: DraftContext) -> Draft:
        draft = self.inner.propose(_fields_on_host(context, self.backend, skip=("sampling",)))
        arrays = ("root_tokens", "beams", "head_tokens", "draft_probs", "beam_lengths")
        return attrs.evolve(draft, **{k: self._on_target(getattr(draft, k)) for k in arrays})

    def begin(self, slot: int, prompt, output: PromptOutput) -> None:
        self.inner.begin(slot, prompt, _fields_on_host(output, self.backend))

    def observe(self, accepted: Accepted) -> None:
        self.inner.observe(_fields_on_host(accepted, self.backend))

    def end(self, slot: int, reason: str) -> None:
        request_end(self.inner)(slot, reason)


class HostTreeBuilder:
    """A NumPy reference tree builder on another backend: the draft copied to the host, the
    tree put where the target computes (``bind``: a tree builder's factory gets no target, so
    ``specdec.decode_plan`` tells it)."""

    def __init__(self, inner):
        self.inner, self.backend, self.target = inner, None, None

    def bind(self, backend, target) -> None:
        self.backend, self.target = backend, target

    def build(self, draft: Draft):
        tree = self.inner.build(_fields_on_host(draft, self.backend))
        return on_target(tree, self.backend, self.target)


def on_host_factory(kind: str, name: str, factory, backend_name: str, host_backend):
    """The factory of ``kind`` ``name`` on ``backend_name`` built from its NumPy ``factory``:
    a drafter gets the target as ``HostTarget`` and ``host_backend`` (the numpy backend); both
    kinds come wrapped."""

    @functools.wraps(factory)
    def on_host(*args, target=None, backend=None, **options):
        _warn_once(kind, name, backend_name)
        if kind != "drafter":
            return HostTreeBuilder(factory(*args, **options))
        inner = factory(*args, target=HostTarget(target, backend), backend=host_backend, **options)
        return HostDrafter(inner, backend, target)

    return on_host
