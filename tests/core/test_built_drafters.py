"""A drafter built by name is kept with its target for the next call that asks for the same
(specdec/generation/built.py): built afresh per call, the default ReDrafter cost 0.115 s of
every generate call on SmolLM2-135M."""

import os
import time

import specdec


def test_the_same_drafter_is_built_once_per_target_and_options(target, tmp_path, model_dir):
    from specdec.testing import make_random_drafter

    folder = make_random_drafter(tmp_path / "rd", model_dir, kind="redrafter", seed=3)

    def plan(**options):
        return specdec.decode_plan(target, str(folder), "numpy", lookup=False, **options)

    first = plan(beam_width=2, beam_length=3).drafter
    assert plan(beam_width=2, beam_length=3).drafter is first
    assert plan(beam_width=1, beam_length=3).drafter is not first  # other options
    elsewhere = specdec.load(model_dir, backend="numpy", slots=4)
    assert (
        specdec.decode_plan(elsewhere, str(folder), "numpy", beam_width=2, beam_length=3).drafter
        is not first
    )
    # a head written again into the same folder is read again
    later = time.time() + 5
    for f in folder.iterdir():
        os.utime(f, (later, later))
    assert plan(beam_width=2, beam_length=3).drafter is not first


def test_another_registry_with_that_name_builds_its_own(target):
    """Two registries that register one name with different factories each get their own."""
    from specdec.plugins import builtin as numpy_plugin

    made = []

    def registry_with(kind):
        import types

        plugin = types.ModuleType(f"plugin_{kind}")

        @specdec.hookimpl
        def specdec_register_drafters(register):
            def factory(target, checkpoint=None, *, backend):
                made.append(kind)
                return (
                    specdec.default_registry()
                    .get("drafter", "none", "numpy")
                    .factory(target=target, checkpoint=None, backend=backend)
                )

            register("mine", "numpy", factory)

        plugin.specdec_register_drafters = specdec_register_drafters
        return specdec.PluginRegistry([numpy_plugin, plugin])

    one, two = registry_with("one"), registry_with("two")
    for registry in (one, one, two, two):
        specdec.decode_plan(target, "mine", "numpy", registry=registry)
    assert made == ["one", "two"]


def test_a_plugin_factory_that_fails_is_named_with_its_distribution(target):
    """A bug in a third-party drafter's factory came out as a bare TypeError some twelve frames
    deep in specdec, naming neither the drafter nor whose code raised it."""
    import types

    import pytest

    from specdec.errors import PluginError
    from specdec.plugins import builtin as numpy_plugin

    plugin = types.ModuleType("broken_plugin")

    @specdec.hookimpl
    def specdec_register_drafters(register):
        def factory(target, checkpoint=None, *, backend):
            raise TypeError("'tokenizers.Encoding' object is not iterable")  # the plugin's bug

        register("broken", "numpy", factory)

    plugin.specdec_register_drafters = specdec_register_drafters
    registry = specdec.PluginRegistry([numpy_plugin, plugin])
    with pytest.raises(PluginError) as raised:
        specdec.decode_plan(target, "broken", "numpy", registry=registry)
    message = str(raised.value)
    assert "drafter 'broken' (plugin 'broken_plugin'" in message, message
    assert "failed while building its drafter: " in message and raised.value.__cause__ is not None
