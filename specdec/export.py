"""Export drafters to the layouts serving engines load, and import those layouts (docs/scale-out.md).

| drafter | format | layout | read by |
|---|---|---|---|
| ReDrafter | ``apple`` | apple/ml-recurrent-drafter (``config.json`` + ``model.safetensors``) | TensorRT-LLM ``examples/redrafter/convert_checkpoint.py`` |
| Medusa | ``fasterdecoding`` | FasterDecoding/Medusa (``medusa_lm_head.safetensors`` + ``config.json``) | TensorRT-LLM ``examples/medusa/convert_checkpoint.py`` |
| Medusa | ``vllm`` | vLLM's Medusa model (``model_type: "medusa"``) | vLLM ``--speculative-config '{"method": "medusa", ...}'`` |

``tensorrt-llm`` names the TensorRT-LLM format of each drafter. EAGLE is not available in specdec
yet. ``specdec.generate(..., drafter=folder)`` loads any of these layouts directly;
``import_drafter`` writes one as a specdec checkpoint.
"""

from __future__ import annotations

import json
import shutil
from importlib import resources
from pathlib import Path
import attrs

from specdec.errors import InvalidInputError

__all__ = ["FORMATS", "ExportResult", "detect_layout", "export", "import_drafter", "load_drafter_folder"]

FORMATS = {"redrafter": ("apple",), "medusa": ("fasterdecoding", "vllm")}
ALIASES = {("redrafter", "tensorrt-llm"): "apple", ("medusa", "tensorrt-llm"): "fasterdecoding",
           ("redrafter", "trtllm"): "apple", ("medusa", "trtllm"): "fasterdecoding"}
PACKAGES = {"redrafter": "specdec_redrafter", "medusa": "specdec_medusa"}
SPECDEC_TYPES = {"specdec_redrafter": "redrafter", "specdec_medusa": "medusa"}
EAGLE_MESSAGE = ("EAGLE is not available in specdec yet, so there is no EAGLE drafter to export or run; "
                 "export a ReDrafter (format 'apple') or Medusa heads (formats 'fasterdecoding', 'vllm')")


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


def detect_layout(folder) -> tuple[str, str] | None:
    """(drafter kind, layout) of a checkpoint folder, or None when it is none of the known ones.
    Layouts: ``specdec``, ``apple``, ``fasterdecoding``, ``vllm``."""
    folder = Path(folder)
    config_file = folder / "config.json"
    config = {}
    if config_file.is_file():
        try:
            config = json.loads(config_file.read_text())
        except (OSError, ValueError):
            return None
    if not isinstance(config, dict):
        return None
    model_type = config.get("model_type")
    if model_type in SPECDEC_TYPES:
        return SPECDEC_TYPES[model_type], "specdec"
    if model_type == "recurrent_drafting_drafter":
        return "redrafter", "apple"
    if model_type == "medusa":
        return "medusa", "vllm"
    if model_type and "eagle" in str(model_type).lower():
        raise InvalidInputError(f"drafter checkpoint {folder} has model_type {model_type!r}, an EAGLE drafter: {EAGLE_MESSAGE}")
    if any((folder / name).is_file() for name in ("medusa_lm_head.safetensors", "medusa_lm_head.pt")):
        return "medusa", "fasterdecoding"
    return None


def load_drafter_folder(folder):
    """(kind, layout, config, float64 weights, notes) of a drafter folder in any known layout."""
    found = detect_layout(folder)
    if found is None:
        raise InvalidInputError(
            f"{folder} is not a drafter checkpoint specdec knows: expected a specdec checkpoint, Apple's ReDrafter "
            "layout (model_type 'recurrent_drafting_drafter'), FasterDecoding's medusa_lm_head file or vLLM's "
            "Medusa layout (model_type 'medusa')"
        )
    kind, layout = found
    if layout == "specdec":
        if kind == "redrafter":
            from specdec_redrafter.checkpoint import load_redrafter_checkpoint as load
        else:
            from specdec_medusa.checkpoint import load_medusa_checkpoint as load
        config, weights = load(folder)
        return kind, layout, config, weights, []
    if layout == "apple":
        from specdec_redrafter.export import read_apple as read
    elif layout == "fasterdecoding":
        from specdec_medusa.export import read_fasterdecoding as read
    else:
        from specdec_medusa.export import read_vllm as read
    config, weights, notes = read(folder)
    return kind, layout, config, weights, notes


def _check_out(out, overwrite: bool) -> Path:
    folder = Path(out).expanduser()
    if folder.exists() and not folder.is_dir():
        raise InvalidInputError(f"--out {folder} is a file; give a folder")
    if folder.is_dir() and any(folder.iterdir()):
        if not overwrite:
            raise InvalidInputError(f"--out {folder} is not empty; choose an empty folder or pass overwrite=True "
                                    "(`--overwrite`) to replace what is there")
        shutil.rmtree(folder)
    return folder


def _resolve_drafter(drafter, model) -> Path:
    if isinstance(drafter, str) and drafter.lower() == "eagle":
        raise InvalidInputError(EAGLE_MESSAGE)
    if isinstance(drafter, (str, Path)) and Path(drafter).expanduser().is_dir():
        return Path(drafter).expanduser()
    if drafter in PACKAGES:
        if model is None:
            raise InvalidInputError(f"export {drafter!r} exports the drafter shipped for a model: pass model= "
                                    "(`--model`), e.g. smollm2-135m, or a checkpoint folder instead of the name")
        name = Path(str(model)).name
        shipped = resources.files(PACKAGES[drafter]) / "weights" / name
        if not shipped.joinpath("config.json").is_file():
            raise InvalidInputError(f"no {drafter} drafter ships for {name!r}: pass the checkpoint folder to export")
        return Path(str(shipped))
    raise InvalidInputError(f"drafter must be a checkpoint folder or redrafter / medusa, got {drafter!r}")


def _target_lm_head(model, config, kind: str):
    """The target's LM head (V, H) as float64, after checking the drafter was trained for it."""
    import specdec
    from specdec.checkpoints import check_target

    if model is None:
        return None
    target = specdec.load(model, backend="numpy")
    check_target(config, target, drafter="ReDrafter" if kind == "redrafter" else "Medusa")
    return target.lm_head


def _commands(kind: str, fmt: str, config, out: Path) -> tuple[str, ...]:
    if kind == "redrafter":
        return (
            "python examples/redrafter/convert_checkpoint.py --model_dir TARGET_HF_FOLDER "
            f"--drafter_model_dir {out} --output_dir tllm_redrafter --dtype float16 "
            f"--redrafter_num_beams {config.beam_width} --redrafter_draft_len_per_beam {config.beam_length - 1}",
            "trtllm-build --checkpoint_dir tllm_redrafter --output_dir engine_redrafter --gemm_plugin float16 "
            "--speculative_decoding_mode explicit_draft_tokens --max_batch_size 4",
        )
    from specdec_medusa.export import medusa_choices_arg

    if fmt == "fasterdecoding":
        nodes = len(config.resolved_choices)
        return (
            "python examples/medusa/convert_checkpoint.py --model_dir TARGET_HF_FOLDER "
            f"--medusa_model_dir {out} --output_dir tllm_medusa --dtype float16 "
            f"--num_medusa_heads {config.num_heads} --num_medusa_layers {config.num_layers} "
            f"--max_medusa_token_len {max(nodes, 1)}",
            "trtllm-build --checkpoint_dir tllm_medusa --output_dir engine_medusa --gemm_plugin float16 "
            "--speculative_decoding_mode medusa --max_batch_size 4",
            f"python examples/run.py --engine_dir engine_medusa --tokenizer_dir TARGET_HF_FOLDER "
            f"--medusa_choices='{medusa_choices_arg(config)}' --temperature 0.0 --input_text 'Once upon'",
        )
    spec = json.dumps({"method": "medusa", "model": str(out), "num_speculative_tokens": config.num_heads})
    return (f"vllm serve TARGET_HF_FOLDER --speculative-config '{spec}'",)


def export(drafter, format: str, out, *, model=None, drop_shortlist: bool = False, choices=None,
           dtype: str = "float32", overwrite: bool = False) -> ExportResult:
    """Write ``drafter`` (a checkpoint folder, or "redrafter" / "medusa" for the one shipped for
    ``model``) into ``out`` in ``format`` (see the module table).

    model: the target (folder or bundled name); needed for a tied head, whose projection the
    layouts store. drop_shortlist: export a shortlisted ReDrafter over the full vocabulary (refused
    otherwise). choices: Medusa only, "chain" or a list of paths to record instead of the drafter's
    tree (vLLM runs the chain only). dtype: "float32" or "float16". Everything that cannot be carried
    over exactly is refused with the fix; every conversion is listed in ``notes``.
    """
    source = _resolve_drafter(drafter, model)
    kind, layout, config, weights, notes = load_drafter_folder(source)
    fmt = ALIASES.get((kind, str(format).lower()), str(format).lower())
    if fmt == "eagle" or str(format).lower() == "eagle":
        raise InvalidInputError(EAGLE_MESSAGE)
    if fmt not in FORMATS[kind]:
        raise InvalidInputError(f"a {kind} drafter exports to {', '.join(FORMATS[kind])} (or tensorrt-llm), "
                                f"not {format!r}")
    if kind == "redrafter" and choices is not None:
        raise InvalidInputError("choices applies to Medusa heads; a ReDrafter's tree comes from its beams")
    if kind == "medusa" and drop_shortlist:
        raise InvalidInputError("drop_shortlist applies to ReDrafter; Medusa heads have no shortlist")
    lm_head = None
    if getattr(config, "head", "full") == "tied":
        if model is None:
            raise InvalidInputError(
                f"this {kind} drafter ends with the target's LM head (head='tied'); the {fmt} layout stores that "
                "projection, so pass model= (`--model`, the target folder or bundled name)"
            )
        lm_head = _target_lm_head(model, config, kind)
    folder = _check_out(out, overwrite)
    if kind == "redrafter":
        from specdec_redrafter.export import export_apple, materialise

        _, more = export_apple(config, weights, folder, lm_head=lm_head, drop_shortlist=drop_shortlist, dtype=dtype)
        exported = materialise(config, weights, lm_head=lm_head, drop_shortlist=drop_shortlist)[0]
    else:
        from specdec_medusa import export as medusa_export

        writer = medusa_export.export_fasterdecoding if fmt == "fasterdecoding" else medusa_export.export_vllm
        _, more = writer(config, weights, folder, lm_head=lm_head, choices=choices, dtype=dtype)
        exported = medusa_export._resolve_choices(config, choices)
    if dtype != "float32":
        more.append(f"weights were stored as {dtype}, rounding the float32 values")
    return ExportResult(path=folder, drafter=kind, format=fmt, notes=tuple(notes + more),
                        commands=_commands(kind, fmt, exported, folder))


def import_drafter(folder, out, *, overwrite: bool = False, dtype: str = "float32") -> ExportResult:
    """Read a drafter in any known layout from ``folder`` and write it as a specdec checkpoint in ``out``."""
    import numpy as np

    kind, layout, config, weights, notes = load_drafter_folder(Path(folder).expanduser())
    target = _check_out(out, overwrite)
    store = {"float32": np.float32, "float16": np.float16}[dtype]
    if kind == "redrafter":
        from specdec_redrafter.checkpoint import save_redrafter

        save_redrafter(target, config, weights, dtype=store)
    else:
        from specdec_medusa.checkpoint import save_medusa

        save_medusa(target, config, weights, dtype=store)
    return ExportResult(path=target, drafter=kind, format=layout, notes=tuple(notes))


def describe(result: ExportResult) -> list[str]:
    """Lines for a person: what was written, the notes, the commands."""
    lines = [f"wrote the {result.drafter} drafter to {result.path} ({result.format} layout)"]
    lines += [f"note: {note}" for note in result.notes]
    lines += [f"  {command}" for command in result.commands]
    return lines
