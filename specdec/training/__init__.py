"""Distilling drafters from their target (needs ``pip install 'specdec[train]'``: torch,
transformers).

- ``specdec.training.corpus``: chat prompts from text that ships with the machine (the Python
  standard library, the Python docs, Shakespeare), seeded, with a held-out split;
- ``specdec.training.teacher``: the target's greedy continuations with its hidden states and
  top-k soft labels, cached on disk by the target's fingerprint and the settings;
- ``specdec.training.evaluate``: windows of teacher data and held-out tokens per step computed
  offline (a replay of greedy speculative decoding over the continuations);
- ``specdec.training.loop``: the distillation loss, schedule, evaluation and resumable checkpoints;
- ``specdec.training.run``: everything in one call (``specdec train NAME``).

The drafter-specific parts live with each drafter, reached through its spec
(``specdec.plugins.specs.DrafterSpec``: ``train``, ``evaluation_task``). Importing ``specdec`` never
imports this package.
"""
