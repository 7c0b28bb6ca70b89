"""Serving: ``specdec.Engine`` (``specdec/engine.py``) behind an OpenAI-compatible HTTP server.

``specdec.serving.text`` (incremental detokenization, stop strings) is used by the engine and
needs nothing beyond the core; ``specdec.serving.app`` (the Starlette application),
``specdec.serving.metrics`` (Prometheus text) and ``specdec.serving.server`` (uvicorn) need the
``serve`` extra: ``pip install 'specdec[serve]'``.
"""
