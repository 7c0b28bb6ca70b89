"""The backend-agnostic decode loop: draft -> build tree -> verify forward -> accept -> commit.

``decode_steps`` is a generator of ``StepResult``s; ``generate`` consumes it, the CLI and the
benchmarks observe it. What the drafter, tree builder and verifier return is checked each step
(``specdec.step_checks``), and an error names the plugin that returned it. Randomness comes
from one NumPy generator per row, drawn on the host in a fixed order, so every backend sees the
same uniforms whatever the batch.
"""

from __future__ import annotations

import time
from typing import Iterator, Sequence

import attrs
import numpy as np

from specdec import lease, step_checks
from specdec.errors import PluginOutputError
from specdec.protocols import Backend, Drafter, TargetModel, TreeBuilder, Verifier
from specdec.reference.sampling import sample_from, target_probs
from specdec.types import Draft, DraftContext, SamplingConfig, StepResult


@attrs.frozen(kw_only=True)
class DecodePlan:
    """Everything one generation needs besides the prompts."""

    backend: Backend
    target: TargetModel
    drafter: Drafter
    tree_builder: TreeBuilder
    verifier: Verifier
    sampling: SamplingConfig
    max_new_tokens: int
    eos_token_ids: tuple[int, ...] = ()
    sources: dict[str, str] = attrs.field(factory=dict)  # "drafter" -> "drafter 'x' (plugin p, dist 1.0)"

    def source(self, kind: str) -> str:
        """Who made the ``kind`` component, for errors about what it returned."""
        return self.sources.get(kind) or f"{kind.replace('_', ' ')} {type(getattr(self, kind)).__name__}"


def row_generators(seed: int | Sequence[int] | None, batch_size: int) -> list[np.random.Generator]:
    """One generator per row: an int seed gives row b the stream ``[seed, b]``; a list gives row b
    the stream ``[seed[b], 0]``, so a row decoded alone with ``seed=[s]`` matches ``seed[b] = s``."""
    if seed is None:
        seed = int(np.random.SeedSequence().entropy % (2**63))
    if isinstance(seed, (int, np.integer)):
        return [np.random.default_rng([int(seed), b]) for b in range(batch_size)]
    return [np.random.default_rng([int(s), 0]) for s in seed]


def verify_uniform_shape(draft: Draft) -> tuple[int, int]:
    """(D+1, W+1) of the verifier's uniforms for this draft (see ``specdec.protocols.Verifier``)."""
    if draft.beams is not None:
        return int(draft.beams.shape[2]), int(draft.beams.shape[1]) + 1
    return int(draft.head_tokens.shape[1]) + 1, 1


def distinct_beams(beams: np.ndarray) -> np.ndarray:
    """(B,) the number of different beams in each row of ``beams`` (B, W, L); a drafter that
    repeats a beam (a lookup beam without a match) drafted it once."""
    same = (beams[:, :, None, :] == beams[:, None, :, :]).all(axis=-1)  # (B, W, W): beam i equals beam j
    repeats = np.tril(same, k=-1).any(axis=-1)  # (B, W): beam i equals an earlier beam
    return (beams.shape[1] - repeats.sum(axis=-1)).astype(np.int64)


class TokenHistory:
    """Each row's prompt and emitted tokens, in one (B, T) buffer that grows as tokens arrive
    (so a large max_new_tokens reserves nothing up front)."""

    def __init__(self, prompts: Sequence[Sequence[int]], max_new_tokens: int):
        self.lengths = np.array([len(p) for p in prompts], dtype=np.int64)
        self.capacity = int(self.lengths.max()) + max_new_tokens
        self.tokens = np.zeros((len(prompts), min(self.capacity, int(self.lengths.max()) + 256)), dtype=np.int64)
        for b, prompt in enumerate(prompts):
            self.tokens[b, : len(prompt)] = prompt

    def extend(self, row: int, tokens: Sequence[int]) -> None:
        start = self.lengths[row]
        if start + len(tokens) > self.tokens.shape[1]:
            wider = np.zeros((self.tokens.shape[0], min(self.capacity, 2 * (start + len(tokens)))), dtype=np.int64)
            wider[:, : self.tokens.shape[1]] = self.tokens
            self.tokens = wider
        self.tokens[row, start : start + len(tokens)] = tokens
        self.lengths[row] += len(tokens)

    def rows(self) -> tuple[np.ndarray, ...]:
        """One read-only (T_b,) view per row."""
        views = tuple(self.tokens[b, :n] for b, n in enumerate(self.lengths))
        for view in views:
            view.flags.writeable = False
        return views


def _draw(generators: list[np.random.Generator] | None, shape: tuple[int, ...]) -> np.ndarray | None:
    if generators is None:
        return None
    return np.stack([g.random(shape) for g in generators])


def _check_draft_and_tree(plan: DecodePlan, draft: Draft, tree, vocab: int, cause: Exception | None = None):
    """Host copies (beams or None, tree tokens, parents, num_nodes), after checking them."""
    host = plan.backend.to_numpy
    beams = None if draft.beams is None else host(draft.beams)
    tree_arrays = host(tree.tokens), host(tree.parents), host(tree.num_nodes)
    try:
        step_checks.check_draft(plan.source("drafter"), host(draft.root_tokens), beams,
                                None if draft.head_tokens is None else host(draft.head_tokens), vocab)
        step_checks.check_tree(plan.source("tree_builder"), *tree_arrays, vocab)
    except PluginOutputError as error:
        raise error from cause
    return (beams, *tree_arrays)


def decode_steps(plan: DecodePlan, prompts: Sequence[Sequence[int]], *, seed=None) -> Iterator[StepResult]:
    """Yield one StepResult per target forward (the prefill first), until every row is done.

    The target is leased for the whole generation (``specdec.lease``): a second generation on
    it while this one runs raises TargetBusyError at its first step, before touching the cache.
    """
    lease.acquire(plan.target)
    try:
        yield from _decode_steps(plan, prompts, seed=seed)
    finally:
        lease.release(plan.target)


def _decode_steps(plan: DecodePlan, prompts: Sequence[Sequence[int]], *, seed=None) -> Iterator[StepResult]:
    backend, target, sampling = plan.backend, plan.target, plan.sampling
    batch = len(prompts)
    generators = None if sampling.greedy else row_generators(seed, batch)
    rows = np.arange(batch)
    num_generated = np.zeros(batch, dtype=np.int64)
    done = np.zeros(batch, dtype=bool)
    history = TokenHistory(prompts, plan.max_new_tokens)

    def emit(tokens_per_row: list[list[int]]) -> list[list[int]]:
        """Cut each row at max_new_tokens and after EOS; mark finished rows."""
        out = []
        for b, tokens in enumerate(tokens_per_row):
            if done[b]:
                out.append([])
                continue
            kept = tokens[: plan.max_new_tokens - num_generated[b]]
            for i, token in enumerate(kept):
                if token in plan.eos_token_ids:
                    kept = kept[: i + 1]
                    done[b] = True
                    break
            num_generated[b] += len(kept)
            done[b] |= num_generated[b] >= plan.max_new_tokens
            history.extend(b, kept)
            out.append(kept)
        return out

    start = time.perf_counter()
    output = target.prefill(prompts)
    last_logits = backend.to_numpy(output.logits[:, 0, :])  # (B, V)
    first = sample_from(target_probs(last_logits, sampling), _draw(generators, ())) if generators else np.argmax(
        last_logits, axis=-1
    )
    root = backend.from_numpy(first.astype(np.int64), target)  # (B,)
    hidden = output.hidden[:, 0, :]  # (B, H)
    ones = np.ones(batch, dtype=np.int64)
    yield StepResult(
        step=0, new_tokens=emit([[int(t)] for t in first]), num_accepted=ones * 0, num_drafted=ones * 0,
        num_verified=ones, time_verify=time.perf_counter() - start,
    )

    draft_shape = getattr(plan.drafter, "sample_shape", None)
    want_draft_probs = bool(getattr(plan.verifier, "needs_draft_probs", False))
    vocab = int(target.vocab_size)
    step = 0
    while not done.all():
        step += 1
        active = ~done
        t0 = time.perf_counter()
        context = DraftContext(
            root_tokens=root, hidden=hidden, sampling=sampling, num_generated=num_generated.copy(),
            uniforms=_draw(generators, draft_shape) if draft_shape else None, want_draft_probs=want_draft_probs,
            history=history.rows(),
        )
        draft = plan.drafter.propose(context)
        tree = plan.tree_builder.build(draft)
        t1 = time.perf_counter()
        try:
            output = target.forward_tree(tree)
        except Exception as exc:  # a bad draft or tree fails here first: name the plugin that made it
            _check_draft_and_tree(plan, draft, tree, vocab, cause=exc)
            raise
        uniforms = _draw(generators, verify_uniform_shape(draft))
        verdict = plan.verifier.verify(
            tree, draft, output, sampling, None if uniforms is None else backend.from_numpy(uniforms, target)
        )
        path = backend.to_numpy(verdict.path)  # the step's one wait for the device
        num_accepted = backend.to_numpy(verdict.num_accepted)
        bonus = backend.to_numpy(verdict.bonus_tokens)
        beams, tokens, parents, num_nodes = _check_draft_and_tree(plan, draft, tree, vocab)
        step_checks.check_verdict(plan.source("verifier"), path, num_accepted, bonus, parents, num_nodes, vocab)
        t2 = time.perf_counter()
        target.commit(tree, verdict)
        if beams is not None:  # tokens of the distinct beams, before deduplication into the tree
            drafted = distinct_beams(beams) * (beams.shape[2] - 1)
        else:
            drafted = num_nodes - 1
        new_tokens = [
            [int(t) for t in tokens[b, path[b, 1 : num_accepted[b] + 1]]] + [int(bonus[b])] for b in range(batch)
        ]
        last_node = path[rows, num_accepted]
        hidden = output.hidden[backend.from_numpy(rows, target), backend.from_numpy(last_node, target)]
        root = verdict.bonus_tokens
        emitted = emit(new_tokens)
        yield StepResult(
            step=step, new_tokens=emitted,
            num_accepted=np.where(active, num_accepted, 0), num_drafted=np.where(active, drafted, 0),
            num_verified=np.where(active, num_nodes, 0),
            time_draft=t1 - t0, time_verify=t2 - t1, time_other=time.perf_counter() - t2,
        )
