"""EAGLE (feature-level autoregressive drafting, arXiv 2401.15077) with EAGLE-2's dynamic draft
tree (arXiv 2406.16858) for specdec.

One Llama decoder layer reads, at position t, the target's last hidden state f_t (after the final
norm) fused with the embedding of the token that follows it, and predicts f_{t+1}; the target's
own LM head turns predicted features into draft tokens. The drafter keeps its own small KV cache
per request slot (``begin`` / ``observe`` / ``end``), grows a tree from the most confident nodes
level by level and hands its root-to-leaf paths to the prefix-tree builder.

Modules: ``config`` (EagleConfig, weight names), ``reference`` (float64 NumPy drafter: the draft
layer, the dynamic tree, EagleDrafter), ``torch`` and ``mlx`` (the same on the backends' arrays),
``checkpoint`` (save / load / random drafters), ``train`` (distillation), ``plugin`` (registration).
"""
