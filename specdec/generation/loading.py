"""Loading a target: the backend by name, a model folder read once into a ``ModelFolder``, the
target in the dtype measured fastest here with its exact mode set, and a damaged cached model
converted again."""

from __future__ import annotations

import functools
import importlib.util
from pathlib import Path
from typing import Any

import attrs

from specdec import compute
from specdec.errors import InvalidInputError, MissingDependencyError, ModelLoadError, SpecdecError
from specdec.generation.arguments import check_fits_context, context_length
from specdec.generation.chat import load_chat_template
from specdec.generation.encoding import encode_prompts
from specdec.models.bundled import repair_if_damaged, resolve_model
from specdec.models.files import check_model_folder
from specdec.models.llama import load_tokenizer
from specdec.plugins.registry import PluginRegistry, default_registry
from specdec.slots import DEFAULT_CAPACITY, TREE_ROOM
from specdec.tuning.dtype import DtypeChoice, load_fastest
from specdec.tuning.exactness import check_exact_option, configure


@attrs.frozen(slots=False)
class ModelFolder:
    """A local Hugging Face-format model folder, checked once (``check_model_folder``): its path
    and config.json; its tokenizer and chat template are read when first asked for."""

    path: Path
    config: dict

    @classmethod
    def read(cls, folder) -> "ModelFolder":
        # check_model_folder refuses sizes (vocab_size included) that are not positive integers
        return cls(path=Path(folder), config=check_model_folder(folder))

    @classmethod
    def of(cls, model) -> "ModelFolder | None":
        """``model`` resolved (a bundled name or a GGUF file converted once) and read; None for
        a loaded target or a framework's model object."""
        folder = resolve_model(model)
        return cls.read(folder) if isinstance(folder, (str, Path)) else None

    @property
    def vocab_size(self) -> int:
        return int(self.config.get("vocab_size", 0)) or 2**62

    @property
    def context(self) -> int | None:
        """The model's context length (``max_position_embeddings``), if config.json says."""
        return self.config.get("max_position_embeddings")

    @functools.cached_property
    def tokenizer(self):
        return load_tokenizer(self.path)

    @functools.cached_property
    def chat_template(self) -> str | None:
        return load_chat_template(self.path)


def load_backend(name: str | None, registry: PluginRegistry, model: Any = None):
    """The backend object for ``name`` (None: the backend that loaded ``model`` when it is a target
    ``specdec.load`` returned, else torch when it is installed, else numpy)."""
    if name is None:
        name = getattr(model, "backend_name", None)
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
        target.backend_name = backend_obj.name  # what generate(target) uses when given none
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
    try:
        target.dtype_choice = choice  # what its users print (the demo, bench, generate)
    except AttributeError:  # a frozen target class
        pass
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
    """(target, ``specdec.tuning.dtype.DtypeChoice``): ``model`` (a folder's path, a
    ``ModelFolder``, a loaded target or a model object) loaded on ``backend``, a folder's files
    checked first. ``dtype=None`` (or "auto") loads a model folder in the dtype measured fastest
    on this machine (``specdec.tuning.dtype``) when the backend offers several; a loaded target
    or a model object keeps its own. A failure of the backend becomes a ModelLoadError naming
    the model, the backend and the dtype / device asked for."""
    if isinstance(model, (str, Path)):
        model = ModelFolder.read(model)
    if isinstance(model, ModelFolder):
        if capacity is None:
            capacity = min(model.context or DEFAULT_CAPACITY, DEFAULT_CAPACITY)
        model = model.path
    try:
        if (
            dtype in (None, "auto")
            and hasattr(backend, "dtype_candidates")
            and isinstance(model, Path)
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
            f"{model if isinstance(model, Path) else 'the model'}{asked}: {detail}"
        ) from exc
    loaded = getattr(target, "dtype", None) or dtype
    return target, DtypeChoice(
        dtype=str(loaded).rpartition(".")[2] if loaded else "the backend's own",
        source="given" if dtype else "the backend's default",
    )


def load_for_prompts(backend, model, prompt, max_new_tokens: int, *, dtype, device, exact):
    """(target, token prompts, batched, tokenizer) for ``generate``: a model folder (or bundled
    name, or GGUF file) read once, the prompts encoded with its tokenizer and chat template and
    checked against its context, then loaded with one slot per prompt sized to fit them,
    ``max_new_tokens`` and a draft tree; a loaded target or a model object is loaded as it is
    first, and the prompts encoded with its own tokenizer."""
    folder, target = ModelFolder.of(model), None
    if folder is None:
        target, _ = load_with_choice(backend, model, dtype=dtype, device=device, exact=exact)
        tokenizer, template = (
            getattr(target, name, None) for name in ("tokenizer", "chat_template")
        )
        vocab, context = target.vocab_size, context_length(target)
    else:
        tokenizer, template = folder.tokenizer, folder.chat_template
        vocab, context = folder.vocab_size, folder.context
    prompts, batched = encode_prompts(prompt, tokenizer, vocab, chat_template=template)
    check_fits_context(prompts, max_new_tokens, context, batched=batched)
    if target is None:
        target, _ = load_with_choice(
            backend,
            folder,
            dtype=dtype,
            device=device,
            slots=len(prompts),
            capacity=max(map(len, prompts)) + max_new_tokens + TREE_ROOM,
            exact=exact,
        )
    return target, prompts, batched, tokenizer
