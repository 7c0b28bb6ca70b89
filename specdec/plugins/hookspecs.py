"""pluggy hook specifications of the ``specdec`` project.

A plugin is a module with ``@specdec.hookimpl`` functions, found through an entry point in
group ``specdec``. Factories should import their framework lazily, inside the factory.
"""

from __future__ import annotations

import pluggy

hookspec = pluggy.HookspecMarker("specdec")
hookimpl = pluggy.HookimplMarker("specdec")


@hookspec
def specdec_register_backends(register):
    """Call ``register(name, factory)``; ``factory()`` returns a ``Backend``."""


@hookspec
def specdec_register_drafters(register):
    """Call ``register(name, backend, factory)`` (backend ``"*"``: every backend);
    ``factory(target, checkpoint, *, backend, **options)`` returns a ``Drafter`` for ``target``;
    ``checkpoint`` is a path or None; ``backend`` is the Backend object the target runs on.
    See docs/writing-a-drafter.md."""


@hookspec
def specdec_register_drafter_specs(register):
    """Call ``register(spec)`` with a ``specdec.plugins.specs.DrafterSpec``: the drafter's name,
    checkpoint ``model_type``, implementations per backend (registered as drafters), training and
    random-checkpoint makers. A drafter package registers one spec instead of drafters."""


@hookspec
def specdec_register_tree_builders(register):
    """Call ``register(name, backend, factory)``; ``factory(**options)`` returns a
    ``TreeBuilder``."""


@hookspec
def specdec_register_verifiers(register):
    """Call ``register(name, backend, factory, lossless=bool)``; ``factory(**options)`` returns a
    ``Verifier``. ``lossless=False`` marks rules that change the output distribution."""
