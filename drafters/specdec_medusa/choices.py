"""Static Medusa trees written as "choices": lists of top-index paths.

A choice is a tuple of ranks ``(r_1, ..., r_d)``: the node reached from the root by taking
head 0's rank-``r_1`` token, then head 1's rank-``r_2`` token, and so on. Its depth is ``d``
and its parent is the node of ``(r_1, ..., r_{d-1})`` (the root when ``d == 1``). A valid
choice set is prefix-closed (every prefix of a path is itself a choice) and has no
duplicates; the root is implicit and never listed.

The presets are sized for a CPU where verifying more than ~16 tokens at once costs clearly
more than verifying one (docs/design.md section 8). The number in each name is N, the number of tree
nodes the target verifies, the root included. Deeper levels favour rank-0 children: a deep
node only pays off when every head above it was right, so its budget goes to the most
likely path.
"""

from __future__ import annotations

import numbers
from typing import Iterable, Sequence

Choices = tuple[tuple[int, ...], ...]


PRESETS: dict[str, Choices] = {
    # A single chain of each head's best token (heads 0..2).
    "chain4": ((0,), (0, 0), (0, 0, 0)),
    # Two candidates for the next token, a short second level, a chain down the best path.
    "small8": ((0,), (1,), (0, 0), (0, 1), (1, 0), (0, 0, 0), (0, 0, 0, 0)),
    # 4 + 6 + 4 + 1 drafted nodes: wide at depth 1, then mostly rank-0 children.
    "cpu16": (
        (0,),
        (1,),
        (2,),
        (3,),
        (0, 0),
        (0, 1),
        (0, 2),
        (1, 0),
        (1, 1),
        (2, 0),
        (0, 0, 0),
        (0, 0, 1),
        (0, 1, 0),
        (1, 0, 0),
        (0, 0, 0, 0),
    ),
    # 6 + 12 + 10 + 3 drafted nodes, for targets where a 32-token forward is still cheap.
    "wide32": (
        (0,),
        (1,),
        (2,),
        (3,),
        (4,),
        (5,),
        (0, 0),
        (0, 1),
        (0, 2),
        (0, 3),
        (0, 4),
        (1, 0),
        (1, 1),
        (1, 2),
        (2, 0),
        (2, 1),
        (3, 0),
        (4, 0),
        (0, 0, 0),
        (0, 0, 1),
        (0, 0, 2),
        (0, 1, 0),
        (0, 1, 1),
        (0, 2, 0),
        (1, 0, 0),
        (1, 0, 1),
        (1, 1, 0),
        (2, 0, 0),
        (0, 0, 0, 0),
        (0, 0, 0, 1),
        (0, 1, 0, 0),
    ),
}


def sort_choices(choices: Iterable[Sequence[int]]) -> Choices:
    """The canonical node order: by depth, then lexicographically. Node i + 1 of a tree is
    choice i in this order (node 0 is the root), so every parent precedes its children."""
    return tuple(sorted((tuple(c) for c in choices), key=lambda c: (len(c), c)))


def _as_path(choice) -> tuple[int, ...]:
    try:
        if isinstance(choice, (str, bytes)):
            raise TypeError
        path = tuple(choice)
    except TypeError:
        raise ValueError(
            f"Medusa choice {choice!r} is not a sequence of ranks; write each choice as a tuple "
            "such as (0, 1)"
        ) from None
    if not path:
        raise ValueError(
            "Medusa choice () is empty; the root is implicit, list only paths of length >= 1"
        )
    for rank in path:
        if isinstance(rank, bool) or not isinstance(rank, numbers.Integral) or rank < 0:
            raise ValueError(
                f"Medusa choice {path!r} must contain non-negative integer ranks, got {rank!r}"
            )
    return tuple(int(rank) for rank in path)


def check_choices(
    choices: Iterable[Sequence[int]], *, num_heads: int | None = None, top_t: int | None = None
) -> Choices:
    """Validate explicit choices and return them in canonical order (``sort_choices``).

    Raises ValueError naming the offending path when a path is empty or not a tuple of
    non-negative ints, is listed twice, lacks one of its prefixes, is deeper than
    ``num_heads`` (K), or uses a rank ``>= top_t`` (T).
    """
    paths = [_as_path(c) for c in choices]
    seen: set[tuple[int, ...]] = set()
    for path in paths:
        if path in seen:
            raise ValueError(f"Medusa choice {path!r} is listed twice; list each path once")
        seen.add(path)
    for path in paths:
        for end in range(1, len(path)):
            if path[:end] not in seen:
                raise ValueError(
                    f"Medusa choice {path!r} needs its prefix {path[:end]!r}, which is missing; "
                    "choices must be prefix-closed (add the prefix or drop the path)"
                )
        if num_heads is not None and len(path) > num_heads:
            raise ValueError(
                f"Medusa choice {path!r} has depth {len(path)} but the drafter has only "
                f"{num_heads} heads; drop the path or use a drafter with more heads"
            )
        if top_t is not None and max(path) >= top_t:
            raise ValueError(
                f"Medusa choice {path!r} uses rank {max(path)} but each head proposes only its top "
                f"{top_t} tokens (ranks 0..{top_t - 1}); drop the path or raise top_t"
            )
    return sort_choices(paths)


def resolve_choices(
    choices: str | Iterable[Sequence[int]],
    *,
    num_heads: int | None = None,
    top_t: int | None = None,
) -> Choices:
    """A preset name or an explicit list of paths -> validated choices in canonical order.

    >>> resolve_choices("chain4")
    ((0,), (0, 0), (0, 0, 0))
    """
    if isinstance(choices, str):
        if choices not in PRESETS:
            raise ValueError(
                f"unknown Medusa choices preset {choices!r}; use one of {sorted(PRESETS)} "
                "or an explicit list of paths such as [(0,), (1,), (0, 0)]"
            )
        choices = PRESETS[choices]
    return check_choices(choices, num_heads=num_heads, top_t=top_t)
