"""Exact mode: a target forward whose rows do not depend on what shares them, guarded by a check.

A target is *row-invariant* when a row's logits, hidden states and written keys and values are a
function of the weights, its token, its position and the cache before it only, whatever else
shares the forward (a draft tree of any shape, other requests' rows, prompt chunks of any split).
Plain decoding is then the one-node tree of the same computation, so greedy speculative output is
bit-identical to plain greedy decoding at the target's own dtype (bfloat16 included), and a
request's tokens do not depend on how the engine schedules it.

That rests on how the machine's kernels round, which differs by CPU family, library version and
dtype, so it is checked, never assumed. A target that offers it has (the optional contract):

    target.exact                    bool, settable: run the row-invariant forms
    target.check_row_invariance()   -> InvarianceCheck: a self-test of its kernels on this
                                    machine, dtype and shapes (cached by ``cached_check``)

``configure`` runs when a target is loaded (``specdec.load``, ``generate``, the CLI and the
server take ``exact``): ``exact=None`` (the default) turns exact mode on where the check holds
and, in half precision, says once in one line what fails where it does not (float32 and float64
round differences at a level that leaves plain decoding's tokens in practice); ``exact=True``
insists (an error where the check fails); ``exact=False`` opts out. ``target.exactness`` records the
outcome.
"""

from __future__ import annotations

import re
import time
import warnings
from pathlib import Path
from typing import Any, Callable

import attrs

from specdec.errors import InvalidInputError
from specdec.tuning.store import digest, read_entry, say_measuring, tuning_dir, write_entry

__all__ = [
    "Exactness",
    "InvarianceCheck",
    "cached_check",
    "check_exact_option",
    "configure",
    "describe",
]

CHECK_VERSION = 2  # 2: row_block


@attrs.frozen(kw_only=True)
class InvarianceCheck:
    """The outcome of a target's self-test.

    holds: every kernel gave each row the same bits alone and among others; failed: the first
    kernel that did not, in words (None when it holds); checked: what was checked; source:
    "measured" (now) or "cached" (earlier, on this machine and software); row_block: the most
    rows a product may take in one call for that to hold (None: any number), which the target
    then keeps to in exact mode."""

    holds: bool
    failed: str | None = None
    checked: tuple[str, ...] = ()
    source: str = "measured"
    row_block: int | None = None


@attrs.frozen(kw_only=True)
class Exactness:
    """Whether a target runs in exact mode, and why (``reason``: one line for people)."""

    on: bool
    reason: str
    check: InvarianceCheck | None = None


def check_exact_option(exact: Any) -> bool | None:
    """``exact`` as given by a caller: True, False or None; anything else is refused."""
    if exact is None or isinstance(exact, bool):
        return exact
    if isinstance(exact, str) and exact.lower() in ("auto", "true", "false", "on", "off"):
        return {"auto": None, "true": True, "on": True}.get(exact.lower(), False)
    raise InvalidInputError(
        f"exact must be True, False or None (checked on this machine), got {exact!r}"
    )


def _check_file(key: dict) -> Path:
    name = f"exact-{key.get('backend', 'target')}-{digest({'version': CHECK_VERSION, **key})}.json"
    return tuning_dir() / name


def _count(number, noun: str) -> str:
    return f"{number} {noun}{'' if number == 1 else 's'}"


_SAID: set[tuple] = set()  # the kinds of check this process announced (cached_check)


def cached_check(key: dict, run: Callable[[], InvarianceCheck]) -> InvarianceCheck:
    """``run()``'s result for ``key`` (backend, device, dtype, shapes, software: what the kernels'
    rounding depends on), measured once and kept beside the dtype choice in the tuning cache."""
    file = _check_file(key)
    saved = read_entry(file)  # None: absent or unreadable
    if saved is not None:
        try:
            return InvarianceCheck(
                holds=bool(saved["holds"]),
                failed=saved.get("failed"),
                checked=tuple(saved.get("checked", ())),
                source="cached",
                row_block=saved.get("row_block"),
            )
        except (KeyError, TypeError, ValueError):
            pass  # a file of another shape: measure
    what = (
        f"trees of up to {_count(key['max_nodes'], 'node')} in {_count(key.get('rows', 1), 'row')}"
        if "max_nodes" in key
        else "the model's kernels"
    )
    # one line per process for trees of a dtype and row count: a plan that tries several tree
    # sizes measures each (seconds apiece) but says so once
    said = (key.get("backend"), key.get("dtype"), key.get("rows"), "max_nodes" in key)
    if not ("max_nodes" in key and said in _SAID):
        say_measuring(f"whether exact mode holds in {key.get('dtype', 'this dtype')} for {what}")
        _SAID.add(said)
    check = run()
    write_entry(
        file, {**attrs.asdict(check), "key": key, "measured_at": time.strftime("%Y-%m-%dT%H:%M:%S")}
    )
    return check


def _kernel_words(failed: str | None) -> str:
    """A failed check's kernel as words: "q/k/v projection (64, 32)" -> "the q/k/v projection
    (64 x 32)"."""
    name = re.sub(r"\((\d+), (\d+)\)$", r"(\1 x \2)", str(failed or "a kernel"))
    return name if name.startswith(("a ", "an ", "the ")) else f"the {name}"


def _dtype(target) -> str:
    return str(getattr(target, "dtype", "its dtype")).rpartition(".")[2]


def configure(target, exact: bool | None, *, backend: str = "this") -> Exactness:
    """Set ``target.exact`` from ``exact`` and the target's self-test; returns what was decided
    (also kept as ``target.exactness``). Raises InvalidInputError for ``exact=True`` where exact
    mode cannot hold."""
    exact = check_exact_option(exact)
    offered = hasattr(target, "check_row_invariance") and hasattr(target, "exact")
    if exact is False:
        if offered:
            target.exact = False
        outcome = Exactness(on=False, reason="off (exact=False)")
    elif not offered:
        if exact:
            raise InvalidInputError(
                f"exact=True: the {backend} backend's target has no row-invariant mode (it offers "
                "no check_row_invariance); pass exact=False or None, or use the torch or mlx "
                "backend"
            )
        outcome = Exactness(on=False, reason=f"not offered by the {backend} backend's target")
    else:
        check = target.check_row_invariance()
        if check.holds:
            target.exact = True
            outcome = Exactness(
                on=True,
                reason=f"on: rows checked invariant on this machine ({check.source})",
                check=check,
            )
        else:
            target.exact = False
            what = (
                f"{_kernel_words(check.failed)} rounds a row differently when other rows share "
                f"the call (on this machine, in {_dtype(target)})"
            )
            if exact:
                raise InvalidInputError(
                    f"exact=True, but {what}, so a token's logits depend on the draft tree and "
                    "requests verified beside it and speculative output could differ from plain "
                    "decoding; pass exact=False (or leave exact unset) to decode without that "
                    "guarantee"
                )
            outcome = Exactness(on=False, reason=f"off: {what}", check=check)
            # in float32 and float64 rounding hides at 1e-7
            if _dtype(target) in (
                "bfloat16",
                "float16",
            ):
                warnings.warn(
                    f"specdec: exact mode off: {what}, so greedy speculative output may differ "
                    "from plain decoding where two tokens nearly tie (in float32 it matches plain "
                    "decoding token for token in practice); exact=False silences this",
                    RuntimeWarning,
                    stacklevel=3,
                )
    try:
        target.exactness = outcome
    except AttributeError:  # a frozen target class
        pass
    return outcome


def describe(target) -> str:
    """One line: the target's exact mode and why."""
    outcome = getattr(target, "exactness", None)
    if outcome is None:
        return "exact mode: not configured"
    form = getattr(target, "exact_form", None)
    return f"exact mode {outcome.reason}" + (f"; attention: {form}" if outcome.on and form else "")
