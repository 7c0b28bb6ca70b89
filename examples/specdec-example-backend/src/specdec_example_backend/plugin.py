"""The specdec plugin: the ``numpy32`` backend, its tree builder and its verifiers.

Arrays are NumPy arrays, so the reference's tree builder and verifiers (which work on any NumPy
arrays) serve this backend too; a backend on another framework registers its own.
"""

from __future__ import annotations

import numpy as np
import specdec


class Numpy32Backend:
    """specdec.protocols.Backend: runs targets in float32 on the CPU."""

    name = "numpy32"

    def load_target(self, source, *, dtype=None, device=None, slots=1, capacity=None):
        from specdec_example_backend.model import Float32Target

        if dtype not in (None, "float32"):
            raise specdec.InvalidInputError(
                f"the numpy32 backend computes in float32 only, got dtype={dtype!r}"
            )
        if device not in (None, "cpu"):
            raise specdec.InvalidInputError(
                f"the numpy32 backend runs on the cpu only, got device={device!r}"
            )
        if isinstance(source, Float32Target):
            return source
        return Float32Target(source, slots=slots, capacity=capacity)

    def to_numpy(self, array):
        return np.asarray(array)

    def from_numpy(self, array, target):
        return np.asarray(array)

    # Optional (dtype=None): one candidate, so nothing is measured; the key names what speed depends
    # on.
    def dtype_candidates(self, device=None):
        return ("float32",)

    def describe_device(self, device=None):
        from specdec.tuning.machine import cpu_description

        return f"cpu {cpu_description()}, numpy {np.__version__}"


def _prefix_tree():
    from specdec.reference.tree import PrefixTreeBuilder

    return PrefixTreeBuilder()


def _verifier(name):
    def factory(**options):
        from specdec.reference import verify

        return getattr(verify, name)(**options)

    return factory


@specdec.hookimpl
def specdec_register_backends(register):
    register("numpy32", Numpy32Backend)


@specdec.hookimpl
def specdec_register_tree_builders(register):
    register("prefix_tree", "numpy32", _prefix_tree)


@specdec.hookimpl
def specdec_register_verifiers(register):
    register("greedy", "numpy32", _verifier("GreedyVerifier"), lossless=True)
    register("exact", "numpy32", _verifier("ExactTreeVerifier"), lossless=True)
    register("rejection", "numpy32", _verifier("RejectionVerifier"), lossless=True)
