"""Which prompt chunks a step carries (``specdec.decode.loop.Decoder``), within its budget of prompt
tokens.

Prompts that can finish within what is left of the budget go first, in order (those already
being prefilled, oldest first, then waiting requests in arrival order), so a short prompt's first
token is not delayed behind a long prompt's chunks; then the rest of the budget goes, chunk by
chunk, to the prompts that cannot finish, oldest first. The oldest unfinished prompt keeps a
quarter of the budget for itself, so short prompts arriving at every step never stall it. A chunk
holds at most ``specdec.slots.PREFILL_CHUNK`` tokens of one prompt.
"""

from __future__ import annotations

from typing import Sequence

from specdec.slots import PREFILL_CHUNK

__all__ = ["choose_chunks"]

RESERVED_SHARE = 4  # the oldest unfinished prompt keeps budget // RESERVED_SHARE of a step


def choose_chunks(
    prefilling: Sequence[int], waiting: Sequence[int], budget: float
) -> list[tuple[str, int, int]]:
    """This step's chunks as (kind, index, tokens): kind "prefilling" for ``prefilling[index]``
    (remaining prompt tokens of a request being prefilled, oldest first), "waiting" for
    ``waiting[index]`` (prompt lengths of waiting requests that have a free slot, in arrival
    order); in the order they go into the forward. ``budget``: prompt tokens (inf: no bound)."""
    candidates = [("prefilling", i, n) for i, n in enumerate(prefilling)] + [
        ("waiting", i, n) for i, n in enumerate(waiting)
    ]
    reserve = 0
    # the oldest cannot finish in this step
    if prefilling and prefilling[0] > min(budget, PREFILL_CHUNK):
        reserve = min(PREFILL_CHUNK, budget // RESERVED_SHARE)
    left, chosen, taken = budget - reserve, [], set()
    # whole prompts first: their first token comes this step
    for (
        kind,
        index,
        remaining,
    ) in candidates:
        if remaining <= min(left, PREFILL_CHUNK):
            chosen.append((kind, index, int(remaining)))
            taken.add((kind, index))
            left -= remaining
    left += reserve
    for kind, index, remaining in candidates:  # then chunks of the others, oldest first
        if left < 1:
            break
        if (kind, index) in taken:
            continue
        take = int(min(remaining, left, PREFILL_CHUNK))
        chosen.append((kind, index, take))
        left -= take
    return chosen
