"""What "auto" learnt is kept for the next generation on the same target and drafting setting
(specdec/decode/memory.py): generate() made a fresh policy per call, and each call spent its
first steps measuring again what the call before had measured."""

import specdec
from specdec.decode.budget import Speculation
from specdec.decode.loop import Decoder, decode_steps


def _run(plan, prompt=(5, 6, 7, 5, 6, 7)):
    for _ in decode_steps(plan, [list(prompt)]):
        pass


def test_a_generation_takes_over_what_the_last_one_on_the_target_learnt(target):
    plan = specdec.decode_plan(target, "lookup", "numpy", speculation="auto")
    _run(plan)
    first = Decoder(plan).speculation
    learnt = first.realized.describe()
    assert learnt, "the generation's steps were not measured"
    first._rows[99, 0] = object()  # a request's own estimate is not carried
    second = Decoder(plan).speculation
    assert second is first
    assert second.realized.describe() == learnt
    assert (99, 0) not in second._rows
    assert second.realized._seen == set()  # a new drafter's first calls are not priced
    # a plan made again with the same names and options is the same setting
    again = specdec.decode_plan(target, "lookup", "numpy", speculation="auto")
    assert Decoder(again).speculation is first


def test_another_setting_target_or_mode_starts_afresh(target, model_dir):
    plan = specdec.decode_plan(target, "lookup", "numpy", speculation="auto")
    kept = Decoder(plan).speculation
    other = specdec.decode_plan(target, "lookup", "numpy", speculation="auto", draft_length=3)
    assert Decoder(other).speculation is not kept
    elsewhere = specdec.load(model_dir, backend="numpy", slots=4)
    plan_elsewhere = specdec.decode_plan(elsewhere, "lookup", "numpy", speculation="auto")
    assert Decoder(plan_elsewhere).speculation is not kept
    always = specdec.decode_plan(target, "lookup", "numpy", speculation="always")
    assert Decoder(always).speculation is not Decoder(always).speculation
    mine = Speculation("auto")  # the caller's own object is the caller's memory: used as given
    assert Decoder(
        specdec.decode_plan(target, "lookup", "numpy", speculation=mine)
    ).speculation is (mine)
    assert Decoder(plan).speculation is kept


def test_a_drafter_object_is_its_own_setting(target):
    plans = []
    for length in (3, 4):  # two drafter objects (one name and options build one, kept)
        drafter = specdec.decode_plan(target, "lookup", "numpy", draft_length=length).drafter
        plans.append(specdec.decode_plan(target, drafter, "numpy", speculation="auto"))
    assert plans[0].setting is None
    first = Decoder(plans[0]).speculation
    assert Decoder(plans[0]).speculation is first
    assert Decoder(plans[1]).speculation is not first  # another object
