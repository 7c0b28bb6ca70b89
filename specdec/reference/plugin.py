"""The ``numpy`` backend: the float64 reference, registered like any third-party plugin."""

from __future__ import annotations

import numpy as np

from specdec.errors import InvalidInputError
from specdec.hookspecs import hookimpl
from specdec.plugins import ANY_BACKEND


class NumpyBackend:
    """Runs the float64 reference on the CPU."""

    name = "numpy"

    def load_target(self, source, *, dtype=None, device=None):
        from specdec.reference.model import ReferenceTarget, load_target

        if dtype not in (None, "float64"):
            raise InvalidInputError(f"the numpy backend computes in float64 only, got dtype={dtype!r}")
        if device not in (None, "cpu"):
            raise InvalidInputError(f"the numpy backend runs on the cpu only, got device={device!r}")
        if isinstance(source, ReferenceTarget):
            return source
        return load_target(source)

    def to_numpy(self, array):
        return np.asarray(array)

    def from_numpy(self, array, target):
        return np.asarray(array)


def _greedy():
    from specdec.reference.verify import GreedyVerifier

    return GreedyVerifier()


def _exact():
    from specdec.reference.verify import ExactTreeVerifier

    return ExactTreeVerifier()


def _rejection():
    from specdec.reference.verify import RejectionVerifier

    return RejectionVerifier()


def _redrafter_published():
    from specdec.reference.verify import RedrafterPublishedVerifier

    return RedrafterPublishedVerifier()


def _typical(epsilon: float = 0.09, delta: float = 0.3):
    from specdec.reference.verify import TypicalVerifier

    return TypicalVerifier(epsilon=epsilon, delta=delta)


def _prefix_tree():
    from specdec.reference.tree import PrefixTreeBuilder

    return PrefixTreeBuilder()


def _no_drafter(target, checkpoint=None):
    from specdec.drafting import NoDrafter

    if checkpoint is not None:
        raise InvalidInputError("drafter 'none' (plain decoding) takes no checkpoint")
    return NoDrafter()


@hookimpl
def specdec_register_backends(register):
    register("numpy", NumpyBackend)


@hookimpl
def specdec_register_drafters(register):
    register("none", ANY_BACKEND, _no_drafter)


@hookimpl
def specdec_register_tree_builders(register):
    register("prefix_tree", "numpy", _prefix_tree)


@hookimpl
def specdec_register_verifiers(register):
    register("greedy", "numpy", _greedy, lossless=True)
    register("exact", "numpy", _exact, lossless=True)
    register("rejection", "numpy", _rejection, lossless=True)
    register("redrafter_published", "numpy", _redrafter_published, lossless=False)
    register("typical", "numpy", _typical, lossless=False)
