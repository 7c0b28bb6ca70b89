"""Conformance kit: random models and drafters, an oracle drafter, Hypothesis strategies and
check functions that a backend plugin runs against the float64 reference."""

from specdec.testing.drafters import make_random_drafter
from specdec.testing.models import make_random_model
from specdec.testing.oracle import OracleDrafter, greedy_continuations

__all__ = ["OracleDrafter", "greedy_continuations", "make_random_drafter", "make_random_model"]
