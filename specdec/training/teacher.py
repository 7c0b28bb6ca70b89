"""Distillation data: the target's own greedy continuations, with its hidden states and soft labels.

For every prompt the target decodes greedily (requests batched in flight through the torch
backend's ``TargetModel``, as ``specdec.Engine`` serves them). At each
continuation position t (the last prompt position first) we keep what a drafter sees and what it
must learn at decode time:

    hidden[t]       (H,)  bf16   last-layer hidden state after the final norm (the drafter's input)
    next_tokens[t]  ()    int    the target's greedy token x_{t+1} (argmax of its logits at t)
    label_ids[t]    (k,)  int    the top-k tokens of the target's next-token distribution at t
    label_probs[t]  (k,)  fp16   their probabilities (not renormalised)
    remaining[t]    ()    int    positions left after t in the same sequence
    layers[t]       (n, H) bf16  opt-in (``TeacherSettings.layers``): the outputs of n decoder
                                 layers (the residual stream, before any norm), for drafters that
                                 read inner layers (3 x H x 2 bytes per position for three layers)

A row stops after ``max_new_tokens`` tokens or after it emits an end-of-sequence token (that
position is kept: the drafter learns to predict the end too). The positions of all sequences are
stored flat (P positions). Data are cached on disk in shards keyed by the target's fingerprint,
the prompts and the settings, so a repeated or resumed run, or a run with more prompts, reuses
what is already there. The layers, when asked for, are kept in the same shard file (they come from
the forward the teacher runs anyway); a run that asks for none reads the file without them, and a
run that asks for layers a cached shard lacks decodes that shard again.
"""

from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path
from typing import Any, Callable, Sequence

import attrs
import numpy as np
import torch
from safetensors import safe_open

from specdec.generation.chat import load_chat_template, render_chat
from specdec.models.bundled import resolve_model
from specdec.models.hf_loading import from_pretrained_quietly
from specdec.models.llama import LlamaConfig, load_tokenizer
from specdec.plugins.registry import default_registry
from specdec.training.records import TeacherData
from specdec.tuning.exactness import configure
from specdec.types import DraftTree, Verdict

__all__ = [
    "TeacherSettings",
    "TeacherTarget",
    "greedy_teacher",
    "load_teacher_target",
    "target_fingerprint",
    "teacher_dataset",
]


# teacher data are decoded by the torch backend's TargetModel (was transformers' forward)
DECODER = "specdec-torch"


@attrs.frozen(kw_only=True)
class TeacherSettings:
    """How teacher data are made. max_new_tokens: continuation length per prompt; top_k: soft
    labels kept per position; batch_size: prompts decoded together; max_prompt_tokens: longer
    prompts are dropped; dtype: the target's dtype while decoding; hidden_dtype: how hidden states
    are stored; prompt_from: also keep prompt positions from this index on (``greedy_teacher``);
    shard_size: prompts per cache file; layers: also keep the outputs of these decoder layers
    (0-based, ascending, distinct) at every position (not part of ``key``: a shard that holds
    them is the same data with more fields)."""

    max_new_tokens: int = 128
    top_k: int = 32
    batch_size: int = 16
    max_prompt_tokens: int = 320
    dtype: str = "float32"
    hidden_dtype: str = "bfloat16"
    prompt_from: int | None = None
    shard_size: int = 64
    layers: tuple = attrs.field(default=(), converter=lambda v: tuple(sorted({int(i) for i in v})))

    def key(self) -> dict:
        """The settings that change the data (batch_size does not, beyond rounding), and the
        decoder that computes them (``DECODER``: in half precision another implementation rounds
        differently, so its continuations can part at near-ties)."""
        key = {
            "max_new_tokens": self.max_new_tokens,
            "top_k": self.top_k,
            "max_prompt_tokens": self.max_prompt_tokens,
            "dtype": self.dtype,
            "decoder": DECODER,
        }
        if self.hidden_dtype != "bfloat16":
            key["hidden_dtype"] = self.hidden_dtype
        if self.prompt_from is not None:
            key["prompt_from"] = self.prompt_from
        return key


# ---------------------------------------------------------------------------------------------
# The target


@attrs.frozen(kw_only=True)
class TeacherTarget:
    """A ``transformers`` causal LM loaded for distillation, with what the drafters need from it.

    model: the module (eval mode, frozen); tokenizer: ``tokenizers.Tokenizer`` or None;
    chat_template: Jinja text or None; eos_token_ids; name (folder name); fingerprint (hex sha256,
    as ``specdec.reference.model.ReferenceTarget.fingerprint``); folder.
    """

    model: Any
    tokenizer: Any
    chat_template: str | None
    eos_token_ids: tuple
    name: str
    fingerprint: str
    folder: Path

    @property
    def embed_tokens(self) -> torch.Tensor:
        return self.model.model.embed_tokens.weight  # (V, H)

    @property
    def lm_head(self) -> torch.Tensor:
        return self.model.lm_head.weight  # (V, H)

    @property
    def vocab_size(self) -> int:
        return int(self.embed_tokens.shape[0])

    def encode(self, messages) -> list[int]:
        """Token ids of a chat prompt, rendered and encoded exactly as ``specdec.generate`` does."""
        text = (
            render_chat(self.chat_template, messages)
            if self.chat_template
            else messages[-1]["content"]
        )
        if self.tokenizer is None:
            raise ValueError(
                f"target {self.name!r} has no tokenizer.json: text prompts cannot be encoded"
            )
        return list(self.tokenizer.encode(text).ids)


def target_fingerprint(folder: Path) -> str:
    """sha256 over the sorted stored tensor names, their shapes and float32 bytes: the same value
    as ``specdec.reference.model.load_target(folder).fingerprint``, without float64 copies."""
    files = sorted(Path(folder).glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no .safetensors weights in {folder}")
    located = {}
    for file in files:
        with safe_open(str(file), framework="pt") as handle:
            located.update({name: file for name in handle.keys()})
    digest = hashlib.sha256()
    for name in sorted(located):
        with safe_open(str(located[name]), framework="pt") as handle:
            tensor = handle.get_tensor(name)
        digest.update(name.encode())
        digest.update(repr(tuple(tensor.shape)).encode())
        digest.update(tensor.to(torch.float32).contiguous().numpy().astype("<f4").tobytes())
    return digest.hexdigest()


def load_teacher_target(source, *, dtype: str = "bfloat16") -> TeacherTarget:
    """Load a bundled name (``smollm2-135m``) or a Hugging Face-format folder for distillation."""
    import transformers  # optional: transformers (torch extra)

    folder = Path(resolve_model(source))
    model = from_pretrained_quietly(transformers, str(folder), dtype=getattr(torch, dtype))
    model.eval().requires_grad_(False)
    config = LlamaConfig.from_folder(folder)
    return TeacherTarget(
        model=model,
        tokenizer=load_tokenizer(folder),
        chat_template=load_chat_template(folder),
        eos_token_ids=tuple(config.eos_token_ids),
        name=folder.resolve().name,
        fingerprint=target_fingerprint(folder),
        folder=folder,
    )


# ---------------------------------------------------------------------------------------------
# Greedy decoding with hidden states and soft labels


PREFILL_BUDGET = (
    1024  # prompt tokens admitted per forward beside the rows decoding (at least one prompt)
)


@torch.inference_mode()
def greedy_teacher(
    model,
    prompts: Sequence[Sequence[int]],
    *,
    max_new_tokens: int,
    top_k: int,
    eos_token_ids: Sequence[int] = (),
    batch_size: int = 16,
    hidden_dtype=torch.bfloat16,
    prompt_from: int | None = None,
    layers: Sequence[int] = (),
    progress: Callable[[int], None] | None = None,
    exact: bool = False,
) -> TeacherData:
    """Decode every prompt greedily with ``model`` (a ``transformers`` Llama-family causal LM) and
    collect the teacher data of each continuation position (module docstring).

    The torch backend's target runs the model (``TargetModel`` with ``batch_size`` request slots,
    as ``specdec.Engine`` batches requests): every forward decodes one token for each row in
    flight and prefills the prompts that take the slots rows left, so no row waits for the
    longest of a batch and no padding is computed. Argmax ties go to the lowest token id. Hidden
    states are kept in ``hidden_dtype``. ``prompt_from``: also keep the prompt's own positions
    from this index on (teacher forcing on the prompt text, free with the prefill: there
    ``next_tokens`` is the prompt's next token); each sequence then runs through the prompt into
    the continuation. ``layers``: also keep the outputs of these decoder layers (ascending,
    distinct) at every kept position, returned by the same forwards. ``progress(n)`` is called
    with the number of tokens each forward produced. ``exact``: decode in exact mode.
    """
    if not prompts:
        raise ValueError("greedy_teacher needs at least one prompt")
    target = _decoding_target(
        model,
        slots=min(batch_size, len(prompts)),
        capacity=max(len(p) for p in prompts) + max_new_tokens,
        exact=exact,
    )
    eos = set(int(t) for t in eos_token_ids)
    layers = tuple(int(i) for i in layers)
    # pop() takes the shortest
    waiting = sorted(range(len(prompts)), key=lambda i: (len(prompts[i]), i))[::-1]
    free = list(range(target.num_slots))[::-1]
    rows: dict[int, _Sequence] = {}  # slot -> the sequence decoding there
    per_prompt: list[TeacherData | None] = [None] * len(prompts)
    while waiting or rows:
        context, admitted, budget = [], [], PREFILL_BUDGET
        while waiting and free and (not context or len(prompts[waiting[-1]]) <= budget):
            index, slot = waiting.pop(), free.pop()
            context.append((slot, np.asarray(prompts[index], dtype=np.int64)))
            admitted.append(index)
            budget -= len(prompts[index])
        decoding = np.array(sorted(rows), dtype=np.int64)
        tree = _root_trees([rows[s].last for s in decoding]) if decoding.size else None
        out = target.forward_tree(tree, decoding, context=context, layers=layers)
        hidden = [out.hidden[:, 0]] if tree is not None else []
        logits = [out.logits[:, 0]] if tree is not None else []
        inner = [] if tree is None else [_stack_layers(out.layers, layers, column=0)]  # (B, n, H)
        for (slot, _), index, prompt_out in zip(context, admitted, out.context):
            rows[slot] = _Sequence(index)
            prompt_layers = _stack_layers(prompt_out.layers, layers)  # (P, n, H)
            if prompt_from is not None:
                rows[slot].keep_prompt(
                    model,
                    prompt_out.hidden,
                    prompts[index],
                    start=prompt_from,
                    top_k=top_k,
                    layers=prompt_layers,
                )
            hidden.append(prompt_out.hidden[-1:])
            logits.append(prompt_out.logits[None])
            if layers:
                inner.append(prompt_layers[-1:])
        hidden, logits = torch.cat(hidden), torch.cat(logits).float()
        inner = torch.cat(inner).to(hidden_dtype) if layers else [None] * hidden.shape[0]
        top_probs, top_ids = torch.topk(torch.softmax(logits, dim=-1), top_k, dim=-1)
        chosen = torch.argmax(logits, dim=-1)  # first maximum: ties to the lowest id
        if tree is not None:
            target.commit(tree, _root_verdict(chosen[: decoding.size]))
        order = list(decoding) + [slot for slot, _ in context]
        for slot, h, token, ids, probs, inner_row in zip(
            order, hidden.to(hidden_dtype), chosen.tolist(), top_ids, top_probs.half(), inner
        ):
            sequence = rows[slot]
            sequence.add(h, token, ids, probs, inner_row)
            if len(sequence.tokens) >= max_new_tokens or token in eos:
                per_prompt[sequence.index] = sequence.data()
                del rows[slot]
                target.release(int(slot))
                free.append(int(slot))
        if progress is not None:
            progress(len(order))
    data = TeacherData.concat(per_prompt) if len(per_prompt) > 1 else per_prompt[0]
    return attrs.evolve(data, layers=data.layers if layers else None, layer_ids=layers)


def _stack_layers(outputs, layers: tuple, *, column: int | None = None) -> torch.Tensor | None:
    """(rows, n, H): the outputs of decoder ``layers`` stacked, from a prompt's {layer: (P, H)}
    or, with ``column``, that node of a tree's {layer: (B, N, H)}; None when none are asked for."""
    if not layers:
        return None
    return torch.stack(
        [outputs[i] if column is None else outputs[i][:, column] for i in layers], dim=1
    )


def _decoding_target(model, *, slots: int, capacity: int, exact: bool = False):
    """The torch backend's ``TargetModel`` over ``model``'s own weights; ``exact``: in exact mode
    (``specdec.tuning.exactness``; an error where this machine's kernels cannot keep it)."""
    backend = default_registry().get("backend", "torch").factory()
    target = backend.load_target(model, slots=slots, capacity=capacity)
    if exact:
        configure(target, True, backend="torch")
    return target


def _root_trees(tokens: Sequence[int]) -> DraftTree:
    """Trees of the root alone (one token per row): plain decoding through ``forward_tree``."""
    rows = len(tokens)
    return DraftTree(
        tokens=torch.tensor(tokens, dtype=torch.long)[:, None],
        parents=torch.full((rows, 1), -1, dtype=torch.long),
        depth=torch.zeros((rows, 1), dtype=torch.long),
        ancestor_mask=torch.ones((rows, 1, 1), dtype=torch.bool),
        num_nodes=torch.ones(rows, dtype=torch.long),
    )


def _root_verdict(chosen: torch.Tensor) -> Verdict:
    """Commit each row's root; ``chosen`` (B,) is the next root."""
    rows = int(chosen.shape[0])
    return Verdict(
        path=torch.zeros((rows, 1), dtype=torch.long),
        num_accepted=torch.zeros(rows, dtype=torch.long),
        bonus_tokens=chosen,
    )


class _Sequence:
    """The teacher data of one prompt as it is decoded: prompt positions first (if kept), then one
    entry per continuation position."""

    def __init__(self, index: int):
        self.index = index
        self.hidden, self.tokens, self.ids, self.probs, self.layers = [], [], [], [], []
        self.prompt: dict | None = None

    @property
    def last(self) -> int:
        return self.tokens[-1]

    def add(self, hidden, token: int, ids, probs, layers=None) -> None:
        self.hidden.append(hidden)
        self.tokens.append(token)
        self.ids.append(ids)
        self.probs.append(probs)
        if layers is not None:
            self.layers.append(layers)

    def keep_prompt(
        self,
        model,
        hidden: torch.Tensor,
        prompt: Sequence[int],
        *,
        start: int,
        top_k: int,
        layers: torch.Tensor | None = None,
    ) -> None:
        """Teacher data of prompt positions ``start .. n-2`` (the last one, n-1, is the first
        continuation position); hidden (n, H), layers (n, L, H) or None."""
        n = len(prompt)
        if n - 1 <= start:
            return
        h = hidden[start : n - 1]
        probs = torch.softmax(model.lm_head(h).float(), dim=-1)
        top_probs, top_ids = torch.topk(probs, top_k, dim=-1)
        self.prompt = {
            "hidden": h,
            "next_tokens": torch.tensor(list(prompt[start + 1 :]), dtype=torch.long),
            "label_ids": top_ids,
            "label_probs": top_probs.half(),
        }
        if layers is not None:
            self.prompt["layers"] = layers[start : n - 1]

    def data(self) -> TeacherData:
        parts = {
            "hidden": torch.stack(self.hidden),
            "next_tokens": torch.tensor(self.tokens, dtype=torch.long),
            "label_ids": torch.stack(self.ids),
            "label_probs": torch.stack(self.probs),
        }
        if self.layers:
            parts["layers"] = torch.stack(self.layers)
        if self.prompt is not None:
            parts = {
                name: torch.cat([self.prompt[name].to(parts[name].dtype), parts[name]])
                for name in parts
            }
        n = int(parts["next_tokens"].shape[0])
        return TeacherData(
            **parts,
            remaining=torch.arange(n - 1, -1, -1),
            sequence=torch.zeros(n, dtype=torch.long),
        )


# ---------------------------------------------------------------------------------------------
# Cached datasets


def _shard_key(fingerprint: str, prompt_key: dict, settings: TeacherSettings, shard: int) -> str:
    blob = json.dumps(
        {
            "fingerprint": fingerprint,
            "prompts": prompt_key,
            "settings": settings.key(),
            "shard": shard,
            "shard_size": settings.shard_size,
        },
        sort_keys=True,
    )
    return hashlib.sha256(blob.encode()).hexdigest()[:24]


def teacher_dataset(
    target: TeacherTarget,
    make_prompts: Callable[[int, int], list],
    *,
    count: int,
    prompt_key: dict,
    settings: TeacherSettings,
    cache: Path,
    progress: Callable[[int], None] | None = None,
) -> tuple[TeacherData, dict]:
    """Teacher data for the first ``count`` prompts, from the cache where present.

    make_prompts(start, n) -> the prompts ``start .. start+n-1`` (chat messages or token ids);
    prompt_key: what identifies that prompt stream (corpus, seed, split). Returns the data and
    stats: positions, prompt and new tokens computed now, seconds spent, shards reused.
    """
    cache = Path(cache)
    cache.mkdir(parents=True, exist_ok=True)
    parts, stats = (
        [],
        {"shards_reused": 0, "shards_made": 0, "new_tokens": 0, "prompt_tokens": 0, "seconds": 0.0},
    )
    for shard in range(-(-count // settings.shard_size)):
        start = shard * settings.shard_size
        file = (
            cache
            / f"teacher-{_shard_key(target.fingerprint, prompt_key, settings, shard)}.safetensors"
        )
        stored = TeacherData.stored_layers(file) if file.is_file() else None
        if stored is not None and set(settings.layers) <= set(stored):
            parts.append(TeacherData.load(file, layers=settings.layers))
            stats["shards_reused"] += 1
            continue
        # decoded again when it lacks layers asked for: the new file keeps the ones it held too
        decode_layers = tuple(sorted(set(settings.layers) | set(stored or ())))
        began = time.perf_counter()
        prompts = make_prompts(start, settings.shard_size)
        ids = [p if isinstance(p[0], (int, np.integer)) else target.encode(p) for p in prompts]
        ids = [p for p in ids if len(p) <= settings.max_prompt_tokens]
        if not ids:
            raise ValueError(
                f"every prompt of teacher shard {shard} is longer than "
                f"{settings.max_prompt_tokens} tokens"
            )
        data = greedy_teacher(
            target.model,
            ids,
            max_new_tokens=settings.max_new_tokens,
            top_k=settings.top_k,
            eos_token_ids=target.eos_token_ids,
            batch_size=settings.batch_size,
            hidden_dtype=getattr(torch, settings.hidden_dtype),
            prompt_from=settings.prompt_from,
            layers=decode_layers,
            progress=progress,
        )
        data.save(
            file,
            {
                "prompt_key": prompt_key,
                "settings": settings.key(),
                "shard": shard,
                "target": target.name,
                "fingerprint": target.fingerprint,
            },
        )
        if decode_layers != settings.layers:
            kept = data.layer_outputs(settings.layers) if settings.layers else None
            data = attrs.evolve(data, layers=kept, layer_ids=settings.layers)
        parts.append(data)
        stats["shards_made"] += 1
        stats["new_tokens"] += data.num_positions
        stats["prompt_tokens"] += sum(len(p) for p in ids)
        stats["seconds"] += time.perf_counter() - began
    data = TeacherData.concat(parts) if len(parts) > 1 else parts[0]
    stats["positions"] = data.num_positions
    if stats["seconds"]:
        stats["new_tokens_per_second"] = stats["new_tokens"] / stats["seconds"]
        stats["tokens_per_second"] = (stats["new_tokens"] + stats["prompt_tokens"]) / stats[
            "seconds"
        ]
    return data, stats
