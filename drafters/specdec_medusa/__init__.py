"""Medusa: K residual heads on the target's last hidden state, combined through a static tree.

Head k (k = 0..K-1), applied to the hidden state at the position that produced the root
token, predicts the token k+1 positions after the root. Each head proposes its top-T tokens;
a static list of top-index paths (the "choices") turns them into one token tree per step.

Modules: ``config`` (``MedusaConfig``), ``reference`` (float64 NumPy heads and
``MedusaDrafter``), ``choices`` (tree presets, ``resolve_choices``), ``tree``
(``StaticTreeBuilder``), ``checkpoint`` (save, load, compatibility checks).
"""
