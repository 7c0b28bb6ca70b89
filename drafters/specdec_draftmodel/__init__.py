"""Draft-model speculative decoding for specdec: a smaller model with the target's tokenizer drafts
a chain of K tokens, keeping its own KV cache as a second target on the target's backend.

Modules: ``drafter`` (DraftModelDrafter, chain_tree), ``checkpoint`` (loading the draft model,
the tokenizer check, the drafter folder and random ones for tests), ``plugin`` (registration).
See docs/algorithms/draft-model.md.
"""
