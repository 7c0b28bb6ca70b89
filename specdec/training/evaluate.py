"""Windows of teacher data, and held-out tokens per step computed offline.

A drafter at position t (root x_{t+1}, hidden h_t) drafts tokens for x_{t+2}, x_{t+3}, ...;
greedy verification accepts the longest drafted prefix that equals the target's own greedy
continuation. The teacher data hold that continuation, so acceptance can be computed without
running the target: ``beam_acceptance`` for beams (ReDrafter), ``tree_acceptance`` for head
top-T tokens combined by a static tree (Medusa).

``walk_tokens_per_step`` then replays greedy speculative decoding over each held-out
continuation: start at the first position, accept a drafted tokens, emit them and the bonus
token (a + 1 tokens), jump a + 1 positions, repeat. Tokens per step is the mean emitted per
step (bonus token counted; plain decoding scores 1.0), the number ``specdec.generate`` reports
on that continuation apart from the prefill's token and the cut at the end of the data.
"""

from __future__ import annotations

from typing import Callable, Sequence

import attrs
import torch

from specdec.training.records import TeacherData

__all__ = ["Window", "beam_acceptance", "gather_window", "tree_acceptance", "walk_tokens_per_step"]


@attrs.frozen(kw_only=True)
class Window:
    """What a drafter sees at B positions and the D steps after them.

    hidden (B, H); tokens (B, D+1) int64: x_{t+1} (the root) .. x_{t+D+1} (clamped inside the data
    where invalid); valid (B, D) bool: step k (1-based) exists, i.e. x_{t+k+1} is in the data;
    label_ids (B, D, k), label_probs (B, D, k): the target's top-k distribution at t+1 .. t+D,
    which scores x_{t+2} .. x_{t+D+1}.
    """

    hidden: torch.Tensor
    tokens: torch.Tensor
    valid: torch.Tensor
    label_ids: torch.Tensor
    label_probs: torch.Tensor


def gather_window(
    data: TeacherData, indices: torch.Tensor, depth: int, *, labels: bool = True
) -> Window:
    """The ``Window`` of depth D at flat positions ``indices`` (B,) of ``data``."""
    steps = torch.arange(depth + 1)
    # (B, D+1); step 0 (the root) always valid
    valid = steps[None, :] <= data.remaining[indices][:, None]
    # (B, D+1) flat indices
    where = torch.where(valid, indices[:, None] + steps[None, :], indices[:, None])
    label_ids = data.label_ids[where[:, 1:]] if labels else None  # (B, D, k)
    label_probs = data.label_probs[where[:, 1:]] if labels else None
    return Window(
        hidden=data.hidden[indices],
        tokens=data.next_tokens[where],
        valid=valid[:, 1:],
        label_ids=label_ids,
        label_probs=label_probs,
    )


def _matched_prefix(
    drafted: torch.Tensor, truth: torch.Tensor, valid: torch.Tensor
) -> torch.Tensor:
    """Length of the longest prefix where drafted == truth. drafted, truth, valid (..., D) ->
    (...)."""
    match = (drafted == truth) & valid
    return torch.cumprod(match.long(), dim=-1).sum(-1)


def beam_acceptance(beams: torch.Tensor, truth: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """Drafted tokens greedy verification accepts from beams.

    beams (B, W, L) with the root in column 0; truth (B, D) and valid (B, D) with D >= L-1: the
    target's continuation after the root. -> (B,) int64, the best beam's matched prefix.
    """
    drafted = beams[:, :, 1:]  # (B, W, L-1)
    length = drafted.shape[-1]
    return (
        _matched_prefix(drafted, truth[:, None, :length], valid[:, None, :length]).max(dim=1).values
    )


def tree_acceptance(
    head_tokens: torch.Tensor,
    choices: Sequence[Sequence[int]],
    truth: torch.Tensor,
    valid: torch.Tensor,
) -> torch.Tensor:
    """Drafted tokens greedy verification accepts from a static Medusa tree.

    head_tokens (B, K, T): head k's top-T tokens for the token k+1 after the root; choices: the
    tree's paths of ranks; truth, valid (B, D) with D >= K. A path is accepted when the token of
    each of its nodes equals the continuation; the deepest accepted path wins. -> (B,) int64.
    """
    batch, num_heads = head_tokens.shape[:2]
    match = (head_tokens == truth[:, :num_heads, None]) & valid[:, :num_heads, None]  # (B, K, T)
    best = torch.zeros(batch, dtype=torch.long)
    for path in choices:
        ok = torch.ones(batch, dtype=torch.bool)
        for head, rank in enumerate(path):
            ok &= match[:, head, rank]
        best = torch.where(ok, torch.clamp(best, min=len(path)), best)
    return best


def walk_tokens_per_step(
    data: TeacherData,
    accept: Callable[[torch.Tensor], torch.Tensor],
    *,
    sequences: int | None = None,
    batch_size: int = 256,
) -> dict:
    """Replay greedy speculative decoding over the continuations of ``data``.

    accept(indices (B,)) -> (B,) int64: drafted tokens accepted at those flat positions. The first
    ``sequences`` sequences are walked (all when None), all sequences advancing together.
    Returns ``tokens_per_step`` (emitted tokens / steps, bonus counted), ``steps``, ``tokens``,
    ``mean_accepted`` and ``histogram`` (steps per accepted count).
    """
    starts = data.starts()
    if sequences is not None:
        starts = starts[:sequences]
    current = starts.clone()
    tokens = steps = 0
    histogram: dict[int, int] = {}
    while True:
        moving = data.remaining[current] > 0
        active = current[moving]
        if active.numel() == 0:
            break
        accepted = torch.cat(
            [accept(active[i : i + batch_size]) for i in range(0, active.numel(), batch_size)]
        )
        left = data.remaining[active]
        accepted = torch.minimum(accepted, left)
        # no bonus token past the data
        emitted = torch.where(accepted < left, accepted + 1, accepted)
        tokens += int(emitted.sum())
        steps += int(active.numel())
        for value, count in zip(*torch.unique(accepted, return_counts=True)):
            histogram[int(value)] = histogram.get(int(value), 0) + int(count)
        current = current.clone()
        current[moving] = active + emitted
    return {
        "tokens_per_step": tokens / steps if steps else 0.0,
        "steps": steps,
        "tokens": tokens,
        "mean_accepted": sum(k * v for k, v in histogram.items()) / steps if steps else 0.0,
        "histogram": dict(sorted(histogram.items())),
    }
