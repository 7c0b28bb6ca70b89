"""What "auto" learnt, kept for the next generation on the same target and drafting setting.

A decoder's ``Speculation`` learns as it decodes (``specdec.decode.budget``): the step costs'
online fits, the tokens per second that drafting and plain steps delivered per row count
(``specdec.decode.realized``), and the acceptance over all requests that a new request starts
from. An engine keeps one decoder for its life, but ``generate`` and ``stream`` make one per
call, and each started from nothing: it took its ``PROBE`` drafting steps, then decoded plainly
until it had a yardstick of plain steps to weigh them against. On MT-Bench with SmolLM2-135M and
the default drafter that was 3 plain steps of every request's 12-75 ("measuring"), re-learning
what the call before had known.

So a decoder whose plan asks for "auto" by name (not a ``Speculation`` object of the caller's,
which is the caller's own memory) takes the policy that the last decoder left with the same
target, drafting setting (``DecodePlan.setting``: the drafter's name, checkpoint and options,
lookup, tree builder and verifier; or the drafter object itself) and sampling. What is kept is
what the policy learnt over requests; what each request learnt ends with it
(``Speculation.resume``). At most ``SETTINGS`` settings are kept per target, the least recently
used dropped; they go with the target (``specdec.decode.kept``). A second process, or a target
loaded again, starts afresh. Budgets never change which tokens are accepted, so what is
remembered moves only speed.
"""

from __future__ import annotations

from specdec.decode.budget import Speculation, make_speculation, speculation_mode
from specdec.decode.kept import KeptWithTarget

__all__ = ["SETTINGS", "speculation_for"]

SETTINGS = 8  # drafting settings remembered per target

_kept = KeptWithTarget(SETTINGS)  # target -> {(setting, sampling): Speculation}


def speculation_for(plan, caps, needs_draft_probs: bool) -> Speculation:
    """The policy of a decoder of ``plan`` (``make_speculation``): under "auto" by name, the one
    the last decoder of the same target and setting left, resumed (module docstring)."""
    value = plan.speculation
    if isinstance(value, Speculation) or speculation_mode(value, caps, needs_draft_probs) != "auto":
        return make_speculation(value, caps, needs_draft_probs)
    key = (plan.setting if plan.setting is not None else plan.drafter, plan.sampling)
    speculation = _kept.get(plan.target, key)
    if speculation is None:
        speculation = make_speculation(value, caps, needs_draft_probs)
    else:
        speculation.resume()
    _kept.put(plan.target, key, speculation)
    return speculation
