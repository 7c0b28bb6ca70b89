"""A failed step run again one request at a time (``specdec.decode.loop.Decoder.step`` with
``failures``), so that one request's failure ends that request alone.

The step is run again from the same state and random numbers: each request's generators are
rewound to where the step began. What is committed is never run again: prompt chunks whose
forward ran move on, and a step that failed after its commit (or with a stateful drafter, whose
state moved) drops the requests it held instead. A request that fails alone is dropped, its slot
freed, and ``(request id, exception)`` appended to ``failures``.
"""

from __future__ import annotations

import attrs

__all__ = ["StepProgress", "run_isolated"]


@attrs.define
class StepProgress:
    """How far the running step got: ``forwarded`` (its chunks and their PromptOutputs) once the
    forward ran, ``committing`` once the verdicts are being committed."""

    forwarded: tuple | None = None
    committing: bool = False


def run_isolated(decoder, chunks, groups, failures):
    """``decoder.run(chunks, groups, failures)``; with ``failures``, a step that raises is run
    again request by request (module docstring). -> (admissions, decode results)."""
    if failures is None:
        return decoder.run(chunks, groups, None)
    active = decoder.table.active
    chunk_states = [active[s][1] for s, *_ in chunks]
    states = chunk_states + [active[s][1] for _, slots in groups for s in slots]
    saved = [None if s.generator is None else s.generator.bit_generator.state for s in states]
    progress = decoder.progress = StepProgress()
    try:
        return decoder.run(chunks, groups, failures)
    except Exception as error:
        admitted = None
        if progress.forwarded is not None:  # its chunks are committed: their requests move on
            forwarded, progress.forwarded = progress.forwarded, None
            admitted = decoder.advance_chunks(*forwarded, failures)
            states, chunks = states[len(chunk_states) :], []
        if len(states) <= 1 or progress.committing or decoder.caps.stateful:
            for state in states:
                if state.slot in active and active[state.slot][1] is state:
                    decoder.drop(active[state.slot][0], error, failures)
            return admitted or [], []
    for state, generator_state in zip(states, saved[len(saved) - len(states) :]):
        if generator_state is not None:
            state.generator.bit_generator.state = generator_state
    admitted, decoded = list(admitted or []), []
    alone = [([chunk], []) for chunk in chunks] + [
        ([], [(key, [s])]) for key, slots in groups for s in slots
    ]
    for part_chunks, part_groups in alone:
        a, d = run_isolated(decoder, part_chunks, part_groups, failures)
        admitted += a
        decoded += d
    return admitted, decoded
