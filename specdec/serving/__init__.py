"""Serving: ``specdec.Engine`` (``specdec/serving/engine.py``) behind an OpenAI-compatible HTTP
server.

``specdec.serving.text`` (incremental detokenization, stop strings) is used by the engine and
needs nothing beyond the core, as does ``specdec.serving.limits`` (the HTTP side's bounds);
``specdec.serving.app`` (the Starlette application), ``.guard`` (key, Host, content type and body
checks), ``.prepare`` with ``.body`` and ``.fields`` (a request parsed and checked),
``.protocol`` (uvicorn's connection, bounded), ``.metrics`` (Prometheus text) and ``.server``
(uvicorn) need the ``serve`` extra: ``pip install 'specdec[serve]'``.
"""
