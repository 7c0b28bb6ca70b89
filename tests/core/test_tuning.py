"""Measured choices (``specdec.tuning``): the fastest dtype, cached per machine and model
shape; the beam plan of ``specdec plan`` used by ``generate``; the prompt-lookup beam by default.

A fake backend over the numpy reference offers two "dtypes", one of which sleeps in every
forward: which one is faster is decided by construction, not by the machine's noise.
"""

from __future__ import annotations

import json
import time
import types

import attrs
import numpy as np
import pytest

import specdec
from specdec.tuning import dtype as tuning
from specdec.tuning import machine, plans, store
from specdec.generation.api import prepare
from specdec.bench.trust import FEW_PROMPTS as FEW  # fewer prompts: a choice is never kept
from specdec.generation.loading import load_with_choice
from specdec.plugins.hookspecs import hookimpl
from specdec.drafting.lookup import LookupDrafter
from specdec.plugins.registry import PluginRegistry
from specdec.plugins import builtin as numpy_plugin
from specdec.plugins.builtin import NumpyBackend
from specdec.testing import make_random_drafter, make_random_model

SLOW_SECONDS = 0.02  # every forward of the "slow" dtype sleeps this long: far above timing noise


class SlowTarget:
    """A reference target whose forward_tree sleeps (a dtype this machine runs slowly)."""

    def __init__(self, inner, dtype):
        self._inner, self.dtype = inner, dtype

    def __getattr__(self, name):
        return getattr(self._inner, name)

    def forward_tree(self, tree, slots, **options):
        if self.dtype == "slow":
            time.sleep(SLOW_SECONDS)
        return self._inner.forward_tree(tree, slots, **options)


class TwoDtypeBackend(NumpyBackend):
    name = "twodtype"

    def __init__(self, candidates=("slow", "fast")):
        self.candidates, self.loads = tuple(candidates), []

    def dtype_candidates(self, device=None):
        return self.candidates

    def describe_device(self, device=None):
        return f"test device {device}"

    def load_target(self, source, *, dtype=None, device=None, **slots):
        self.loads.append(dtype)
        if isinstance(source, SlowTarget):
            return source
        return SlowTarget(super().load_target(source, **slots), dtype or "fast")


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECDEC_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv(
        "SPECDEC_DTYPE", raising=False
    )  # measured here (conftest pins it for other tests)
    # the slow dtype sleeps, which would read as a machine shared with other work
    monkeypatch.setattr(machine, "free_share", lambda wall, cpu, others: 1.0)
    monkeypatch.setattr(machine, "machine_share", lambda wall, cpu: 1.0)
    return tmp_path / "cache"


def test_specdec_dtype_names_the_dtype_instead_of_measuring(model_dir, cache, monkeypatch):
    monkeypatch.setenv("SPECDEC_DTYPE", "slow")
    backend = TwoDtypeBackend()
    target, choice = tuning.load_fastest(backend, model_dir)
    assert (target.dtype, choice.source, backend.loads) == ("slow", "$SPECDEC_DTYPE", ["slow"])
    assert not (cache / "tuning").exists()


def test_fastest_dtype_is_measured_once_then_read_from_the_cache(model_dir, cache):
    backend = TwoDtypeBackend()
    target, choice = tuning.load_fastest(backend, model_dir)
    assert (choice.dtype, choice.source, target.dtype) == ("fast", "measured", "fast")
    assert set(choice.timings) == {"slow", "fast"} and set(choice.timings["slow"]) == set(
        tuning.TREE_SIZES
    )
    assert (
        min(choice.timings["slow"].values())
        >= 1e3 * SLOW_SECONDS
        > max(choice.timings["fast"].values())
    )
    assert backend.loads == ["slow", "fast"]
    files = list((cache / "tuning").glob("dtype-twodtype-*.json"))
    assert len(files) == 1 and json.loads(files[0].read_text())["dtype"] == "fast"

    backend.loads.clear()
    again, cached = tuning.load_fastest(backend, model_dir)
    assert (cached.dtype, cached.source, again.dtype) == ("fast", "cached", "fast")
    assert backend.loads == ["fast"], "a cached choice loads the model once, in the chosen dtype"
    assert "fast" in cached.describe() and "slow" in cached.describe()


def test_a_dtype_faster_for_one_token_alone_says_why_it_lost():
    """ "bfloat16 29.0 / 126.4 ms" beside float32's 48.8 / 70.7 read as bfloat16 decoding faster."""
    from specdec.tuning.dtype import DtypeChoice

    timings = {"float32": {1: 48.8, 8: 70.7}, "bfloat16": {1: 29.0, 8: 126.4}}
    said = DtypeChoice(dtype="float32", source="measured", timings=timings, device="cpu")
    assert said.describe().endswith(
        "; bfloat16 forwards one token faster (29.0 ms), but 8 tokens slower (126.4 ms): trees "
        "and prompts run the larger forwards"
    ), said.describe()
    won = DtypeChoice(dtype="bfloat16", source="measured", timings=timings, device="cpu")
    assert won.describe().endswith("; on cpu)"), won.describe()  # nothing beat it at one token


def test_the_cache_key_is_the_shape_not_the_weights(model_dir, cache, tmp_path):
    backend = TwoDtypeBackend()
    tuning.load_fastest(backend, model_dir)
    same_shape = make_random_model(
        tmp_path / "other-weights",
        vocab_size=96,
        hidden_size=32,
        num_layers=2,
        num_heads=4,
        num_kv_heads=2,
        seed=7,
    )
    assert tuning.load_fastest(backend, same_shape)[1].source == "cached"
    wider = make_random_model(
        tmp_path / "wider",
        vocab_size=96,
        hidden_size=48,
        num_layers=2,
        num_heads=4,
        num_kv_heads=2,
        seed=7,
    )
    assert tuning.load_fastest(backend, wider)[1].source == "measured"
    assert tuning.load_fastest(TwoDtypeBackend(("fast", "slow")), model_dir)[1].source == "cached"


def test_a_choice_measured_beside_other_work_is_measured_again_and_the_quieter_decides(
    model_dir, cache, monkeypatch, capsys
):
    """A start whose probe finds the machine quiet measures a busy choice again, and the quieter
    of the two measurements decides (the probe can be quiet while the measurement is not)."""
    slow_wins, fast_wins = {"slow": 10.0, "fast": 30.0}, {"slow": 30.0, "fast": 10.0}
    timings = iter([fast_wins, slow_wins, slow_wins])  # the three measurements' winners
    measured = iter(
        [{k: ms for k in tuning.TREE_SIZES} for t in timings for ms in t.values()]
    )  # per dtype, in candidate order ("slow", "fast")
    monkeypatch.setattr(tuning, "measure_forward", lambda backend, target: next(measured))
    shares = iter([0.5, 0.4, 0.7])
    monkeypatch.setattr(machine, "free_share", lambda wall, cpu, others: next(shares))
    monkeypatch.setattr(store, "quiet_now", lambda: True)  # each start's probe finds it quiet
    backend = TwoDtypeBackend()
    chosen = []
    for _ in range(3):
        store.forget_this_process()  # each load a new start
        target, choice = tuning.load_fastest(backend, model_dir)
        assert target.dtype == choice.dtype
        chosen.append((choice.dtype, choice.source))
    # 0.5: fast; 0.4 says slow but 0.5 was quieter: fast; 0.7 says slow: slow
    assert chosen == [("fast", "measured"), ("fast", "measured"), ("slow", "measured")]
    # the choice changed under a process that ran before: said once, with how to pin the old one
    # (a later process's greedy text differed from an earlier one's, with no word)
    lines = [line for line in capsys.readouterr().err.splitlines() if "is now" in line]
    assert lines == [
        "specdec: the dtype measured fastest here is now slow, not fast (measured while other "
        "work shared the cores): greedy outputs can differ from earlier runs' where they rounded "
        "apart; dtype='fast' pins the old one"
    ]
    (file,) = (cache / "tuning").glob("dtype-*.json")
    assert json.loads(file.read_text())["measures"] == 3


def test_a_choice_measured_busy_is_read_while_busy_and_measured_again_once_quiet(
    model_dir, cache, monkeypatch, capsys
):
    """Busy starts used to measure a busy choice again, three times: a minute per start of a
    two-slot target on the busy 2-core machine, for another busy figure. Now a busy start reads
    it (the probe's 0.3 s is its cost), and the first start that finds the machine quiet
    measures it again."""
    monkeypatch.setattr(machine, "free_share", lambda wall, cpu, others: 0.5)
    quiet = [False]
    monkeypatch.setattr(store, "quiet_now", lambda: quiet[0])
    backend = TwoDtypeBackend()
    sources = []
    for now_quiet in (False, False, False, True):
        quiet[0] = now_quiet
        store.forget_this_process()  # each load a new start
        sources.append(tuning.load_fastest(backend, model_dir)[1].source)
    assert sources == ["measured", "cached", "cached", "measured"]
    err = capsys.readouterr().err
    assert "and the machine is quiet now" in err
    # the busy choice in use says so, once (a busy first load chose bfloat16 on an AVX2-only CPU
    # with no word, where only the step costs' line said the machine had been busy)
    assert err.count("was chosen from timings taken while other work held 50% of the cores") == 1


def test_a_busy_reading_is_probed_again_and_the_lesser_kept(monkeypatch):
    """One probe caught a passing burst and torch ran a whole demo on one of two idle cores."""
    readings = iter([1.0, 0.1])
    monkeypatch.setattr(machine, "busy_cores", lambda seconds: next(readings))
    assert machine.steady_busy_cores() == 0.1
    readings = iter([0.2])  # below half a core: one probe is enough
    assert machine.steady_busy_cores() == 0.2
    readings = iter([1.0, 0.97])
    assert machine.steady_busy_cores() == 0.97


def test_the_quiet_probe_reads_the_machine_once_per_start(monkeypatch):
    """``quiet_now`` reads how many cores other processes keep busy (``busy_cores``, as the
    torch backend fits its threads): more than 1 - QUIET_SHARE of them reads busy; it is probed
    once per start."""
    probes, busy = [], [1.0]
    monkeypatch.setattr(store, "busy_cores", lambda seconds: probes.append(seconds) or busy[0])
    monkeypatch.setattr(store, "cores", lambda: 2)
    store.forget_this_process()
    assert store.quiet_now() is False and store.quiet_now() is False and len(probes) == 1
    busy[0] = 0.1  # 5% of two cores
    store.forget_this_process()
    assert store.quiet_now() is True and len(probes) == 2
    busy[0] = None  # a system that does not say: busy, as nothing can be known
    store.forget_this_process()
    assert store.quiet_now() is False
    # the torch threads' probe at this start found a core busy: not "quiet now" a moment later
    # (two stderr lines in a row said "1.0 of 2 cores busy elsewhere" and "the machine is quiet")
    from specdec.tuning import machine

    busy[0] = 0.1
    store.forget_this_process()
    monkeypatch.setattr(machine, "busy_cores", lambda seconds=0.3: 1.0)
    assert machine.steady_busy_cores() == 1.0
    assert store.quiet_now() is False


def test_a_choice_measured_beside_other_work_is_not_measured_again_in_the_same_process(
    model_dir, cache, monkeypatch, capsys
):
    """Taken again at the next start, not at every load: a busy machine pays it once per start,
    and the line says why it measures again (it read as a cache that does not work)."""
    measured = []
    real = tuning.measure_forward
    monkeypatch.setattr(tuning, "measure_forward", lambda b, t: measured.append(1) or real(b, t))
    monkeypatch.setattr(machine, "free_share", lambda wall, cpu, others: 0.5)
    store.forget_this_process()
    sources = [tuning.load_fastest(TwoDtypeBackend(), model_dir)[1].source for _ in range(3)]
    assert sources == ["measured", "cached", "cached"] and len(measured) == 2  # two dtypes, once
    assert "on this machine again" not in capsys.readouterr().err  # no line of measuring again
    monkeypatch.setattr(store, "quiet_now", lambda: True)
    store.forget_this_process()  # a new start that finds the machine quiet measures it again
    assert tuning.load_fastest(TwoDtypeBackend(), model_dir)[1].source == "measured"
    assert (
        "on this machine again: other work held 50% of the cores when it was measured, and the "
        "machine is quiet now (kept for later runs)" in capsys.readouterr().err
    )


def test_a_damaged_or_stale_cache_file_is_measured_again(model_dir, cache):
    backend = TwoDtypeBackend()
    tuning.load_fastest(backend, model_dir)
    (file,) = (cache / "tuning").glob("dtype-*.json")
    file.write_text("{not json")
    assert tuning.load_fastest(backend, model_dir)[1].source == "measured"
    file.write_text(json.dumps({"dtype": "float8"}))  # a dtype this backend no longer offers
    choice = tuning.load_fastest(backend, model_dir)[1]
    assert (choice.source, choice.dtype) == ("measured", "fast")
    assert tuning.load_fastest(backend, model_dir, remeasure=True)[1].source == "measured"


def test_one_candidate_or_a_model_object_is_not_measured(model_dir, cache):
    backend = TwoDtypeBackend(("fast",))
    target, choice = tuning.load_fastest(backend, model_dir)
    assert (choice.source, choice.dtype, backend.loads) == ("only candidate", "fast", ["fast"])
    assert not (cache / "tuning").exists()
    loaded = TwoDtypeBackend().load_target(model_dir, dtype="slow")
    target, choice = load_with_choice(TwoDtypeBackend(), loaded, dtype=None, device=None)
    assert target is loaded and choice.source == "the backend's default"


def _registry_with(backend_cls):
    plugin = types.ModuleType("twodtype_plugin")

    @hookimpl
    def specdec_register_backends(register):
        register("twodtype", backend_cls)

    plugin.specdec_register_backends = specdec_register_backends
    return PluginRegistry([numpy_plugin, plugin])


def test_generate_and_load_use_the_fastest_dtype(model_dir, cache):
    registry = _registry_with(TwoDtypeBackend)
    target = specdec.load(model_dir, backend="twodtype", registry=registry)
    assert target.dtype == "fast" and target.dtype_choice.source == "measured"
    assert (
        specdec.load(model_dir, backend="twodtype", registry=registry).dtype_choice.source
        == "cached"
    )
    assert (
        specdec.load(model_dir, backend="twodtype", dtype="slow", registry=registry).dtype == "slow"
    )
    assert (
        specdec.load(model_dir, backend="twodtype", dtype="auto", registry=registry).dtype == "fast"
    )


def test_the_torch_backend_offers_float32_and_bfloat16_on_the_cpu():
    pytest.importorskip("torch")
    from specdec_torch.backend import TorchBackend

    backend = TorchBackend()
    assert {"float32", "bfloat16"} <= set(backend.dtype_candidates("cpu"))
    described = backend.describe_device("cpu")
    assert (
        " thread" in described and "torch" in described and machine.cpu_description() in described
    )


@pytest.fixture(scope="module")
def redrafter(model_dir, tmp_path_factory):
    return make_random_drafter(
        tmp_path_factory.mktemp("rd") / "redrafter", model_dir, kind="redrafter", seed=3
    )


def _drafter_of(target, drafter, **options):
    plan, *_ = prepare(
        target,
        [1, 2],
        drafter,
        "numpy",
        max_new_tokens=4,
        temperature=options.pop("temperature", 0.0),
        top_k=None,
        top_p=None,
        dtype=None,
        device=None,
        registry=None,
        options=options,
    )
    return plan.drafter


def test_a_saved_beam_plan_is_used_when_no_beams_are_given(target, model_dir, redrafter, cache):
    default = _drafter_of(target, redrafter).inner
    plans.save_drafter_plan(
        NumpyBackend(),
        target,
        str(redrafter),
        options={"beam_width": 1, "beam_length": 2},
        details={"lookup": True},
    )
    planned = _drafter_of(target, redrafter).inner
    assert (
        (planned.beam_width, planned.beam_length)
        == (1, 2)
        != (default.beam_width, default.beam_length)
    )
    given = _drafter_of(target, redrafter, beam_width=3).inner
    assert given.beam_width == 3 and given.beam_length == default.beam_length, (
        "the caller's beams win"
    )
    other = make_random_drafter(cache.parent / "other-rd", model_dir, kind="redrafter", seed=4)
    assert _drafter_of(target, other).inner.beam_width == default.beam_width, (
        "a plan belongs to its drafter"
    )


@pytest.mark.parametrize(
    "made_on, used_on",
    [
        ("cpu X, 2 threads, torch 2.13", "cpu X, 1 thread, torch 2.13"),
        ("mlx 0.29 cpu, X, OpenBLAS on 2 threads", "mlx 0.29 cpu, X, OpenBLAS on 1 thread"),
    ],
)
def test_a_plan_serves_a_process_that_took_fewer_threads(cache, made_on, used_on):
    """A plan made on 2 threads was not found by a process whose start took 1 (other work beside
    it): generate used the checkpoint's beams with no word. The plan is the machine's, and says
    the count it was made on; another device or version is another plan."""

    class Backend:
        name = "torch"
        device = made_on

        def describe_device(self, device=None):
            return self.device

    backend, target = Backend(), types.SimpleNamespace(name="m", dtype="float32")
    plans.save_drafter_plan(backend, target, "rd", options={"beam_width": 2}, details={})
    backend.device = used_on
    found = plans.cached_drafter_plan(backend, target, "rd")
    assert found and found["options"] == {"beam_width": 2}
    assert "(torch, float32, made on 2 thread(s))" in plans.describe_plan(found)
    backend.device = used_on.replace("X", "Y")  # another CPU
    assert plans.cached_drafter_plan(backend, target, "rd") is None


@pytest.fixture(scope="module")
def eagle3(model_dir, tmp_path_factory):
    return make_random_drafter(
        tmp_path_factory.mktemp("e3") / "eagle3",
        model_dir,
        kind="eagle3",
        seed=5,
        top_k=4,
        depth=4,
        total_tokens=12,
    )


def test_a_tree_drafter_is_planned_one_setting_at_a_time_and_generate_uses_the_plan(
    target, model_dir, eagle3, cache, monkeypatch
):
    """The tree planner decodes each setting for real (``side_by_side``) and keeps the fastest; its
    rates are made up here (fastest at total_tokens=6, depth=3, tree_top_k=2, lookup on), so
    the search is tested, not the machine. Coordinate ascent, the checkpoint's own settings
    (12, 4, 4) until an option is reached: each option's candidates with the others at their
    best, then lookup on and off."""
    from specdec.bench import tree_planner

    decoded, real = [], tree_planner.side_by_side

    def made_up(target_, prompts, settings, **kw):
        out = real(target_, prompts, settings, **kw)
        made = {}
        for key, one in out.items():
            drafter, options = settings[key]
            decoded.append((drafter, {k: v for k, v in options.items() if k != "lookup"},
                            options.get("lookup")))  # fmt: skip
            if drafter == "none":
                made[key] = attrs.evolve(one, rates=np.ones_like(one.rates))
                continue
            settings_ = (
                options.get("total_tokens", 12),
                options.get("depth", 4),
                options.get("tree_top_k", 4),
            )
            distance = sum(abs(a - b) for a, b in zip(settings_, (6, 3, 2)))
            rate = 2.0 - 0.01 * distance + 0.05 * bool(options.get("lookup"))
            made[key] = attrs.evolve(  # 3 tokens/step: 2x
                one, rates=np.full_like(one.rates, rate), tokens_per_step=3.0
            )
        return made

    monkeypatch.setattr(tree_planner, "side_by_side", made_up)
    rows = _plan_eagle3(model_dir, eagle3)
    best = rows[0]
    assert best.options == {"total_tokens": 6, "depth": 3, "tree_top_k": 2} and best.lookup
    assert best.speedup == pytest.approx(2.05) and rows[-1].speedup < best.speedup
    # first, untimed, what generate decodes now: its first call's costs counted against it
    tried = [d for d in decoded if d[0] != "none"]  # the warm-up is not among them: untimed
    assert len(tried) == len({(tuple(sorted(o.items())), lk) for _, o, lk in tried}) == len(rows)
    assert len(tried) == 1 + 6 + 5 + 3 + 1  # not 6 x 5 x 3 x 2
    # first what generate decodes now, shown and never chosen; then each names a setting, so
    # that no plan kept before stands in for the checkpoint's own
    (now,) = [r for r in rows if r.current]
    assert tried[0][1:] == ({}, None) and (now.options, now.lookup) == ({}, None)
    assert now.speedup == pytest.approx(1.91)  # the checkpoint's own (12, 4, 4), not chosen
    assert all(options for _, options, _ in tried[1:])
    # plain decoding beside each option's candidates (generate's setting with the first's), and
    # beside lookup's
    assert [d[0] for d in decoded].count("none") == 3 + 1

    planned = _drafter_of(target, eagle3)
    assert isinstance(planned, LookupDrafter), "the plan's lookup beam rides along"
    assert (planned.inner.total_tokens, planned.inner.depth, planned.inner.top_k) == (6, 3, 2)
    given = _drafter_of(target, eagle3, depth=2)
    assert (given.total_tokens, given.depth, given.top_k) == (12, 2, 4), "the caller's win"
    assert not isinstance(given, LookupDrafter)


def test_the_tree_planner_refuses_a_drafter_without_tree_settings(model_dir, redrafter):
    from specdec.bench.tree_planner import plan_tree
    from specdec.errors import InvalidInputError

    with pytest.raises(InvalidInputError, match="no tree settings to plan.*eagle3"):
        plan_tree(model_dir, str(redrafter), ["a"], backend="numpy")


def test_tree_settings_the_drafter_refuses_name_the_settings_not_the_checkpoint(target, eagle3):
    from specdec.errors import InvalidInputError

    with pytest.raises(InvalidInputError, match=r"total_tokens=2 cannot hold.*given: depth=4"):
        _drafter_of(target, eagle3, depth=4, total_tokens=2)


def test_the_lookup_beam_is_on_by_default_beside_redrafter(target, redrafter):
    assert isinstance(_drafter_of(target, redrafter), LookupDrafter)
    assert not isinstance(_drafter_of(target, redrafter, lookup=False), LookupDrafter)
    assert isinstance(_drafter_of(target, redrafter, temperature=0.8), LookupDrafter), (
        "exact verifier: kept"
    )
    assert not isinstance(
        _drafter_of(target, redrafter, temperature=0.8, sample=True), LookupDrafter
    )
    assert not isinstance(
        _drafter_of(target, redrafter, verifier="typical", temperature=0.8), LookupDrafter
    )
    assert not isinstance(_drafter_of(target, "none"), LookupDrafter)


def test_greedy_output_with_the_default_lookup_beam_is_plain_decoding(target, redrafter):
    prompts = [
        [5, 6, 7, 5, 6, 7, 5, 6],
        [9, 10, 9, 10, 9, 10],
    ]  # repeating: the lookup beam finds matches
    plain = specdec.generate(target, prompts, drafter="none", backend="numpy", max_new_tokens=12)
    spec = specdec.generate(target, prompts, drafter=redrafter, backend="numpy", max_new_tokens=12)
    alone = specdec.generate(
        target, prompts, drafter=redrafter, backend="numpy", max_new_tokens=12, lookup=False
    )
    assert spec.tokens == plain.tokens == alone.tokens
    # this random target repeats itself, which the lookup beam copies and the random ReDrafter
    # cannot
    assert spec.stats.accepted_tokens > alone.stats.accepted_tokens == 0
    assert spec.stats.steps < alone.stats.steps


class QuietClock:
    """A measurement clock that reads as taken on a quiet machine (the tests' timings are made
    up; the machine running them may be busy)."""

    wall, cpu, share, others, quiet = 1.0, 1.0, 1.0, 0.0, True

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return None


class BusyClock(QuietClock):
    wall, cpu, share, others, quiet = 1.0, 0.5, 0.5, 0.5, False


def as_side_by_side(made_up):
    """``side_by_side`` from a made-up decode, ``made_up(target, prompts, drafter, options,
    lookup, backend, tokens) -> (tokens/s, tokens/step, nodes/step)``, so the search is tested,
    not the machine; each setting's own clock is ``side_by_side.Measured``, read as it ends."""
    from specdec.bench import side_by_side as sbs

    def fake(
        target, prompts, settings, *, backend, tokens, clock, stop_at_eos=True, on_decode=None
    ):
        out = {}
        for key, (drafter, options) in settings.items():
            options = dict(options)
            lookup = options.pop("lookup", None)
            rate, tau, nodes = made_up(target, prompts, drafter, options, lookup, backend, tokens)
            out[key] = sbs.Decoded(
                rates=np.full(len(prompts), float(rate)), emitted=len(prompts),
                seconds=len(prompts) / float(rate), tokens_per_step=tau, nodes_per_step=nodes,
                busy=not sbs.Measured().quiet,
            )  # fmt: skip
        return out

    return fake


def _plan_eagle3(model_dir, eagle3, clock=None, prompts=("a b c",) * FEW):
    """The tree planner on the EAGLE-3 head over short prompts (as many as a choice kept needs),
    saving its choice."""
    from specdec.bench import tree_planner

    return tree_planner.plan_tree(
        model_dir,
        str(eagle3),
        list(prompts),
        backend="numpy",
        max_new_tokens=4,
        save=True,
        clock=clock if clock is not None else QuietClock(),
    )


@pytest.fixture(autouse=True)
def quiet_rows(monkeypatch):
    """Each planned row's own clock reads as quiet: the machine running the tests may be busy,
    and the rules for a busy row are tested by name below."""
    from specdec.bench import planner, side_by_side, tree_planner

    monkeypatch.setattr(planner, "Measured", QuietClock)
    monkeypatch.setattr(tree_planner, "Measured", QuietClock)
    monkeypatch.setattr(side_by_side, "Measured", QuietClock)


@pytest.mark.parametrize("case", ["busy", "impossible"])
def test_the_tree_planner_keeps_nothing_it_cannot_trust(
    target, model_dir, eagle3, cache, monkeypatch, case
):
    """A choice measured while other work shared the machine, or one whose speedup is above the
    tokens per step it rests on (no drafting step is cheaper than a plain one), is not kept:
    generate goes on with the checkpoint's own settings (specdec.bench.trust)."""
    from specdec.bench import tree_planner

    def made_up(target_, prompts, drafter, options, lookup, backend, tokens):
        if drafter == "none":
            return 1.0, 1.0, 1.0
        return 2.0 + 0.01 * options.get("total_tokens", 12), 3.0 if case == "busy" else 1.4, 9.0

    monkeypatch.setattr(tree_planner, "side_by_side", as_side_by_side(made_up))
    clock = BusyClock() if case == "busy" else QuietClock()
    rows = _plan_eagle3(model_dir, eagle3, clock)
    assert rows[0].speedup > 2.0
    kept = _drafter_of(target, eagle3)
    assert (kept.total_tokens, kept.depth, kept.top_k) == (12, 4, 4), case


def test_the_tree_planner_on_a_machine_busy_throughout_ranks_its_rows_and_keeps_none(
    target, model_dir, eagle3, cache, monkeypatch
):
    """Every setting timed beside other work: the search goes on by the busy figures, the rows
    come back marked (not "refused every tree setting", as when only quiet rows could lead the
    search), and nothing is kept."""
    from specdec.bench import side_by_side as sbs
    from specdec.bench import tree_planner

    def made_up(target_, prompts, drafter, options, lookup, backend, tokens):
        if drafter == "none":
            return 1.0, 1.0, 1.0
        return 1.0 + 0.01 * options.get("total_tokens", 12), 2.0, 9.0

    monkeypatch.setattr(tree_planner, "side_by_side", as_side_by_side(made_up))
    monkeypatch.setattr(sbs, "Measured", BusyClock)
    rows = _plan_eagle3(model_dir, eagle3, BusyClock())
    assert rows and all(r.busy for r in rows)
    assert rows[0].options.get("total_tokens") == max(
        r.options.get("total_tokens", 12) for r in rows
    )
    kept = _drafter_of(target, eagle3)
    assert (kept.total_tokens, kept.depth, kept.top_k) == (12, 4, 4)


def test_the_beam_planner_keeps_nothing_it_cannot_trust(model_dir, tmp_path, cache):
    """``keep``: a busy machine, an impossible prediction, a measured speedup far from its
    prediction: each refused with its reason, nothing saved; a sound choice is saved."""
    from specdec.bench.planner import PlanRow, keep
    from specdec.testing import make_random_drafter

    drafter = str(make_random_drafter(tmp_path / "rd", model_dir, kind="redrafter", seed=2))
    row = PlanRow(
        beam_width=2,
        beam_length=3,
        tokens_per_step=2.0,
        tree_size=5.0,
        verify_ms=1.0,
        draft_ms=1.0,
        predicted_speedup=1.6,
    )
    options = dict(backend="numpy", dtype=None, lookup=False, prompts=FEW)
    assert "other work" in keep(model_dir, drafter, row, BusyClock(), **options)[0]
    # a plan on two prompts kept beams that measured 1.26x against generate's 1.22x: noise
    assert keep(model_dir, drafter, row, QuietClock(), **{**options, "prompts": 2}) == [
        f"it was measured on 2 prompt(s), fewer than {FEW}, where one run's noise moves a "
        "setting by tens of percent"
    ]
    impossible = attrs.evolve(row, predicted_speedup=6.5)
    assert "above its 2.00 tokens per step" in " ".join(
        keep(model_dir, drafter, impossible, QuietClock(), **options)
    )
    far = attrs.evolve(row, measured_speedup=0.4)
    assert "far from the predicted 1.60x" in " ".join(
        keep(model_dir, drafter, far, QuietClock(), **options)
    )
    assert keep(model_dir, drafter, row, QuietClock(), **options) == []


def test_the_beam_planner_never_replaces_a_setting_with_a_slower_one(model_dir, tmp_path, cache):
    """``keep`` with what generate uses now measured beside the candidates: a candidate that
    measured no faster (or was not decoded) is refused, naming both; a faster one is kept."""
    from specdec.bench.planner import Current, PlanRow, keep
    from specdec.testing import make_random_drafter

    drafter = str(make_random_drafter(tmp_path / "rd", model_dir, kind="redrafter", seed=2))
    row = PlanRow(
        beam_width=8,
        beam_length=5,
        tokens_per_step=1.3,
        tree_size=18.0,
        verify_ms=1.0,
        draft_ms=1.0,
        predicted_speedup=1.18,
        measured_speedup=1.15,
    )
    now = Current(beam_width=2, beam_length=3, lookup=True, speedup=1.63)
    options = dict(backend="numpy", dtype=None, lookup=True, prompts=FEW)
    (reason,) = keep(model_dir, drafter, row, QuietClock(), current=now, **options)
    assert "measured 1.15x, no faster than the 1.63x" in reason, reason
    assert "beam_width=2 beam_length=3, with the prompt-lookup beam" in reason, reason
    untried = attrs.evolve(row, measured_speedup=None)
    assert "was not decoded" in " ".join(
        keep(model_dir, drafter, untried, QuietClock(), current=now, **options)
    )
    # a lead of 1% is noise (the full plan kept W=1 L=2 at 1.12x over generate's 1.11x)
    (reason,) = keep(
        model_dir, drafter, row, QuietClock(), current=attrs.evolve(now, speedup=1.14), **options
    )
    assert "measured 1.15x, within 5% of the 1.14x (a lead that small is one plan's noise" in reason
    slower_now = attrs.evolve(now, speedup=1.05)
    assert keep(model_dir, drafter, row, QuietClock(), current=slower_now, **options) == []


def test_the_beam_planner_records_and_times_steps_that_all_draft(model_dir, tmp_path, monkeypatch):
    """Under speculation="auto" a step may decode plainly; the planner's recorded run (each
    step's beams against that step's tokens) and its step timings must draft at every step, or
    its drafts pair with other steps' tokens and its draft times with plain steps."""
    from specdec.bench import planner
    from specdec.testing import make_random_drafter

    drafter = make_random_drafter(tmp_path / "d", model_dir, kind="redrafter", seed=1)
    calls, real = [], planner.specdec.stream

    def stream(*args, **kwargs):
        calls.append((kwargs.get("drafter"), kwargs.get("speculation")))
        return real(*args, **kwargs)

    monkeypatch.setattr(planner.specdec, "stream", stream)
    planner.plan(
        model_dir,
        str(drafter),
        [[1, 2, 3]],
        backend="numpy",
        widths=(1, 2),
        lengths=(2, 3),
        max_new_tokens=6,
    )
    drafting = [speculation for choice, speculation in calls if choice != "none"]
    assert drafting and set(drafting) == {"always"}, calls


def test_every_beam_prediction_divides_by_one_plain_step(model_dir, tmp_path, monkeypatch):
    """Each shape's prediction divided by a plain step timed just before it, once: on a quiet
    machine one and the same plain step timed 41-63 ms, which moved predictions by half again
    and reordered the shapes. The median of the plain steps timed beside the shapes serves all.
    The shapes are timed in rounds, each shape once a round, after an untimed round: timed one
    after another, the first paid the first forwards at its tree sizes (a 3-node tree at 31.7 ms
    beside a 3.4-node one at 18.6)."""
    from specdec.bench import planner
    from specdec.testing import make_random_drafter

    drafter = make_random_drafter(tmp_path / "d", model_dir, kind="redrafter", seed=1)
    calls, shapes = [], 4
    by_round = [0.5, 0.040, 0.063, 0.042]  # the plain step of each round: the first warms up

    def timed(target, drafter, prompt, *, backend):  # plain: its round's figure; a shape: 0.05 s
        calls.append(drafter)
        step = (0.0, by_round[(len(calls) - 1) // (2 * shapes)], 0.0)
        return [step] * 4 if drafter == "none" else [(0.01, 0.04, 0.0)] * 4

    monkeypatch.setattr(planner, "step_seconds", timed)
    rows = planner.plan(
        model_dir, str(drafter), [[1, 2, 3]], backend="numpy", widths=(1, 2), lengths=(2, 3),
        max_new_tokens=6, clock=QuietClock(),
    )  # fmt: skip
    assert {round(r.plain_ms, 3) for r in rows} == {42.0}, rows
    for r in rows:
        assert r.predicted_speedup == pytest.approx(r.tokens_per_step * 0.042 / 0.05)
    assert len(calls) == 2 * shapes * 4  # a plain and a shape's steps, each shape, four rounds
    drafting = [c for c in calls if c != "none"]
    first, last = drafting[:shapes], drafting[-shapes:]  # the order reverses every other round
    assert len({id(c) for c in first}) == shapes and [id(c) for c in first] == [
        id(c) for c in last[::-1]
    ]


def test_a_shape_timed_while_other_work_ran_is_marked_and_never_kept(
    model_dir, tmp_path, monkeypatch, cache
):
    """One plan row timed during a burst of other work read 0.08x (verify 588 ms) beside rows of
    1.4x, and nothing said so, since the whole run's share of the cores stayed high. Each shape
    now has its own clock: a busy one is marked, and such a row is not kept; a plan that
    recommends what generate uses already says there is nothing to save."""
    from specdec.bench import planner
    from specdec.bench.planner import Current, PlanRow, keep
    from specdec.testing import make_random_drafter

    drafter = str(make_random_drafter(tmp_path / "d", model_dir, kind="redrafter", seed=1))
    clocks = iter([QuietClock(), BusyClock(), QuietClock(), QuietClock()])
    monkeypatch.setattr(planner, "Measured", lambda: next(clocks, QuietClock()))
    rows = planner.plan(
        model_dir,
        drafter,
        [[1, 2, 3]],
        backend="numpy",
        widths=(1, 2),
        lengths=(2, 3),
        max_new_tokens=6,
        clock=QuietClock(),
    )
    busy = [(r.beam_width, r.beam_length) for r in rows if r.busy]
    assert busy == [(1, 3)], rows  # the second shape timed, (1, 2) (1, 3) (2, 2) (2, 3)
    row = PlanRow(
        beam_width=2,
        beam_length=3,
        tokens_per_step=2.0,
        tree_size=5.0,
        verify_ms=1.0,
        draft_ms=1.0,
        predicted_speedup=1.6,
        busy=True,
    )
    options = dict(backend="numpy", dtype=None, lookup=True, prompts=FEW)
    assert "timed while other work" in " ".join(
        keep(model_dir, drafter, row, QuietClock(), **options)
    )
    now = Current(beam_width=2, beam_length=3, lookup=True, speedup=1.5)
    quiet = attrs.evolve(row, busy=False, measured_speedup=1.6)
    assert keep(model_dir, drafter, quiet, QuietClock(), current=now, **options) == [
        "it is what generate uses now (beam_width=2 beam_length=3, with the prompt-lookup beam)"
    ]


def test_a_measurement_says_so_wherever_stderr_goes(capsys):
    """A first call that measures (seconds to a minute) said why on a terminal only: in a
    notebook or a script's log, calls of 17-36 s came with no word."""
    from specdec.tuning.store import say_measuring

    say_measuring("what a step of m costs")
    assert capsys.readouterr().err == (
        "specdec: measuring what a step of m costs on this machine (kept for later runs)\n"
    )


def test_exact_mode_checked_at_several_tree_sizes_says_so_once(cache, capsys, monkeypatch):
    """A tree plan tries several tree sizes, each checked by the decoding guard (seconds
    apiece): each is measured, but the line saying so came once per size, a column of near
    copies; it now comes once per dtype and row count in a process."""
    from specdec.tuning import exactness

    monkeypatch.setattr(exactness, "_SAID", set())
    runs = []

    def run():
        runs.append(1)
        return exactness.InvarianceCheck(holds=True)

    key = {"backend": "torch", "dtype": "torch.bfloat16", "rows": 1}
    for nodes in (7, 11, 17):
        assert exactness.cached_check({**key, "max_nodes": nodes}, run).holds
    exactness.cached_check({**key, "rows": 4, "max_nodes": 7}, run)
    assert len(runs) == 4  # every size measured
    lines = capsys.readouterr().err.splitlines()
    assert [line.split(" for ", 1)[1] for line in lines] == [
        "trees of up to 7 nodes in 1 row on this machine (kept for later runs)",
        "trees of up to 7 nodes in 4 rows on this machine (kept for later runs)",
    ]


def test_a_tree_setting_decoded_while_other_work_ran_is_marked_and_not_chosen(
    target, model_dir, eagle3, cache, monkeypatch
):
    """The tree planner times each setting on its own clock too: the fastest-looking setting,
    decoded during a burst of other work, is marked busy, ranked after the sound ones and not
    kept."""
    from specdec.bench import side_by_side as sbs
    from specdec.bench import tree_planner

    decoding = {}  # the setting being decoded

    def made_up(target_, prompts, drafter, options, lookup, backend, tokens):
        decoding["total_tokens"] = options.get("total_tokens")
        if drafter == "none":
            return 1.0, 1.0, 1.0
        return 1.5 + (0.5 if options.get("total_tokens") == 16 else 0.0), 2.0, 9.0

    class Clock(QuietClock):  # busy exactly while total_tokens=16 was decoded
        @property
        def quiet(self):
            return decoding.get("total_tokens") != 16

    monkeypatch.setattr(tree_planner, "side_by_side", as_side_by_side(made_up))
    monkeypatch.setattr(sbs, "Measured", Clock)
    rows = _plan_eagle3(model_dir, eagle3)
    busy = [r for r in rows if r.busy]
    assert busy and all(r.options.get("total_tokens") == 16 for r in busy), rows
    assert not rows[0].busy and rows[-1].busy
    assert _drafter_of(target, eagle3).total_tokens != 16  # the busy setting was not kept


def test_a_tree_plan_keeps_no_setting_that_decoded_like_generates_or_ran_no_faster():
    """A plan at --limit 2 kept total_tokens=6 at 1.49x over generate's setting at 1.06x, both
    decoding the same trees (1.92 tokens, 7.9 nodes per step): noise, saved as a choice."""
    from specdec.bench.tree_planner import TreePlanRow, why_not_kept

    def row(speedup, tokens, nodes, current=False, **options):
        return TreePlanRow(
            options=options, lookup=True, tokens_per_step=tokens, nodes_per_step=nodes,
            speedup=speedup, current=current,
        )  # fmt: skip

    now = row(1.06, 1.92, 7.9, current=True)
    assert "the same tokens and nodes per step as generate's setting now" in " ".join(
        why_not_kept([row(1.49, 1.92, 7.9, total_tokens=6), now], QuietClock())
    )
    assert "no faster than the 1.50x of generate's setting now" in " ".join(
        why_not_kept(
            [row(1.50, 1.92, 7.9, current=True), row(1.45, 2.1, 9.0, depth=3)], QuietClock()
        )
    )
    assert "1.10x, within 5% of the 1.06x" in " ".join(
        why_not_kept([row(1.10, 2.1, 9.0, depth=3), now], QuietClock())
    )
    assert why_not_kept([row(1.6, 2.1, 9.0, depth=3), now], QuietClock()) == []
    # nearly the same trees as generate's (2.15 against 2.17 tokens, 9.2 nodes a step): kept at
    # 1.53x over 1.35x, which bench measured tied
    close = row(1.35, 2.17, 9.2, current=True)
    said = " ".join(why_not_kept([row(1.53, 2.15, 9.2, total_tokens=16), close], QuietClock()))
    assert "nearly the same tokens and nodes per step as generate's setting now" in said, said
    # a lead smaller than the plan's own noise: rows of the same trees 20% apart in its table
    twins = [row(1.2, 1.8, 6.0, depth=2), row(1.0, 1.8, 6.0, depth=3)]
    assert why_not_kept([row(1.6, 2.1, 9.0, depth=4), now, *twins], QuietClock()) == []  # 51%
    said = " ".join(why_not_kept([row(1.2, 2.1, 9.0, depth=4), now, *twins], QuietClock()))
    assert (
        "a lead within this plan's own noise (rows that decoded the same trees measured up " in said
    )
    assert "to 20% apart)" in said, said


def test_a_one_thread_measurement_on_an_idle_machine_reads_as_quiet(monkeypatch):
    """A small model's step-cost measurement runs one thread (Python more than arithmetic): by
    its own CPU share it computed on half of two cores, and read as taken beside other work at
    every start ("other work held 50% of the cores", on an idle machine). It is judged by what
    the other processes computed."""
    monkeypatch.setattr(machine, "cores", lambda: 2)
    # one second of wall time, one CPU-second of its own, the machine computed just that
    assert machine.machine_share(1.0, 1.0) == 0.5
    assert machine.free_share(1.0, 1.0, 1.0) == 1.0
    # another process kept one core busy meanwhile
    assert machine.free_share(1.0, 1.0, 2.0) == 0.5
    # where the system does not say, its own share
    assert machine.free_share(1.0, 1.0, None) == 0.5


def test_the_cpu_class_names_the_machines_as_the_docs_figures_do():
    """The demo's header named the CPU by model and a digest of its flags, and a reader grepped
    /proc/cpuinfo to learn which of the README's rows (AVX-512 BF16 and AMX, AVX2 only) was
    theirs."""
    assert machine.cpu_class(frozenset({"avx2", "avx512f", "avx512_bf16", "amx_bf16"})) == (
        "AVX-512 BF16 and AMX"
    )
    assert machine.cpu_class(frozenset({"avx2", "avx512f", "avx512_bf16"})) == (
        "AVX-512 BF16, no AMX"
    )
    assert machine.cpu_class(frozenset({"avx2", "fma"})) == "AVX2 only"
    assert machine.cpu_class(frozenset()) == ""
