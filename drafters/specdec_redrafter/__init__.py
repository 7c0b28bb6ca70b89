"""ReDrafter (Recurrent Drafter, arXiv 2403.09919) for specdec.

A small recurrent drafter over the target's token embeddings and last hidden state proposes
W beams of length L by beam search; dynamic tree attention (``specdec.reference.tree``)
packs them into a prefix tree for one verification forward.

Modules: ``config`` (RedrafterConfig, weight names), ``reference`` (float64 NumPy drafter:
rnn_step, drafter_logits, beam_search, sample_chains, RedrafterDrafter), ``checkpoint``
(save / load / compatibility check / random drafters), ``plugin`` (registration).
"""
