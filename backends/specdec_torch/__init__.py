"""specdec's PyTorch backend: ``transformers`` Llama-family targets with tree attention over their
own KV cache, vectorised tree builders and verifiers; cpu, cuda and mps through one code path.

Importing this package (or its ``plugin`` module) does not import torch; the factories do.
Modules: ``backend`` (``TorchBackend``), ``loading`` and ``model`` (``TorchTarget``), ``kvcache``,
``layers``, ``sampling``, ``tree`` (prefix and static trees), ``verify`` and ``verify_lossy``;
``ops``, the public array operations drafters use (the only module a drafter package imports).
"""
