"""``specdec.generate`` and ``specdec.stream``: check the request, load the model (a folder read
once, ``ModelFolder``), build the plan (``specdec.generation.components.decode_plan``), run the
decode loop.

Every check happens before the target's cache is touched, so a rejected call leaves no state.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterator, Sequence

import attrs
import numpy as np

from specdec import compute
from specdec.decode.loop import decode_steps
from specdec.decode.step_results import accepted_kept
from specdec.errors import (
    InvalidInputError,
    MissingDependencyError,
    TargetBusyError,
    UnknownPluginError,
)
from specdec.generation.arguments import (
    check_flag,
    check_max_new_tokens,
    check_prompt_type,
    check_seed,
    sampling_config,
)
from specdec.generation.components import DRAFTING_OPTIONS, decode_plan, resolve_drafter
from specdec.generation.loading import load_backend, load_for_prompts
from specdec.models.bundled import repair_if_damaged
from specdec.plugins.registry import PluginRegistry, default_registry
from specdec.types import GenerationResult, GenerationStats, StepResult


def generate(
    model: Any,
    prompt: Any,
    drafter: Any = "redrafter",
    backend: str | None = None,
    *,
    max_new_tokens: int = 128,
    temperature: float = 0.0,
    top_k: int | None = None,
    top_p: float | None = None,
    seed: int | Sequence[int] | None = None,
    dtype: str | None = None,
    device: str | None = None,
    exact: bool | None = None,
    registry: PluginRegistry | None = None,
    **options: Any,
) -> GenerationResult:
    """Generate with speculative decoding; greedy output equals plain greedy decoding.

    model: a bundled name ("smollm2-135m", ...), a local Hugging Face-format folder, a ``.gguf``
        file, a loaded target (``specdec.load``) or a backend-native model object.
        prompt: a string (needs a tokenizer), a chat, a list of token ids, or a list of those (a
        batch); a 1-D NumPy integer array is token ids, a 2-D one a batch.
        drafter: a name ("redrafter", "eagle", "medusa", "lookup", "draft_model", "none", or an
        installed plugin's), a path to a drafter checkpoint, or a Drafter object.
        backend: "numpy", "torch", "mlx" or any installed plugin; None picks torch when
        installed, else numpy. Every argument and result: docs/api.md.
    options: ``verifier`` and ``tree_builder`` (names or objects), ``stop_at_eos`` (default
        True), ``speculation`` ("auto", the default: each step drafts what the measured costs and
        each request's acceptance say pays, ``specdec.decode.budget``; "always"; "never"),
        ``lookup`` (True, the chain's length in drafted tokens, or a dict of
        ``draft_length`` / ``max_ngram`` / ``min_ngram`` / ``unigram_length``: add a prompt-lookup
        beam of its own length to a beam drafter's draft, ``specdec.drafting.lookup``; None, the
        default, adds it beside drafters that pair with it (ReDrafter) when the verifier allows;
        False never); everything else goes to the drafter (e.g. ``beam_width``,
        ``beam_length``; when both are left out, the ones ``specdec plan`` chose on this machine,
        if it ran).
    dtype: None (or "auto") loads a model folder in the dtype measured fastest on this machine
        (``specdec.tuning.dtype``).
    exact: the target's exact mode (``specdec.tuning.exactness``): its rows computed so that they do
        not depend on what shares a forward, which makes greedy output bit-identical to plain
        decoding at any dtype. None (the default) turns it on where a check of this machine's
        kernels holds; True insists (an error where it cannot hold); False turns it off. For a
        loaded target, None keeps what it was loaded with.
    """
    steps, size, batched, tokenizer, _ = begin(**locals())
    return collect(steps, size, batched=batched, tokenizer=tokenizer)


def stream(
    model: Any,
    prompt: Any,
    drafter: Any = "redrafter",
    backend: str | None = None,
    *,
    max_new_tokens: int = 128,
    temperature: float = 0.0,
    top_k: int | None = None,
    top_p: float | None = None,
    seed=None,
    dtype: str | None = None,
    device: str | None = None,
    exact: bool | None = None,
    registry: PluginRegistry | None = None,
    **options: Any,
) -> Iterator[StepResult]:
    """Like ``generate``, but yield one ``StepResult`` per target forward as it happens.

    Arguments are checked when this is called, before the first step runs.
    """
    return begin(**locals())[0]


def begin(model, prompt, drafter, backend, *, seed, options, **settings):
    """(the step generator, the number of prompts, whether they were a batch, the tokenizer, the
    plan): ``generate``'s and ``stream``'s arguments checked and their plan made; no step has run
    (the generator runs them as it is read, ``collect`` gathers them into a result)."""
    check_seed(seed)
    plan, prompts, batched, tokenizer = prepare(
        model, prompt, drafter, backend, options=options, **settings
    )
    check_seed(seed, len(prompts))
    return decode_steps(plan, prompts, seed=seed), len(prompts), batched, tokenizer, plan


def prepare(model, prompt, drafter, backend, **kwargs):
    """Resolve every name and check every argument; returns (plan, token prompts, batched,
    tokenizer). The drafter's trees are checked against what the target's slots leave beyond the
    prompts and ``max_new_tokens``.

    If loading fails and the model comes from the specdec cache, the cache folder's hashes are
    checked; a damaged folder is converted again and the load retried once.
    """
    backend_obj = load_backend(backend, kwargs.get("registry") or default_registry(), model)
    return compute.run_for(
        backend_obj, _prepare_or_repair, model, prompt, drafter, backend_obj, **kwargs
    )


def _prepare_or_repair(model, prompt, drafter, backend_obj, **kwargs):
    try:
        return _prepare(model, prompt, drafter, backend_obj, **kwargs)
    except (InvalidInputError, UnknownPluginError, MissingDependencyError, TargetBusyError):
        raise
    except Exception:
        if not repair_if_damaged(model):
            raise
    return _prepare(model, prompt, drafter, backend_obj, **kwargs)


def _prepare(
    model,
    prompt,
    drafter,
    backend_obj,
    *,
    max_new_tokens,
    temperature,
    top_k,
    top_p,
    dtype,
    device,
    registry,
    options,
    exact=None,
):
    registry = registry or default_registry()
    options = dict(options)
    stop_at_eos = check_flag(options.pop("stop_at_eos", True), "stop_at_eos")
    sampling = sampling_config(temperature, top_k, top_p)
    max_new_tokens = check_max_new_tokens(max_new_tokens)
    check_prompt_type(prompt)
    drafting = {k: options.pop(k) for k in DRAFTING_OPTIONS if k in options}
    named = resolve_drafter(drafter, backend_obj.name, options, registry)  # before the model loads
    target, prompts, batched, tokenizer = load_for_prompts(
        backend_obj, model, prompt, max_new_tokens, dtype=dtype, device=device, exact=exact
    )
    plan = decode_plan(
        target,
        named,
        backend_obj,
        greedy=sampling.greedy,
        exact=exact,
        registry=registry,
        **drafting,
        **options,
    )
    plan.check_tree_room(  # the last step's tree
        int(target.capacity) - max(map(len, prompts)) - int(max_new_tokens) + 1,
        "" if isinstance(model, (str, Path)) else ", or load the target with a larger capacity",
    )
    plan = attrs.evolve(
        plan,
        sampling=sampling,
        max_new_tokens=int(max_new_tokens),
        eos_token_ids=plan.eos_token_ids if stop_at_eos else (),
    )
    return plan, prompts, batched, tokenizer


def collect(steps, batch_size: int, *, batched: bool, tokenizer=None) -> GenerationResult:
    """Run the step generator to the end and aggregate tokens and stats."""
    tokens: list[list[int]] = [[] for _ in range(batch_size)]
    totals = dict(
        steps=0, row_steps=0, drafted=0, verified=0, accepted=0, draft=0.0, verify=0.0, other=0.0
    )
    drafting = decoding = 0  # row-steps that drafted, of those that decoded
    reasons: dict = {}  # the others, by why they decoded plainly
    prefill = 0.0
    admitted = False
    for result in steps:
        for row, new in enumerate(result.new_tokens):
            tokens[row].extend(new)
        if result.is_prefill:
            prefill += result.time_prefill
            totals["row_steps"] += int(np.count_nonzero(result.prefilled))
            admitted = True
            continue
        totals["steps"] += 1
        totals["row_steps"] += int(np.count_nonzero(result.num_verified))
        decoding += int(np.count_nonzero(result.num_verified))
        drafting += int(np.count_nonzero(np.asarray(result.num_verified) > 1))
        for why in result.plain_reasons:
            if why is not None:
                reasons[why] = reasons.get(why, 0) + 1
        totals["drafted"] += int(np.sum(result.num_drafted))
        totals["verified"] += int(np.sum(result.num_verified))
        totals["accepted"] += sum(
            accepted_kept(accepted, len(new))
            for accepted, new in zip(result.num_accepted, result.new_tokens)
        )
        totals["draft"] += result.time_draft
        totals["verify"] += result.time_verify
        totals["other"] += result.time_other
    stats = GenerationStats(
        steps=totals["steps"] + int(admitted),
        new_tokens=sum(map(len, tokens)),
        row_steps=totals["row_steps"],
        drafted_tokens=totals["drafted"],
        verified_tokens=totals["verified"],
        accepted_tokens=totals["accepted"],
        time_draft=totals["draft"],
        time_verify=totals["verify"],
        time_other=totals["other"],
        time_prefill=prefill,
        drafting_row_steps=drafting,
        decode_row_steps=decoding,
        plain_reasons=reasons,
    )
    text = [tokenizer.decode(t) for t in tokens] if tokenizer is not None else None
    if not batched:
        return GenerationResult(
            tokens=tokens[0], stats=stats, text=None if text is None else text[0]
        )
    return GenerationResult(tokens=tokens, stats=stats, text=text)
