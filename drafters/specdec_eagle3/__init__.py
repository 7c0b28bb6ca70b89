"""EAGLE-3 (arXiv 2503.01840) for specdec: one decoder layer over a fusion of three of the
target's layers (low, middle, high) and the token embedding, with its own norm and LM head over a
draft vocabulary (``d2t`` maps it to target ids), EAGLE-2's dynamic tree, and a per-request draft
KV cache like EAGLE's.

Modules: ``config`` (Eagle3Config, weight names), ``reference`` (float64 NumPy drafter), ``torch``
and ``mlx`` (the same on the backends' arrays; the tree search is EAGLE's), ``checkpoint`` (save /
load / random drafters), ``train`` and ``task`` (``specdec train eagle3``: training-time test),
``plugin`` (registration).
"""
