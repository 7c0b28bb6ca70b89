"""One call from a model to a trained drafter: target, corpus, teacher data, training, report.

``train_drafter`` is what ``specdec train NAME`` runs (through the ``train`` of drafter NAME's
spec, ``specdec.plugins.specs.DrafterSpec``, which supplies the drafter as a task). It writes into
``out``: the checkpoint (``config.json`` + ``model.safetensors``), ``trainer_state.safetensors``
(to resume), ``training_log.json`` (held-out tokens per step after each evaluation) and
``training_report.json`` (settings, the wall time of every stage, teacher and training throughput).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path

import attrs
import numpy as np

from specdec.drafting.shortlist import choose_shortlist, shortlist_coverage
from specdec.errors import IncompatibleDrafterError, InvalidInputError
from specdec.generation.resolve import drafter_kind
from specdec.models.bundled import resolve_model
from specdec.models.cache import cache_dir, cache_entry
from specdec.progress import progress as progress_bar
from specdec.models.checkpoints import read_checkpoint, write_json_atomic
from specdec.plugins.registry import default_registry
from specdec.training.corpus import CORPUS_VERSION, build_prompts, default_corpus
from specdec.training.lines import say
from specdec.training.outdir import claim_out
from specdec.training.selfinstruct import DEFAULT_MIX, MixedPrompts
from specdec.tuning.dtype import load_fastest

__all__ = ["REPORT_FILE", "build_teacher_data", "evaluate_drafter", "train_drafter"]

REPORT_FILE = "training_report.json"
SAVE_DTYPES = {"float32": np.float32, "float16": np.float16}


def train_drafter(
    kind: str,
    make_task: Callable,
    model,
    out,
    *,
    steps: int | None = None,
    minutes: float | None = None,
    prompts: int = 512,
    heldout_prompts: int = 64,
    max_new_tokens: int = 128,
    top_k: int = 32,
    teacher_batch_size: int = 64,
    teacher_dtype: str | None = None,
    batch_size: int = 64,
    lr: float = 1e-3,
    weight_decay: float = 0.0,
    bf16: bool = False,
    seed: int = 0,
    resume: bool = False,
    threads: int | None = None,
    save_dtype: str = "float32",
    cache: Path | None = None,
    corpus=None,
    prompt_source: Callable | None = None,
    eval_minutes: tuple | None = None,
    eval_steps: int | None = None,
    eval_sequences: int | None = 32,
    hidden_dtype: str = "bfloat16",
    prompt_text_prompts: int = 0,
    shortlist: int = 0,
    prompt_mix=None,
    progress: bool = True,
    overwrite: bool = False,
    allow_changes: bool = False,
    run_settings: dict | None = None,
    save_minutes: float = 5.0,
    init=None,
    keep_init_shortlist=True,
    loop_data: Callable | None = None,
    report_training: dict | None = None,
    teacher_layers: tuple = (),
    data=None,
    heldout_sequences: int = 64,
    max_positions: int | None = None,
) -> dict:
    """Distil a ``kind`` drafter for ``model`` into folder ``out``; returns the report (also saved).

    make_task(target, seed, *, shortlist, data) -> the drafter's task (``specdec.training.loop``);
    shortlist: the token ids it drafts from (None: all), data: the training ``TeacherData``.
    ``loop_data(data)``: what the shared loop draws positions from instead of the training data
    itself (EAGLE: an index view, its task reads runs of positions); ``report_training``: the
    drafter's own fields of the report's "training" section; ``teacher_layers``: decoder layers
    whose outputs the teacher data also keep (``TeacherSettings.layers``). Budget: ``steps``
    and/or ``minutes`` of training. Teacher data: ``prompts`` training and ``heldout_prompts``
    held-out prompts (rounded up to whole cache shards), ``max_new_tokens`` greedy tokens each,
    top-``top_k`` soft labels, decoded with the target in ``teacher_dtype`` (None: the dtype
    measured fastest on this machine, ``teacher_dtype_for``), ``teacher_batch_size`` prompts at a
    time; cached under
    ``cache``/teacher (default: the specdec cache). ``prompt_source(split, start, count)``
    replaces the corpus (token-id prompts, for tests). ``prompt_text_prompts``: more training data
    from prompt text (``build_teacher_data``). ``save_dtype``: "float32" or "float16".
    ``shortlist``: when > 0, the drafter drafts from that many token ids, the ones with the most
    teacher mass in the training data (``specdec.drafting.shortlist.choose_shortlist``).
    ``prompt_mix``: corpus chats, self-instruct chats and plain text (``build_teacher_data``).

    ``data``: files of token sequences (.npz) or chats (.jsonl) to learn from instead of decoding
    prompts (``specdec.training.sequences``): one teacher-forced forward of the target per
    sequence makes the records of its answer positions; ``heldout_sequences`` of them are held
    out, and training uses the others up to ``max_positions`` answer positions (None: all).

    ``init``: a checkpoint folder of this drafter kind, trained for this target, whose weights
    (and vocabulary shortlist, unless ``keep_init_shortlist`` is False: then ``shortlist`` ids are
    chosen from this run's data) the run starts from instead of the fresh initialisation: more
    training on new teacher data keeps what the earlier data taught. The trained weights do not
    depend on the shortlist (it selects rows of the target's frozen head), so a new one is safe.

    ``out`` is checked before any work (``specdec.training.outdir.claim_out``): a folder that is
    not a run of this kind is refused unless ``overwrite``; a run with saved work needs ``resume``
    (or ``overwrite``); a resume that changes the settings (these, plus the drafter's
    ``run_settings`` such as its beam shape) needs ``allow_changes``. ``save_minutes``: save the
    training state that often (and at the first SIGINT/SIGTERM, see
    ``specdec.training.loop.train``).
    """
    import torch  # optional: torch (train extra)

    from specdec.training.loop import TrainSettings, train  # optional: torch (train extra)
    from specdec.training.teacher import load_teacher_target  # optional: torch (train extra)

    if save_dtype not in SAVE_DTYPES:
        raise ValueError(f"save_dtype must be one of {sorted(SAVE_DTYPES)}, got {save_dtype!r}")
    if threads:
        torch.set_num_threads(threads)
    out = Path(out)
    sequence_files = None if data is None else [str(Path(f).expanduser().resolve()) for f in data]
    identity = {
        "model": _model_key(model),
        **(
            {
                "data": sequence_files,
                "heldout_sequences": heldout_sequences,
                "max_positions": max_positions,
            }
            if data is not None
            else {"prompts": prompts, "heldout_prompts": heldout_prompts}
        ),
        "max_new_tokens": max_new_tokens,
        "top_k": top_k,
        "teacher_dtype": teacher_dtype,
        "hidden_dtype": hidden_dtype,
        "prompt_text_prompts": prompt_text_prompts,
        "shortlist": shortlist,
        "batch_size": batch_size,
        "lr": lr,
        "weight_decay": weight_decay,
        "bf16": bf16,
        "seed": seed,
        "prompt_mix": prompt_mix,
        "init": None if init is None else str(Path(init).resolve()),
        "keep_init_shortlist": keep_init_shortlist,
        **(run_settings or {}),
    }
    claim_out(
        out,
        kind=kind,
        settings=json.loads(json.dumps(identity, default=str)),
        resume=resume,
        overwrite=overwrite,
        allow_changes=allow_changes,
        sources=[model if isinstance(model, (str, Path)) and Path(model).exists() else None, init],
    )
    cache = Path(cache) if cache is not None else cache_dir()
    times: dict[str, float] = {}
    began = time.perf_counter()
    teacher_dtype = teacher_dtype or teacher_dtype_for(model)
    target = load_teacher_target(model, dtype=teacher_dtype)
    times["load_target"] = time.perf_counter() - began

    if data is not None:
        # optional: torch (train extra)
        from specdec.training.sequences import SequenceSettings, sequence_datasets

        datasets, teacher_stats, teacher_times = sequence_datasets(
            target,
            sequence_files,
            heldout=heldout_sequences,
            max_positions=max_positions,
            seed=seed,
            settings=SequenceSettings(
                top_k=top_k, layers=teacher_layers, hidden_dtype=hidden_dtype
            ),
            cache=cache_entry("teacher", cache),
            progress=progress,
        )
    else:
        datasets, teacher_stats, teacher_times = build_teacher_data(
            target,
            prompts=prompts,
            heldout_prompts=heldout_prompts,
            max_new_tokens=max_new_tokens,
            top_k=top_k,
            teacher_batch_size=teacher_batch_size,
            seed=seed,
            cache=cache,
            corpus=corpus,
            prompt_source=prompt_source,
            hidden_dtype=hidden_dtype,
            prompt_text_prompts=prompt_text_prompts,
            prompt_mix=prompt_mix,
            progress=progress,
            layers=teacher_layers,
        )
    times.update(teacher_times)
    teacher = teacher_stats.pop("settings")

    init_weights, init_shortlist = (None, None) if init is None else _warm_start(init, kind, target)
    ids, listed = None, {}
    if init_shortlist is not None and keep_init_shortlist:
        ids, shortlist = init_shortlist, len(init_shortlist)
        listed = {"shortlist": shortlist, "shortlist_from": str(init)}
    elif shortlist:
        train_data = datasets["train"]
        ids = choose_shortlist(
            int(target.embed_tokens.shape[0]),
            shortlist,
            next_tokens=train_data.next_tokens.numpy(),
            label_ids=train_data.label_ids.numpy(),
            label_probs=train_data.label_probs.float().numpy(),
        )
        listed = {
            "shortlist": shortlist,
            "heldout_coverage": round(
                shortlist_coverage(datasets["heldout"].next_tokens.numpy(), ids), 4
            )
            if "heldout" in datasets
            else None,
        }
    task = make_task(target, seed, shortlist=ids, data=datasets["train"])
    if init_weights is not None:
        task.module.load_weights(init_weights)
    settings = TrainSettings(
        steps=steps,
        minutes=minutes,
        batch_size=batch_size,
        lr=lr,
        weight_decay=weight_decay,
        bf16=bf16,
        seed=seed,
        eval_steps=eval_steps,
        eval_sequences=eval_sequences,
        **({"eval_minutes": tuple(eval_minutes)} if eval_minutes is not None else {}),
    )
    began = time.perf_counter()
    train_data = datasets["train"] if loop_data is None else loop_data(datasets["train"])
    summary = train(
        task,
        train_data,
        datasets["heldout"],
        settings,
        out,
        resume=resume,
        progress=progress,
        save_dtype=SAVE_DTYPES[save_dtype],
        save_minutes=save_minutes,
    )
    times["training_wall"] = time.perf_counter() - began
    report = {
        "drafter": kind,
        "target": {"name": target.name, "fingerprint": target.fingerprint},
        "config": task.config.to_dict(),
        "train_settings": attrs.asdict(settings),
        "teacher_settings": teacher,
        "teacher": teacher_stats,
        "stage_seconds": {k: round(v, 2) for k, v in times.items()},
        "training": {
            "steps": summary["step"],
            "train_seconds": round(summary["train_seconds"], 2),
            "eval_seconds": round(summary["eval_seconds"], 2),
            "positions": summary["positions"],
            "positions_per_second": round(summary["positions_per_second"], 1),
            **(report_training or {}),
        },
        "history": summary["history"],
        "threads": torch.get_num_threads(),
        **listed,
    }
    write_json_atomic(out / REPORT_FILE, json.loads(json.dumps(report, default=str)))
    return report


def _warm_start(init, kind: str, target) -> tuple[dict, np.ndarray | None]:
    """(weights, shortlist or None) of checkpoint ``init``, checked to be a ``kind`` drafter
    trained for ``target``."""
    config, weights = read_checkpoint(init, label=f"{kind} (--init)")
    expected = default_registry().drafter_spec(kind).model_type
    if config.get("model_type") != expected:
        raise InvalidInputError(
            f"--init {init} holds a {config.get('model_type')!r} checkpoint; a {kind} run starts "
            f"from a {expected!r} one"
        )
    trained_for = (config.get("target") or {}).get("fingerprint")
    if trained_for != target.fingerprint:
        raise IncompatibleDrafterError(
            f"--init {init} was trained for another model "
            f"({(config.get('target') or {}).get('name')!r}); start from a checkpoint of "
            f"{target.name!r}, or leave --init out"
        )
    shortlist = weights.pop("vocab_shortlist", None)
    return weights, shortlist


def teacher_dtype_for(model) -> str:
    """The torch dtype that runs ``model`` fastest on this CPU (``specdec.tuning.dtype``, cached):
    the teacher decodes in it, as the target will when it serves the drafter."""
    torch_backend = default_registry().get("backend", "torch").factory()
    _, choice = load_fastest(torch_backend, resolve_model(model), device="cpu")
    return choice.dtype


def _model_key(model) -> str:
    """The model as a run records it: a bundled name, or a folder's absolute path."""
    path = Path(str(model))
    return str(path.resolve()) if path.exists() else str(model)


PREFILL_OFFSET = (
    1_000_000  # prompt indices of the prompt-text data: disjoint from the continuation prompts
)


def build_teacher_data(
    target,
    *,
    prompts: int,
    heldout_prompts: int,
    max_new_tokens: int = 128,
    top_k: int = 32,
    teacher_batch_size: int = 16,
    seed: int = 0,
    cache: Path | None = None,
    corpus=None,
    prompt_source: Callable | None = None,
    hidden_dtype: str = "bfloat16",
    prompt_text_prompts: int = 0,
    prompt_text_new_tokens: int = 16,
    prompt_mix=None,
    progress: bool = True,
    layers: tuple = (),
) -> tuple[dict, dict, dict]:
    """Teacher data of both splits for a loaded ``TeacherTarget`` (cached, see ``train_drafter``);
    a split with no prompts is left out.

    prompt_text_prompts: that many more training prompts (other ones) contribute their prompt
    text under teacher forcing (the chat template's fixed header skipped) plus the first
    ``prompt_text_new_tokens`` greedy tokens: many positions for little compute, since the
    prefill is batched while decoding is one token per forward.
    prompt_mix: (kind, share) pairs of corpus chats, self-instruct chats and plain text for the
    decoded prompts (``specdec.training.selfinstruct``; None: ``DEFAULT_MIX``, () the corpus alone).
    layers: decoder layers whose outputs the data also keep (``TeacherSettings.layers``).

    -> (datasets {"train", "heldout"}, stats per split plus "settings", wall seconds per stage).
    """
    # optional: torch (train extra)
    from specdec.training.teacher import TeacherSettings, teacher_dataset

    cache = Path(cache) if cache is not None else cache_dir()
    times: dict[str, float] = {}
    if prompt_source is None:
        began = time.perf_counter()
        corpus = corpus or default_corpus(cache_entry("corpus", cache))
        sources = corpus.describe()
        times["corpus"] = time.perf_counter() - began

        def prompt_source(split: str, start: int, count: int) -> list:
            return [
                list(p.messages)
                for p in build_prompts(corpus, count, split=split, seed=seed, start=start)
            ]

        source_key = {"corpus": CORPUS_VERSION, "sources": sources, "seed": seed}
        mix = DEFAULT_MIX if prompt_mix is None else tuple(prompt_mix)
        decoded_source, decoded_key = prompt_source, source_key
        if mix and dict(mix).get("corpus", 0) < sum(share for _, share in mix):
            decoded_source = MixedPrompts(
                corpus, target, seed=seed, mix=mix, batch_size=teacher_batch_size
            )
            decoded_key = {**source_key, **decoded_source.key()}
    else:
        source_key = {"custom": getattr(prompt_source, "__name__", "prompts"), "seed": seed}
        decoded_source, decoded_key = prompt_source, source_key

    teacher = TeacherSettings(
        max_new_tokens=max_new_tokens,
        top_k=top_k,
        batch_size=teacher_batch_size,
        dtype=str(target.model.dtype).removeprefix("torch."),
        hidden_dtype=hidden_dtype,
        layers=layers,
    )
    datasets, teacher_stats = {}, {}
    header = (
        _common_prefix(target, prompt_source("train", PREFILL_OFFSET, 2))
        if prompt_text_prompts
        else None
    )
    text = attrs.evolve(teacher, max_new_tokens=prompt_text_new_tokens, prompt_from=header)
    parts = (
        ("heldout", heldout_prompts, teacher, 0, decoded_source, decoded_key),
        ("train", prompts, teacher, 0, decoded_source, decoded_key),
        ("prompt_text", prompt_text_prompts, text, PREFILL_OFFSET, prompt_source, source_key),
    )
    for name, count, settings, offset, source, key in parts:
        if count <= 0:
            continue
        split = "heldout" if name == "heldout" else "train"
        began = time.perf_counter()
        # lines where stderr is not a terminal: a log showed nothing for minutes of decoding
        with progress_bar(
            total=count * settings.max_new_tokens,
            enabled=progress,
            unit="token",
            desc=f"teacher {name}",
        ) as bar:
            datasets[name], teacher_stats[name] = teacher_dataset(
                target,
                lambda start, n, split=split, offset=offset, source=source: source(
                    split, offset + start, n
                ),
                count=count,
                prompt_key={**key, "split": split, **({"offset": offset} if offset else {})},
                cache=cache_entry("teacher", cache),
                settings=attrs.evolve(settings, shard_size=max(1, min(settings.shard_size, count))),
                progress=bar.update,
            )
        times[f"teacher_{name}"] = time.perf_counter() - began
        if not progress:
            minutes, stats = times[f"teacher_{name}"] / 60, teacher_stats[name]
            cached = f"{stats['shards_reused']} shards from the cache, {stats['shards_made']} made"
            say(f"teacher {name}: {count} prompts in {minutes:.1f} min ({cached})")
    # prompts made in this run (cached shards need none)
    if isinstance(decoded_source, MixedPrompts):
        teacher_stats["prompt_kinds_made"] = dict(decoded_source.stats)
    if "prompt_text" in datasets:
        from specdec.training.records import TeacherData  # optional: torch (train extra)

        extra = datasets.pop("prompt_text")
        datasets["train"] = (
            TeacherData.concat([datasets["train"], extra]) if "train" in datasets else extra
        )
    return datasets, {**teacher_stats, "settings": attrs.asdict(teacher)}, times


def _common_prefix(target, prompts) -> int:
    """Tokens shared by the start of every rendered prompt (the chat template's fixed header)."""
    encoded = [p if isinstance(p[0], int) else target.encode(p) for p in prompts]
    length = 0
    while all(len(e) > length + 1 for e in encoded) and len({e[length] for e in encoded}) == 1:
        length += 1
    return length


def evaluate_drafter(
    checkpoint,
    model,
    *,
    heldout_prompts: int = 64,
    max_new_tokens: int = 128,
    top_k: int = 32,
    seed: int = 0,
    sequences: int | None = None,
    cache: Path | None = None,
    progress: bool = False,
    **overrides,
) -> dict:
    """Held-out tokens per step of a saved checkpoint, with config overrides (``beam_width``,
    ``beam_length`` for ReDrafter; ``choices``, ``top_t`` for Medusa). The held-out teacher data
    are the cached ones of ``train_drafter`` with the same settings (made when missing), with the
    decoder layers the task's ``teacher_layers`` names, if any."""
    from specdec.training.loop import evaluate  # optional: torch (train extra)
    from specdec.training.teacher import load_teacher_target  # optional: torch (train extra)

    kind = drafter_kind(Path(checkpoint), default_registry())
    target = load_teacher_target(model)
    task = default_registry().drafter_spec(kind).evaluation_task(checkpoint, target, overrides)
    layers = tuple(getattr(task, "teacher_layers", ()))
    datasets, _, _ = build_teacher_data(
        target,
        prompts=0,
        heldout_prompts=heldout_prompts,
        max_new_tokens=max_new_tokens,
        top_k=top_k,
        seed=seed,
        cache=cache,
        progress=progress,
        layers=layers,
    )
    return {
        "drafter": kind,
        **overrides,
        **evaluate(task, datasets["heldout"], sequences=sequences),
    }
