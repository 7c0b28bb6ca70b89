"""Export drafters to the layouts serving engines load, and import those layouts
(docs/scale-out.md).

Each drafter's spec declares its layouts (``specdec.plugins.specs.Layout``: detect, read, write);
this module resolves names, checks arguments and dispatches, so it works the same for a third-party
drafter that declares layouts. The shipped drafters declare: ReDrafter -> ``apple``
(apple/ml-recurrent-drafter, which TensorRT-LLM's converter reads); Medusa -> ``fasterdecoding``
(FasterDecoding/Medusa, TensorRT-LLM) and ``vllm``; EAGLE-3 -> ``specforge`` (SpecForge, which
SGLang and TensorRT-LLM read), ``speculators`` (vLLM) and ``gguf`` (llama.cpp, one file).
``tensorrt-llm`` is an alias of the layout TensorRT-LLM reads. EAGLE (EAGLE-1's draft layer)
declares none. ``specdec.generate(..., drafter=folder)`` loads any declared layout directly (a
single-file layout also as the file); ``import_drafter`` writes one as the drafter's own
checkpoint.
"""

from __future__ import annotations

import contextlib
import functools
from importlib import resources
from pathlib import Path

import attrs
import numpy as np
from safetensors import safe_open

from specdec.errors import CorruptFileError, InvalidInputError, SpecdecError
from specdec.models.bundled import resolve_model
from specdec.models.checkpoints import check_trained_for
from specdec.models.files import check_checkpoint_folder, damaged_checkpoint, read_json
from specdec.models.outfolder import check_out, writing
from specdec.plugins.registry import default_registry
from specdec.plugins.support import check_finite
from specdec.reference.model import load_target
from specdec.slots import TREE_ROOM, check_tree_room

__all__ = [
    "ExportResult",
    "detect_layout",
    "export",
    "formats",
    "import_drafter",
    "is_checkpoint_file",
    "load_drafter_folder",
    "stored_dtype",
]

EAGLE_MESSAGE = (
    "specdec has no engine layout for the EAGLE drafter (EAGLE-1's draft layer), so "
    "it is not exported; EAGLE-3 heads are: export an EAGLE-3 checkpoint in format "
    "'specforge' (SGLang, TensorRT-LLM), 'speculators' (vLLM) or 'gguf' (llama.cpp)"
)
EAGLE_FOLDER = (
    "specdec runs its own EAGLE and EAGLE-3 checkpoints, and EAGLE-3 heads in the "
    "SpecForge layout (a Llama config.json with draft_vocab_size, as SGLang reads), "
    "vLLM's speculators layout (speculators_model_type 'eagle3') or llama.cpp's GGUF "
    "(architecture 'eagle3'); this folder is none of them"
)


def _specs(registry=None):
    return (registry or default_registry()).drafter_specs()


def formats(registry=None) -> dict[str, tuple[str, ...]]:
    """Drafter name -> the layouts it exports to (its spec's ``layouts``)."""
    return {
        spec.name: tuple(layout.name for layout in spec.layouts)
        for spec in _specs(registry)
        if spec.layouts
    }


@attrs.frozen
class ExportResult:
    """What ``export`` or ``import_drafter`` wrote: the folder, the drafter kind, the layout, the
    notes on every conversion (and on what the engine fixes itself), and for exports the engine
    command lines that load it."""

    path: Path
    drafter: str
    format: str
    notes: tuple[str, ...] = ()
    commands: tuple[str, ...] = ()


def detect_layout(folder, registry=None) -> tuple[str, str] | None:
    """(drafter name, layout) of a checkpoint folder, or None when it is none of the known ones:
    ``specdec`` for a drafter's own checkpoint, else a layout its spec declares. A single file
    (a GGUF draft, say) is detected once per version of it: a call checks the path, resolves
    the drafter and loads it, and each would otherwise read the file's header again."""
    folder = Path(folder)
    if folder.is_file():
        stat = folder.stat()
        registry = registry or default_registry()
        return _detect_file(str(folder.resolve()), stat.st_mtime_ns, stat.st_size, registry)
    return _detect(folder, registry)


@functools.lru_cache(maxsize=16)
def _detect_file(path: str, mtime_ns: int, size: int, registry) -> tuple[str, str] | None:
    return _detect(Path(path), registry)


def _detect(folder: Path, registry) -> tuple[str, str] | None:
    config_file = folder / "config.json"
    config = {}
    if config_file.is_file():
        try:
            config = read_json(config_file, what="drafter config", kind=None)
        except (OSError, ValueError):  # CorruptFileError included: the reader names the file
            return None
    if not isinstance(config, dict):
        return None
    model_type = config.get("model_type")
    specs = _specs(registry)
    for spec in specs:
        if spec.model_type is not None and model_type == spec.model_type:
            return spec.name, "specdec"
    for spec in specs:
        for layout in spec.layouts:
            with _detecting(folder, spec.name, layout.name):
                found = layout.detect(folder, config)
            if found:
                return spec.name, layout.name
    if model_type and "eagle" in str(model_type).lower():
        raise InvalidInputError(
            f"drafter checkpoint {folder} has model_type {model_type!r}, an "
            f"EAGLE drafter: {EAGLE_FOLDER}"
        )
    return None


@contextlib.contextmanager
def _detecting(folder: Path, drafter: str, layout: str):
    """A layout's ``detect`` failing on what a folder holds (a config value of the wrong type,
    say) reported as that folder's damage, in one line."""
    try:
        yield
    except SpecdecError:
        raise
    except (ValueError, LookupError, TypeError, OSError, RecursionError) as exc:
        detail = " ".join(str(exc).split()) or type(exc).__name__
        raise CorruptFileError(
            f"drafter checkpoint {folder} could not be read as a {drafter} drafter in the "
            f"{layout} layout: {detail}; fix its config.json or restore it"
        ) from exc


def is_checkpoint_file(path, registry=None) -> bool:
    """Whether ``path`` is a file (not a folder) that a declared layout reads, such as a
    single-file format given in place of its folder."""
    path = Path(path).expanduser()
    return path.is_file() and detect_layout(path, registry) is not None


def load_drafter_folder(folder, registry=None):
    """(kind, layout, config, float64 weights, notes) of a drafter folder in any known layout; a
    config whose trees cannot fit the room ``generate`` keeps for them (``DrafterSpec.tree_size``,
    ``specdec.slots.TREE_ROOM``) is refused, as ``generate`` refuses it."""
    found = detect_layout(folder, registry)
    if found is None:
        known = ", ".join(
            f"{name}: {', '.join(layouts)}" for name, layouts in formats(registry).items()
        )
        raise InvalidInputError(
            f"{folder} is not a drafter checkpoint specdec knows: expected a drafter's own "
            f"checkpoint (config.json with its model_type) or one of the engines' layouts ({known})"
        )
    kind, layout = found
    spec = _spec(kind, registry)
    with damaged_checkpoint(folder):
        if layout == "specdec":
            check_checkpoint_folder(folder)
            config, weights = spec.load_checkpoint(folder)
            notes = []
        else:
            config, weights, notes = _layout(spec, layout).read(folder)
    if spec.tree_size is not None:  # from the config: nothing is built
        check_tree_room(
            spec.tree_size(config),
            TREE_ROOM + 1,
            f"{Path(folder) / 'config.json'} (a {kind} drafter)",
            "",
            lower="set smaller tree settings in that file (for beams: W of length L "
            "make 1 + W * (L - 1) nodes, e.g. beam_width 4, beam_length 5)",
        )
    check_finite(weights, folder)
    return kind, layout, config, weights, list(notes)


def _spec(name: str, registry=None):
    return (registry or default_registry()).drafter_spec(name)


def _layout(spec, name: str):
    wanted = str(name).lower()
    for layout in spec.layouts:
        if wanted == layout.name or wanted in layout.aliases:
            return layout
    if not spec.layouts:
        known = "; ".join(f"{kind}: {', '.join(layouts)}" for kind, layouts in formats().items())
        raise InvalidInputError(
            f"a {spec.name} drafter has no layout an engine loads, so it is "
            f"not exported (the drafters that have: {known})"
        )
    names = ", ".join(
        f"{layout.name}" + (f" ({'/'.join(layout.aliases)})" if layout.aliases else "")
        for layout in spec.layouts
    )
    raise InvalidInputError(f"the {spec.name} drafter exports to {names}, not {name!r}")


def _resolve_drafter(drafter, model) -> Path:
    if isinstance(drafter, str) and drafter.lower() == "eagle":
        raise InvalidInputError(EAGLE_MESSAGE)
    if isinstance(drafter, (str, Path)) and (
        Path(drafter).expanduser().is_dir() or is_checkpoint_file(drafter)
    ):
        return Path(drafter).expanduser()
    shipped_by = {spec.name: spec.package for spec in _specs() if spec.package}
    if drafter in shipped_by:
        if model is None:
            raise InvalidInputError(
                f"export {drafter!r} exports the drafter shipped for a model: pass model= "
                "(`--model`), e.g. smollm2-135m, or a checkpoint folder instead of the name"
            )
        name = Path(str(model)).name
        shipped = resources.files(shipped_by[drafter]) / "weights" / name
        if not shipped.joinpath("config.json").is_file():
            raise InvalidInputError(
                f"no {drafter} drafter ships for {name!r}: pass the checkpoint folder to export"
            )
        return Path(str(shipped))
    raise InvalidInputError(
        f"drafter must be a checkpoint folder or one of {', '.join(sorted(shipped_by))}, "
        f"got {drafter!r}"
    )


def _model_path(model) -> Path | None:
    """The target's folder or file when ``model`` names one on disk (a source the export reads)."""
    if isinstance(model, (str, Path)) and Path(model).expanduser().exists():
        return Path(model).expanduser()
    return None


def _target_lm_head(model, config, kind: str):
    """The target's LM head (V, H) as float64, after checking the drafter was trained for it."""
    if model is None:
        return None
    target = load_target(resolve_model(model))  # the numpy backend's target
    check_trained_for(config, target, drafter=kind)
    return target.lm_head


def export(
    drafter,
    format: str,
    out,
    *,
    model=None,
    drop_shortlist: bool = False,
    choices=None,
    dtype: str | None = None,
    overwrite: bool = False,
) -> ExportResult:
    """Write ``drafter`` (a checkpoint folder, or "redrafter" / "medusa" for the one shipped for
    ``model``) into ``out`` in ``format`` (see the module table).

    model: the target (folder or bundled name); needed for a tied head, whose projection the
    layouts store, and given to the writer of a layout that copies from the target
    (``Layout.takes_model``). drop_shortlist: export a shortlisted ReDrafter over the full
    vocabulary (refused otherwise). choices: Medusa only, "chain" or a list of paths to record
    instead of the drafter's tree (vLLM runs the chain only). dtype: one the layout stores
    (``Layout.dtypes``: "float32" or "float16"; "bfloat16" too for llama.cpp's GGUF); None: the
    type the checkpoint's weights are stored in (``stored_dtype``) where the layout stores it,
    else float32.
    Everything that cannot be carried over exactly is refused with the fix; every conversion is
    listed in ``notes``.
    """
    if str(format).lower() == "eagle":
        raise InvalidInputError(EAGLE_MESSAGE)
    source = _resolve_drafter(drafter, model)
    check_out(out, overwrite=overwrite, sources=[source, _model_path(model)])
    kind, layout, config, weights, notes = load_drafter_folder(source)
    chosen = _layout(_spec(kind), format)
    stored = stored_dtype(source)
    if dtype is None:
        dtype = stored if stored in chosen.dtypes else "float32"
    if dtype not in chosen.dtypes:
        takes = [layout.name for layout in _spec(kind).layouts if dtype in layout.dtypes]
        raise InvalidInputError(
            f"the {chosen.name} layout stores {' or '.join(chosen.dtypes)}, not {dtype!r}"
            + (f" ({dtype} is written to: {', '.join(takes)})" if takes else "")
        )
    lm_head = None
    if getattr(config, "head", "full") == "tied":
        if model is None:
            raise InvalidInputError(
                f"this {kind} drafter ends with the target's LM head (head='tied'); the "
                f"{chosen.name} layout stores that projection, so pass model= (`--model`, the "
                "target folder or bundled name)"
            )
        lm_head = _target_lm_head(model, config, kind)
    options = {"model": model} if chosen.takes_model else {}
    with (
        writing(
            out,
            overwrite=overwrite,
            sources=[source, _model_path(model)],
            what=f"export {chosen.name}",
        ) as work,
        _choices_named(chosen.name, choices),
    ):
        more, commands = chosen.write(
            config,
            weights,
            work,
            lm_head=lm_head,
            dtype=dtype,
            choices=choices,
            drop_shortlist=drop_shortlist,
            **options,
        )
        folder = Path(out).expanduser().absolute()
        # the writers name the folder they wrote in their commands: the one swapped in, whole
        # (a relative path broke a command pasted on another machine or in another folder)
        commands = tuple(command.replace(str(work), str(folder)) for command in commands)
    more = list(more)
    if dtype != "float32" and dtype != stored:
        more.append(f"weights were stored as {dtype}, rounding the float32 values")
    elif dtype != "float32":
        more.append(
            f"weights stored as {dtype}, the checkpoint's own type (--dtype, or dtype=, to choose)"
        )
    return ExportResult(
        path=folder,
        drafter=kind,
        format=chosen.name,
        notes=tuple(notes + more),
        commands=tuple(commands),
    )


@contextlib.contextmanager
def _choices_named(layout: str, choices):
    """A layout writer's refusal of the ``choices`` the caller gave (paths it cannot draft)
    reported as that argument's error."""
    try:
        yield
    except SpecdecError:
        raise
    except (ValueError, TypeError) as exc:
        if choices is None:
            raise
        detail = " ".join(str(exc).split()) or type(exc).__name__
        raise InvalidInputError(
            f"the {layout} layout refuses choices={choices!r:.80}: {detail}"
        ) from exc


def import_drafter(
    folder, out, *, overwrite: bool = False, dtype: str | None = None
) -> ExportResult:
    """Read a drafter in any known layout from ``folder`` and write it as a specdec checkpoint in
    ``out``; dtype: "float32" or "float16", None: the type the folder's weights are stored in when
    it is one of those (``stored_dtype``), else float32."""
    source = Path(folder).expanduser()
    check_out(out, overwrite=overwrite, sources=[source])
    kind, layout, config, weights, notes = load_drafter_folder(source)
    stores = {"float32": np.float32, "float16": np.float16}
    if dtype is None:
        dtype = stored_dtype(source) if stored_dtype(source) in stores else "float32"
    if dtype not in stores:
        raise InvalidInputError(f"dtype must be float32 or float16, got {dtype!r}")
    store = stores[dtype]
    with writing(out, overwrite=overwrite, sources=[source], what=f"import {layout}") as work:
        _spec(kind).save_checkpoint(work, config, weights, dtype=store)
    target = Path(out).expanduser()
    return ExportResult(path=target, drafter=kind, format=layout, notes=tuple(notes))


SAFETENSORS_FLOATS = {"F32": "float32", "F16": "float16", "BF16": "bfloat16"}


def stored_dtype(source) -> str | None:
    """The float type a checkpoint's matrices are stored in ("float32", "float16" or "bfloat16"):
    that of every floating-point tensor of two or more dimensions in its safetensors files (integer
    tables such as a draft vocabulary's do not count), read from their headers; None when they
    differ, or for other files (a GGUF, a torch pickle)."""
    source = Path(source)
    # a training run's folder also holds trainer_state.safetensors (float32 optimizer state)
    weights = sorted(source.glob("model*.safetensors")) if source.is_dir() else []
    files = [source] if source.is_file() else weights or sorted(source.glob("*.safetensors"))
    found = set()
    for file in files:
        if file.suffix != ".safetensors":
            continue
        try:
            with safe_open(str(file), framework="np") as handle:
                for name in handle.keys():
                    piece = handle.get_slice(name)
                    floats = SAFETENSORS_FLOATS.get(piece.get_dtype())  # int tables do not count
                    if len(piece.get_shape()) >= 2 and floats is not None:
                        found.add(floats)
        except (OSError, ValueError, RuntimeError):
            return None  # the reader has already refused a damaged file; none to go by
    return found.pop() if len(found) == 1 else None


def describe(result: ExportResult) -> list[str]:
    """Lines for a person: what was written, the notes, the commands."""
    lines = [f"wrote the {result.drafter} drafter to {result.path} ({result.format} layout)"]
    lines += [f"note: {note}" for note in result.notes]
    lines += [f"  {command}" for command in result.commands]
    return lines
