"""The plugin host (specs, registry, loading), the built-in ``numpy`` plugin, drafter export."""
