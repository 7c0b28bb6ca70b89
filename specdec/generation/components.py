"""A generation's components, apart from any prompt: the drafter (with the prompt-lookup beam
beside it where it pairs, the settings ``specdec plan`` chose on this machine), the tree builder
and the verifier, resolved once over a loaded target into a ``DecodePlan``
(``decode_plan``). ``generate``, ``stream``, the engine, the CLI and the conformance kit build
their plans here; requests (prompts, sampling, lengths, stops) are each caller's own."""

from __future__ import annotations

import contextlib
import re
from pathlib import Path
from typing import Any

from specdec import compute
from specdec.capabilities import drafter_caps, verifier_caps
from specdec.decode import lease
from specdec.decode.budget import check_speculation
from specdec.decode.plan import DecodePlan
from specdec.drafting.lookup import LookupDrafter
from specdec.drafting.none import NoDrafter
from specdec.drafting.store import resolve_store
from specdec.errors import InvalidInputError, PluginError, SpecdecError
from specdec.generation.arguments import check_drafter_path, is_int
from specdec.generation.built import built_drafter
from specdec.generation.loading import load_backend
from specdec.generation.options import check_drafter_options
from specdec.generation.resolve import Resolved, build, resolve, with_lookup
from specdec.models.files import damaged_checkpoint
from specdec.plugins.on_host import HostTreeBuilder
from specdec.plugins.registry import PluginRegistry, default_registry
from specdec.slots import TREE_ROOM, lower_options
from specdec.tuning.plans import cached_drafter_plan
from specdec.tuning.guard import GUARD_NODES, guard_exact_mode


# generate's options that choose how to draft rather than go to the drafter
DRAFTING_OPTIONS = ("speculation", "verifier", "tree_builder", "lookup")


def resolve_drafter(drafter: Any, backend: str, options: dict, registry=None) -> Resolved:
    """The drafter named (a name, a checkpoint folder or a Drafter object), with the options
    given checked against what it takes: before any model loads."""
    registry = registry or default_registry()
    if isinstance(drafter, Resolved):
        return drafter
    check_drafter_path(drafter, registry.names("drafter"))
    named = resolve("drafter", drafter, registry, backend)
    check_drafter_options(named, registry, backend, options)
    return named


def decode_plan(
    target,
    drafter: Any,
    backend=None,
    *,
    greedy: bool = True,
    exact: bool | None = None,
    registry: PluginRegistry | None = None,
    **options: Any,
) -> DecodePlan:
    """The ``DecodePlan`` of ``drafter`` over a loaded ``target`` on ``backend`` (a name or a
    Backend object; None: torch where it is installed, else numpy, as ``generate``), with no
    prompt in it; built on the process's compute thread where the backend wants one
    (``specdec.compute``), as decoding runs.

    ``drafter``: as ``generate``'s (or a ``resolve_drafter`` result); ``options``: ``generate``'s
    drafting options (``verifier``, ``tree_builder``, ``lookup``, ``speculation`` and the
    drafter's own). ``greedy``: whether the requests decode greedily, for the default verifier
    (greedy; else rejection sampling for sampled drafts, exact tree sampling otherwise; "exact"
    serves both). ``exact``: True insists that the target's exact mode holds for this drafter's
    trees (the decoding guard, ``specdec.tuning.guard``). The plan's request settings are those
    of greedy requests of 128 tokens that stop at the model's end tokens; callers set their own
    (``attrs.evolve``) or make requests of their own."""
    registry = registry or default_registry()
    backend_obj = (
        backend if hasattr(backend, "load_target") else load_backend(backend, registry, target)
    )
    return compute.run_for(
        backend_obj, _decode_plan, target, drafter, backend_obj, greedy, exact, registry, options
    )


def _decode_plan(target, drafter, backend_obj, greedy, exact, registry, options) -> DecodePlan:
    options = dict(options)
    speculation = check_speculation(options.pop("speculation", None))
    verifier_choice = options.pop("verifier", None)
    tree_choice = options.pop("tree_builder", None)
    lookup = options.pop("lookup", None)
    named = resolve_drafter(drafter, backend_obj.name, options, registry)
    given = options
    options, planned = planned_options(backend_obj, target, named, options)
    drafter_obj = _drafter(named, target, backend_obj, registry, options)
    if lookup is None:
        lookup = lookup_by_default(named, drafter_obj, verifier_choice, planned)
    spec = named.spec
    # what "auto" remembers its learning under (specdec.decode.memory); None: the drafter object
    setting = (
        None
        if named.name is None
        else repr(
            (
                named.name,
                str(named.checkpoint),
                sorted(options.items()),
                lookup,
                verifier_choice,
                tree_choice,
                greedy,
            )
        )
    )
    if lookup:
        drafter_obj = add_lookup(drafter_obj, lookup, backend_obj, target)
        named = with_lookup(named)
    caps = drafter_caps(drafter_obj, named.source)
    # The guard uses every slot, so not on a busy target (refused when it decodes), and measures
    # nothing for a tree larger than a whole slot, which the caller's room check refuses
    # (generate, Engine: ``DecodePlan.check_tree_room``) before any step.
    fits = caps.max_tree_size is None or caps.max_tree_size <= int(target.capacity)
    if fits and not lease.is_busy(target):
        guard_exact_mode(
            backend_obj,
            target,
            max_nodes=min(caps.max_tree_size or GUARD_NODES, TREE_ROOM),
            rows=target.num_slots,
            insist=exact is True,
        )
    tree_name, tree_options = caps.tree_builder
    tree = resolve("tree_builder", tree_choice or tree_name, registry, backend_obj.name)
    tree_builder = build(tree, registry, backend_obj.name, tree_options)
    if isinstance(tree_builder, HostTreeBuilder):  # a NumPy one on another backend
        tree_builder.bind(backend_obj, target)
    if verifier_choice is None:
        verifier_choice = (
            "greedy" if greedy else ("rejection" if caps.sampled_proposals else "exact")
        )
    checker = resolve("verifier", verifier_choice, registry, backend_obj.name)
    verifier = build(checker, registry, backend_obj.name, {})
    if not greedy and not verifier_caps(verifier, checker.source).samples:
        raise InvalidInputError(
            f"verifier {verifier_choice!r} decodes greedily (it ignores temperature, top_k and "
            "top_p); for sampling leave verifier= out (exact tree sampling) or use 'exact' or "
            "'rejection'"
        )
    if lookup and verifier_caps(verifier, checker.source).needs_draft_probs:
        raise InvalidInputError(
            f"verifier {verifier_choice!r} needs the draft distribution of every beam, and lookup "
            "beams are deterministic and have none; use the 'greedy' or 'exact' verifier (the "
            "defaults) with lookup"
        )
    return DecodePlan(
        backend=backend_obj,
        target=target,
        drafter=drafter_obj,
        tree_builder=tree_builder,
        verifier=verifier,
        eos_token_ids=tuple(target.eos_token_ids),
        sources={c.kind: c.source for c in (named, tree, checker)},
        speculation=speculation,
        smaller_trees=lower_options(spec, lookup=bool(lookup)),
        setting=setting,
        planned=options != given,
    )


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
    machine (``specdec.tuning.plans.cached_drafter_plan``), when the caller named none of its
    settings: ``options`` with those settings, and whether the prompt-lookup beam rode along
    (measured together; ``lookup_by_default``'s ``planned``); else ``options`` and None."""
    keys = planned_keys(drafter)
    plan = cached_drafter_plan(backend, target, drafter.choice) if keys else None
    if plan is None or set(keys) & set(options):
        return options, None
    options = {**options, **{k: v for k, v in plan["options"].items() if k in keys}}
    return options, plan.get("lookup")


def _drafter(named: Resolved, target, backend, registry: PluginRegistry, options: dict):
    """``load_drafter``'s, or the one built for the same target, factory, checkpoint and options
    before (``specdec.generation.built``)."""
    build = lambda: load_drafter(named, target, backend, registry, options)  # noqa: E731
    if named.name is None:
        return build()
    try:
        factory = registry.get("drafter", named.name, backend.name).factory
    except SpecdecError:
        return build()  # load_drafter says what is wrong
    key = (backend.name, named.name, repr(sorted(options.items())))
    return built_drafter(target, key, factory, named.checkpoint, build)


def load_drafter(drafter: Resolved, target, backend, registry: PluginRegistry, options: dict):
    """The Drafter object of a resolved drafter, for the Backend ``backend``."""
    if drafter.name is None:
        if options:
            raise InvalidInputError(
                f"options {sorted(options)} cannot be applied to a Drafter object"
            )
        return drafter.choice
    checkpoint = drafter.checkpoint
    damaged = _factory_failed(drafter) if checkpoint is None else damaged_checkpoint(checkpoint)
    with damaged, _options_named(drafter, options):
        return build(
            drafter,
            registry,
            backend.name,
            options,
            target=target,
            checkpoint=checkpoint,
            backend=backend,
        )


@contextlib.contextmanager
def _factory_failed(drafter: Resolved):
    """A drafter factory's own failure (a bug in a plugin, not a refused option) reported with
    the drafter and the distribution it came from; the original stays chained (its traceback
    under ``specdec --debug``), so the reader knows whose code to look at."""
    try:
        yield
    except SpecdecError:
        raise
    except Exception as exc:  # noqa: BLE001 - whatever the plugin's code raised
        raise PluginError(
            f"{drafter.source} failed while building its drafter: {type(exc).__name__}: {exc} "
            "(an error in the plugin's factory; its traceback is chained below, or shown by "
            "specdec --debug)"
        ) from exc


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
            "(CLI: --lookup-length N); it continues from the answer store shipped for the model "
            "by default (store='auto'; CLI lookup:store=FILE for one of your own)"
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
    elif isinstance(lookup, (str, Path)):  # the CLI's redrafter:lookup=store or =FILE.npz
        lookup = {"store": True if str(lookup) == "store" else lookup}
    keys = {"max_ngram", "min_ngram", "draft_length", "unigram_length", "store"}
    if not isinstance(lookup, dict) or set(lookup) - keys:
        raise InvalidInputError(
            "lookup must be True, the lookup chain's length in drafted tokens (an int), 'store' "
            "(with the answer store shipped for the model), the path of an answer store, or a "
            "dict of draft_length / max_ngram / min_ngram / unigram_length / store, got "
            f"{lookup!r}"
        )
    # beside a model drafter no store by default: its chain's nodes cost more than they return
    # there (docs/algorithms/lookup.md, "From a store of the model's answers")
    lookup = {**lookup, "store": resolve_store(lookup.get("store", False), target)}
    return LookupDrafter(backend, target, inner=drafter, **lookup)
