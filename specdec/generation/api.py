"""``specdec.generate``: resolve names to plugins, check the input, run the decode loop.

Every check happens before the target's cache is touched, so a rejected call leaves no state.
"""

from __future__ import annotations

import contextlib
import importlib.util
import re
from pathlib import Path
from typing import Any, Iterator, Sequence

import numpy as np

from specdec.drafting.lookup import LookupDrafter
from specdec.drafting.none import NoDrafter
from specdec.generation.arguments import (
    check_fits_context,
    check_flag,
    check_text,
    context_length,
    check_drafter_path,
    check_max_new_tokens,
    check_prompt_type,
    check_seed,
    is_int,
    plain_prompt,
    sampling_config,
)
from specdec.decode import lease
from specdec.decode.budget import check_speculation
from specdec.models.bundled import repair_if_damaged, resolve_model
from specdec.generation.chat import is_messages, load_chat_template, render_chat
from specdec.errors import (
    InvalidInputError,
    MissingDependencyError,
    ModelLoadError,
    SpecdecError,
    TargetBusyError,
    UnknownPluginError,
)
from specdec import compute
from specdec.capabilities import drafter_caps, verifier_caps
from specdec.models.files import check_model_folder, damaged_checkpoint, read_json
from specdec.models.llama import load_tokenizer
from specdec.slots import DEFAULT_CAPACITY, TREE_ROOM, check_tree_room, lower_options
from specdec.decode.loop import decode_steps
from specdec.decode.plan import DecodePlan
from specdec.generation.options import check_drafter_options
from specdec.generation.resolve import Resolved, build, resolve, with_lookup
from specdec.plugins.registry import PluginRegistry, default_registry
from specdec.tuning.dtype import DtypeChoice, cached_drafter_plan, load_fastest
from specdec.tuning.exactness import check_exact_option, configure
from specdec.tuning.guard import GUARD_NODES, guard_exact_mode
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

    model: a local Hugging Face-format folder, a loaded target (``specdec.load``) or a
        backend-native model object. prompt: a string (needs a tokenizer), a list of token ids,
        or a list of those (a batch); a 1-D NumPy integer array is token ids, a 2-D one a batch.
        drafter: a name ("redrafter", "medusa", "none"), a path to a drafter checkpoint, or a
        Drafter object. backend: "numpy", "torch", "mlx" or any
        installed plugin; None picks torch when installed, else numpy.
    options: ``verifier`` and ``tree_builder`` (names or objects), ``stop_at_eos`` (default
        True), ``speculation`` ("auto", the default: each step drafts what the measured costs and
        each request's acceptance say pays, ``specdec.decode.budget``; "always"; "never"),
        ``lookup`` (True, the chain's length in drafted tokens, or a dict of
        ``draft_length`` / ``max_ngram`` / ``min_ngram``: add a prompt-lookup beam of its own length
        to a beam drafter's draft, ``specdec.drafting.lookup``; None, the default, adds it beside
        drafters that pair with it (ReDrafter) when the verifier allows; False never); everything
        else goes to the drafter (e.g. ``beam_width``, ``beam_length``; when both are left out, the
        ones ``specdec plan`` chose on this machine, if it ran).
    dtype: None (or "auto") loads a model folder in the dtype measured fastest on this machine
        (``specdec.tuning.dtype``).
    exact: the target's exact mode (``specdec.tuning.exactness``): its rows computed so that they do
        not depend on what shares a forward, which makes greedy output bit-identical to plain
        decoding at any dtype. None (the default) turns it on where a check of this machine's
        kernels holds; True insists (an error where it cannot hold); False turns it off. For a
        loaded target, None keeps what it was loaded with.
    """
    check_seed(seed)
    plan, prompts, batched, tokenizer = prepare(
        model,
        prompt,
        drafter,
        backend,
        max_new_tokens=max_new_tokens,
        temperature=temperature,
        top_k=top_k,
        top_p=top_p,
        dtype=dtype,
        device=device,
        exact=exact,
        registry=registry,
        options=options,
    )
    check_seed(seed, len(prompts))
    return collect(
        decode_steps(plan, prompts, seed=seed), len(prompts), batched=batched, tokenizer=tokenizer
    )


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
    check_seed(seed)
    plan, prompts, _, _ = prepare(
        model,
        prompt,
        drafter,
        backend,
        max_new_tokens=max_new_tokens,
        temperature=temperature,
        top_k=top_k,
        top_p=top_p,
        dtype=dtype,
        device=device,
        exact=exact,
        registry=registry,
        options=options,
    )
    check_seed(seed, len(prompts))
    return decode_steps(plan, prompts, seed=seed)


def prepare(model, prompt, drafter, backend, **kwargs):
    """Resolve every name and check every argument; returns (plan, token prompts, batched,
    tokenizer). The drafter's trees are checked against what the target's slots leave beyond the
    prompts and ``max_new_tokens`` unless ``tree_room`` is given
    (an engine's, which checks it itself).

    If loading fails and the model comes from the specdec cache, the cache folder's hashes are
    checked; a damaged folder is converted again and the load retried once.
    """
    backend_obj = load_backend(backend, kwargs.get("registry") or default_registry())
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
    tree_room=None,
):
    registry = registry or default_registry()
    options = dict(options)
    stop_at_eos = check_flag(options.pop("stop_at_eos", True), "stop_at_eos")
    sampling = sampling_config(temperature, top_k, top_p)
    max_new_tokens = check_max_new_tokens(max_new_tokens)
    check_prompt_type(prompt)
    check_drafter_path(drafter)
    named = resolve("drafter", drafter, registry, backend_obj.name)
    check_drafter_options(named, registry, backend_obj.name, options)  # before the model loads
    model = resolve_model(model)
    if isinstance(
        model, (str, Path)
    ):  # encode first: the target gets one slot per prompt, sized to fit
        check_model_folder(model)
        tokenizer, config = (
            load_tokenizer(model),
            read_json(Path(model) / "config.json", what="model config"),
        )
        vocab = config.get("vocab_size", 1)
        if isinstance(vocab, bool) or not isinstance(vocab, int) or vocab < 1:
            raise InvalidInputError(
                f"{Path(model) / 'config.json'}: vocab_size must be a positive integer, got "
                f"{vocab!r}; fix config.json"
            )
        prompts, batched = encode_prompts(
            prompt,
            tokenizer,
            int(config.get("vocab_size", 0)) or 2**62,
            chat_template=load_chat_template(model),
        )
        check_fits_context(
            prompts, max_new_tokens, config.get("max_position_embeddings"), batched=batched
        )
        target, _ = load_with_choice(
            backend_obj,
            model,
            dtype=dtype,
            device=device,
            slots=len(prompts),
            capacity=max(map(len, prompts)) + max_new_tokens + TREE_ROOM,
            exact=exact,
        )
    else:
        target, _ = load_with_choice(backend_obj, model, dtype=dtype, device=device, exact=exact)
        tokenizer = getattr(target, "tokenizer", None)
        prompts, batched = encode_prompts(
            prompt,
            tokenizer,
            target.vocab_size,
            chat_template=getattr(target, "chat_template", None),
        )
        check_fits_context(prompts, max_new_tokens, context_length(target), batched=batched)
    speculation = check_speculation(options.pop("speculation", None))
    verifier_choice = options.pop("verifier", None)
    tree_choice = options.pop("tree_builder", None)
    lookup = options.pop("lookup", None)
    options, planned = planned_options(backend_obj, target, named, options)
    drafter_obj = load_drafter(named, target, backend_obj, registry, options)
    if lookup is None:
        lookup = lookup_by_default(named, drafter_obj, verifier_choice, planned)
    if lookup:
        drafter_obj = add_lookup(drafter_obj, lookup, backend_obj, target)
        named = with_lookup(named)
    caps = drafter_caps(drafter_obj, named.source)
    if not lease.is_busy(target):  # it uses every slot; a busy target is refused when it decodes
        guard_exact_mode(
            backend_obj,
            target,
            max_nodes=min(caps.max_tree_size or GUARD_NODES, TREE_ROOM),
            rows=target.num_slots,
            insist=exact is True,
        )
    if tree_room is None:  # an engine passes its own, which it checks itself
        room = (
            int(target.capacity) - max(map(len, prompts)) - int(max_new_tokens) + 1
        )  # the last step's tree
        check_tree_room(
            caps.max_tree_size,
            room,
            named.source,
            "" if isinstance(model, (str, Path)) else ", or load the target with a larger capacity",
            lower=lower_options(named.spec, lookup=bool(lookup)),
        )
    tree_name, tree_options = caps.tree_builder
    tree = resolve("tree_builder", tree_choice or tree_name, registry, backend_obj.name)
    tree_builder = build(tree, registry, backend_obj.name, tree_options)
    if verifier_choice is None:
        verifier_choice = (
            "greedy" if sampling.greedy else ("rejection" if caps.sampled_proposals else "exact")
        )
    checker = resolve("verifier", verifier_choice, registry, backend_obj.name)
    verifier = build(checker, registry, backend_obj.name, {})
    if lookup and verifier_caps(verifier, checker.source).needs_draft_probs:
        raise InvalidInputError(
            f"verifier {verifier_choice!r} needs the draft distribution of every beam, and lookup "
            "beams are deterministic and have none; use the 'greedy' or 'exact' verifier (the "
            "defaults) with lookup"
        )
    eos = tuple(target.eos_token_ids) if stop_at_eos else ()
    sources = {c.kind: c.source for c in (named, tree, checker)}
    plan = DecodePlan(
        backend=backend_obj,
        target=target,
        drafter=drafter_obj,
        tree_builder=tree_builder,
        verifier=verifier,
        sampling=sampling,
        max_new_tokens=int(max_new_tokens),
        eos_token_ids=eos,
        sources=sources,
        speculation=speculation,
    )
    return plan, prompts, batched, tokenizer


def lookup_by_default(drafter: Resolved, drafter_obj, verifier_choice, planned=None) -> bool:
    """The prompt-lookup beam is on by default beside drafters whose spec pairs them with it
    (ReDrafter; an object passed in: never), or as ``specdec plan`` chose (``planned``: True or
    False; None: not planned), when the verifier is the default, greedy or exact one and the
    beams are not sampled."""
    pairs = drafter.spec is not None and (
        drafter.spec.pairs_with_lookup if planned is None else bool(planned)
    )
    return (
        pairs
        and verifier_choice in (None, "greedy", "exact")
        and not drafter_caps(drafter_obj).sampled_proposals
    )


def planned_keys(drafter: Resolved) -> tuple[str, ...]:
    """The settings ``specdec plan`` chooses for this drafter: a beam drafter's width and length,
    a tree drafter's tree settings (``DrafterSpec.tree_options``); () for others."""
    spec = drafter.spec
    if spec is None:  # an object passed in
        return ()
    return ("beam_width", "beam_length") if spec.beam_options else tuple(spec.tree_options)


def planned_options(backend, target, drafter: Resolved, options: dict):
    """(``options``, the lookup choice) that ``specdec plan`` made for this drafter on this
    machine (``specdec.tuning.dtype.cached_drafter_plan``), when the caller named none of its
    settings: ``options`` with those settings, and whether the prompt-lookup beam rode along
    (measured together; ``lookup_by_default``'s ``planned``); else ``options`` and None."""
    keys = planned_keys(drafter)
    plan = cached_drafter_plan(backend, target, drafter.choice) if keys else None
    if plan is None or set(keys) & set(options):
        return options, None
    options = {**options, **{k: v for k, v in plan["options"].items() if k in keys}}
    return options, plan.get("lookup")


def load_backend(name: str | None, registry: PluginRegistry):
    """The backend object for ``name`` (None: torch when it is installed, else numpy)."""
    if name is None:
        name = (
            "torch"
            if "torch" in registry.names("backend") and importlib.util.find_spec("torch")
            else "numpy"
        )
    return registry.get("backend", name).factory()


def load(
    model: Any,
    backend: str | None = None,
    *,
    dtype: str | None = None,
    device: str | None = None,
    slots: int = 1,
    capacity: int | None = None,
    exact: bool | None = None,
    registry: PluginRegistry | None = None,
):
    """Load a target model once, to pass to ``generate`` many times. ``dtype=None``: the fastest
    dtype measured on this machine (``specdec.tuning.dtype``; cached after the first measurement).
    exact: the target's exact mode, as in ``generate`` (None: on where this machine's check holds).
    slots: requests decoded at once (a batch larger than that waits for free slots); capacity:
    positions per slot, prompt and new tokens and a draft tree (None: the model's context length,
    at most ``specdec.slots.DEFAULT_CAPACITY``); sizes whose KV cache cannot fit the machine's (or
    the device's) memory are refused before it is allocated."""
    backend_obj = load_backend(backend, registry or default_registry())
    return compute.run_for(
        backend_obj,
        _load,
        backend_obj,
        model,
        dtype=dtype,
        device=device,
        slots=slots,
        capacity=capacity,
        exact=exact,
    )


def _load(backend_obj, model, *, dtype, device, slots, capacity, exact):
    sized = dict(slots=slots, capacity=capacity, exact=exact)
    try:
        target, choice = load_with_choice(
            backend_obj, resolve_model(model), dtype=dtype, device=device, **sized
        )
    except (InvalidInputError, MissingDependencyError):
        raise
    except Exception:
        if not repair_if_damaged(model):
            raise
        target, choice = load_with_choice(
            backend_obj, resolve_model(model), dtype=dtype, device=device, **sized
        )
    try:
        target.dtype_choice = choice
    except AttributeError:  # a frozen target class
        pass
    if isinstance(model, (str, Path)) and getattr(target, "chat_template", None) is None:
        try:
            target.chat_template = load_chat_template(resolve_model(model))
        except AttributeError:  # a frozen target class: chat prompts then need the folder
            pass
    return target


def load_with_choice(
    backend,
    model,
    *,
    dtype: str | None,
    device: str | None,
    slots: int = 1,
    capacity: int | None = None,
    exact: bool | None = None,
):
    """(target, DtypeChoice) of ``_load_choosing_dtype``, with the target's exact mode set from
    ``exact`` (``specdec.tuning.exactness.configure``; a loaded target keeps its own unless
    ``exact`` is given)."""
    exact = check_exact_option(exact)
    target, choice = _load_choosing_dtype(
        backend, model, dtype=dtype, device=device, slots=slots, capacity=capacity
    )
    if exact is not None or getattr(target, "exactness", None) is None:
        configure(target, exact, backend=backend.name)
    return target, choice


def _load_choosing_dtype(
    backend,
    model,
    *,
    dtype: str | None,
    device: str | None,
    slots: int = 1,
    capacity: int | None = None,
):
    """(target, ``specdec.tuning.dtype.DtypeChoice``): ``model`` loaded on ``backend`` after
    checking a model folder's files. ``dtype=None`` (or "auto") loads a model folder in the dtype
    measured fastest on this machine (``specdec.tuning.dtype``) when the backend offers several; a
    loaded target or a model object keeps its own. A failure of the backend becomes a ModelLoadError
    naming the model, the backend and the dtype / device asked for."""
    if isinstance(model, (str, Path)):
        check_model_folder(model)
        if capacity is None:  # check_model_folder checked its type
            context = read_json(Path(model) / "config.json", what="model config").get(
                "max_position_embeddings"
            )
            capacity = min(context or DEFAULT_CAPACITY, DEFAULT_CAPACITY)
    try:
        if (
            dtype in (None, "auto")
            and hasattr(backend, "dtype_candidates")
            and isinstance(model, (str, Path))
        ):
            return load_fastest(backend, model, device=device, slots=slots, capacity=capacity)
        dtype = None if dtype == "auto" else dtype
        target = backend.load_target(
            model, dtype=dtype, device=device, slots=slots, capacity=capacity
        )
    except SpecdecError:
        raise
    except Exception as exc:  # noqa: BLE001
        # whatever the backend's framework raises (its own config validation included) is
        # reported as this load failing, in one line; --debug shows the traceback
        asked = "".join(
            f", {k}={v!r}" for k, v in (("dtype", dtype), ("device", device)) if v is not None
        )
        detail = " ".join(str(exc).split()) or type(exc).__name__
        raise ModelLoadError(
            f"the {backend.name} backend could not load "
            f"{model if isinstance(model, (str, Path)) else 'the model'}{asked}: {detail}"
        ) from exc
    loaded = getattr(target, "dtype", None) or dtype
    return target, DtypeChoice(
        dtype=str(loaded).rpartition(".")[2] if loaded else "the backend's own",
        source="given" if dtype else "the backend's default",
    )


def encode_prompts(
    prompt: Any, tokenizer, vocab_size: int, *, chat_template: str | None = None
) -> tuple[list[list[int]], bool]:
    """Token-id prompts and whether the input was a batch; checks emptiness and id range.

    A prompt is text, token ids, or a chat (a list of {"role", "content"} messages, rendered with
    the model's chat template); a batch is a list of prompts.
    """
    check_prompt_type(prompt)
    prompt = plain_prompt(prompt)  # NumPy arrays of token ids as lists
    if (
        isinstance(prompt, str)
        or is_messages(prompt)
        or (isinstance(prompt, Sequence) and prompt and _is_token(prompt[0]))
    ):
        prompts, batched = [prompt], False
    elif isinstance(prompt, Sequence) and len(prompt) > 0:
        prompts, batched = list(prompt), True
    else:
        raise InvalidInputError(
            "the prompt is empty: give a string, a list of token ids, or a list of those"
        )
    encoded = []
    for row, p in enumerate(prompts):
        where = f"prompt {row} of the batch" if batched else "the prompt"
        if is_messages(p):
            p = check_text(render_chat(chat_template, p), f"{where} (the rendered chat)")
        if isinstance(p, str):
            if tokenizer is None:
                raise InvalidInputError(
                    "a text prompt needs a tokenizer, and this model has none (no tokenizer.json "
                    "in its folder): pass token ids instead"
                )
            p = tokenizer.encode(p).ids
        ids = list(p) if isinstance(p, (Sequence, np.ndarray)) else None
        if not ids:
            raise InvalidInputError(f"{where} is empty: it needs at least one token")
        if not all(_is_token(t) for t in ids):
            raise InvalidInputError(f"{where} must hold integer token ids, got {ids[:8]!r}")
        bad = [int(t) for t in ids if not 0 <= int(t) < vocab_size]
        if bad:
            raise InvalidInputError(
                f"{where} has token ids outside the vocabulary [0, {vocab_size}): {bad[:8]}"
            )
        encoded.append([int(t) for t in ids])
    return encoded, batched


def _is_token(value) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, bool)


def load_drafter(drafter: Resolved, target, backend, registry: PluginRegistry, options: dict):
    """The Drafter object of a resolved drafter, for the Backend ``backend``."""
    if drafter.name is None:
        if options:
            raise InvalidInputError(
                f"options {sorted(options)} cannot be applied to a Drafter object"
            )
        return drafter.choice
    if drafter.checkpoint is None:
        with _options_named(drafter, options):
            return build(
                drafter,
                registry,
                backend.name,
                options,
                target=target,
                checkpoint=None,
                backend=backend,
            )
    with damaged_checkpoint(drafter.checkpoint), _options_named(drafter, options):
        return build(
            drafter,
            registry,
            backend.name,
            options,
            target=target,
            checkpoint=drafter.checkpoint,
            backend=backend,
        )


@contextlib.contextmanager
def _options_named(drafter: Resolved, options: dict):
    """A drafter's refusal of a value the caller gave (its message names the option) reported as
    that argument's error, not as a damaged checkpoint (``damaged_checkpoint``)."""
    try:
        yield
    except SpecdecError:
        raise
    except (ValueError, TypeError) as exc:
        detail = " ".join(str(exc).split())
        named = [key for key in options if re.search(rf"\b{re.escape(key)}\b", detail)]
        if not named:
            raise
        given = ", ".join(f"{key}={options[key]!r}" for key in named)
        raise InvalidInputError(
            f"drafter {drafter.name!r} refuses the option(s) given, {given}: {detail}"
        ) from None


def add_lookup(drafter, lookup, backend, target):
    """``drafter`` with a prompt-lookup beam added to its drafts (``specdec.drafting.lookup``)."""
    if isinstance(drafter, (NoDrafter, LookupDrafter)):
        alone = (
            "drafter='lookup' is prompt lookup alone: give its chain's length as draft_length=N "
            "(CLI: --lookup-length N)"
            if isinstance(drafter, LookupDrafter)
            else "for prompt lookup alone use drafter='lookup'"
        )
        raise InvalidInputError(
            f"lookup={lookup!r} adds a prompt-lookup beam to a model drafter's beams (e.g. "
            f"drafter='redrafter'); {alone}"
        )
    tree_name = drafter_caps(drafter).tree_builder[0]
    if tree_name != "prefix_tree":
        raise InvalidInputError(
            f"lookup joins drafters whose beams make a prefix tree; {type(drafter).__name__} "
            f"drafts for the {tree_name!r} tree builder (e.g. Medusa's head top-k tree): use it "
            "without lookup, or drafter='lookup'"
        )
    if lookup is True:
        lookup = {}
    elif is_int(lookup):
        lookup = {"draft_length": lookup}
    if not isinstance(lookup, dict) or set(lookup) - {"max_ngram", "min_ngram", "draft_length"}:
        raise InvalidInputError(
            "lookup must be True, the lookup chain's length in drafted tokens (an int), or a dict "
            f"of draft_length / max_ngram / min_ngram, got {lookup!r}"
        )
    return LookupDrafter(backend, target, inner=drafter, **lookup)


def collect(steps, batch_size: int, *, batched: bool, tokenizer=None) -> GenerationResult:
    """Run the step generator to the end and aggregate tokens and stats."""
    tokens: list[list[int]] = [[] for _ in range(batch_size)]
    totals = dict(
        steps=0, row_steps=0, drafted=0, verified=0, accepted=0, draft=0.0, verify=0.0, other=0.0
    )
    drafting = decoding = 0  # row-steps that drafted, of those that decoded
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
        totals["drafted"] += int(np.sum(result.num_drafted))
        totals["verified"] += int(np.sum(result.num_verified))
        totals["accepted"] += int(np.sum(result.num_accepted))
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
    )
    text = [tokenizer.decode(t) for t in tokens] if tokenizer is not None else None
    if not batched:
        return GenerationResult(
            tokens=tokens[0], stats=stats, text=None if text is None else text[0]
        )
    return GenerationResult(tokens=tokens, stats=stats, text=text)
