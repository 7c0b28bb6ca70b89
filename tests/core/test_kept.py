"""``specdec.decode.kept.KeptWithTarget``: values kept with a target, bounded, held weakly."""

import gc

from specdec.decode.kept import KeptWithTarget


class Target:
    pass


def test_the_least_recently_used_goes_first_and_all_go_with_the_target():
    kept, target, other = KeptWithTarget(2), Target(), Target()
    kept.put(target, "a", 1)
    kept.put(target, "b", 2)
    assert kept.get(target, "a") == 1  # "a" is now the most recently used
    kept.put(target, "c", 3)
    assert (kept.get(target, "a"), kept.get(target, "b"), kept.get(target, "c")) == (1, None, 3)
    assert kept.get(other, "a") is None
    del target
    gc.collect()
    assert len(kept._kept) == 0


def test_what_cannot_be_kept_is_not():
    kept = KeptWithTarget(2)
    kept.put(1, "a", 1)  # an int cannot be referred to weakly
    assert kept.get(1, "a") is None
    target = Target()
    kept.put(target, ["unhashable"], 1)
    assert kept.get(target, ["unhashable"]) is None
