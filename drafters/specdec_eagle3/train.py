"""Training an EAGLE-3 drafter by distillation from its target (``specdec train eagle3``).

The pipeline is the shared one (``specdec.training.run.train_drafter``: output folder checks,
teacher data and their cache, the loop with its evaluations, best and last checkpoints, resume,
report). What EAGLE-3 adds:

- **Features.** The teacher data also keep, per position, the outputs of the three fused target
  layers (``TeacherSettings.layers``, the config's ``hidden_layers``), taken from the forward the
  teacher runs anyway: on a CPU a second target forward per position would cost more than the
  whole draft step, while the layers cost 3 x H x 2 bytes per position (3.5 KB at H = 576).
- **Draft vocabulary.** The ``draft_vocab`` target ids with the most teacher mass in the training
  data (how often each is the greedy token, plus its soft-label probability:
  ``specdec.drafting.shortlist.choose_shortlist``), ascending; ``d2t`` is saved with the weights.
- **Training-time test** over ``unroll`` steps, the loss of ``specdec_eagle3.task``.

Initialisation: fc passes the high layer through (the low and middle thirds small and random),
the attention's and the MLP's output projections are zero, and the draft's norm and head start as
the target's final norm and LM head rows of the draft vocabulary: the untrained draft reads its
high layer through the target's own head (a logit lens three layers below the top).
"""

from __future__ import annotations

from pathlib import Path

import attrs
import numpy as np
import torch

from specdec.errors import InvalidInputError
from specdec.models.bundled import resolve_model
from specdec.models.llama import LlamaConfig
from specdec.training.run import train_drafter
from specdec_eagle3.checkpoint import config_for_target, load_eagle3_checkpoint
from specdec_eagle3.config import Eagle3Config, default_hidden_layers, draft_to_target
from specdec_eagle3.task import Eagle3Task

__all__ = ["default_config", "init_weights", "train_eagle3"]


def default_config(
    target,
    *,
    draft_vocab_size: int,
    top_k: int = 4,
    depth: int = 3,
    total_tokens: int = 12,
    **overrides,
) -> Eagle3Config:
    """The draft layer for a ``TeacherTarget``: the target's head layout, MLP width, rotary base
    and norm epsilon, its default three layers (``overrides`` may name others)."""
    llama = LlamaConfig.from_folder(target.folder)
    record = {
        "name": target.name,
        "fingerprint": target.fingerprint,
        "vocab_size": llama.vocab_size,
        "hidden_size": llama.hidden_size,
    }
    return config_for_target(
        llama,
        record,
        draft_vocab_size=draft_vocab_size,
        top_k=top_k,
        depth=depth,
        total_tokens=total_tokens,
        **overrides,
    )


@torch.no_grad()
def init_weights(
    net,
    *,
    lm_head_rows: torch.Tensor,
    final_norm: torch.Tensor | None,
    generator: torch.Generator | None = None,
) -> None:
    """The module docstring's start: g = fc([low ; mid ; high]) ~ high, the residual blocks add
    nothing, the head is the target's (``lm_head_rows`` (N, H), ``final_norm`` (H,) or None)."""
    hidden = net.config.hidden_size

    def normal(module, fan_in: int) -> None:
        module.weight.copy_(torch.randn(module.weight.shape, generator=generator) / fan_in**0.5)

    fc = torch.randn(hidden, 3 * hidden, generator=generator) * 0.01 / (3 * hidden) ** 0.5
    fc[:, 2 * hidden :] = torch.eye(hidden)
    net.fc.weight.copy_(fc)
    layer = net.midlayer
    for norm in (layer.input_layernorm, layer.hidden_norm, layer.post_attention_layernorm):
        norm.weight.fill_(1.0)
    for proj in (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj):
        normal(proj, 2 * hidden)
    layer.self_attn.o_proj.weight.zero_()
    normal(layer.mlp.gate_proj, hidden)
    normal(layer.mlp.up_proj, hidden)
    layer.mlp.down_proj.weight.zero_()
    net.norm.weight.copy_(torch.ones(hidden) if final_norm is None else final_norm.float())
    net.lm_head.weight.copy_(lm_head_rows.float())


def _final_norm(target) -> torch.Tensor | None:
    """The target's final RMSNorm weight (a ``transformers`` Llama-family model), if it has one."""
    norm = getattr(getattr(target.model, "model", None), "norm", None)
    return None if norm is None else norm.weight.detach()


def _init_vocabulary(init) -> tuple[np.ndarray, tuple[int, ...]]:
    """The draft vocabulary (target ids) and fused layers of the checkpoint ``init``."""
    config, weights = load_eagle3_checkpoint(init)
    return draft_to_target(weights["d2t"]), config.hidden_layers


def train_eagle3(
    model,
    out,
    *,
    draft_vocab: int = 8192,
    top_k: int = 4,
    depth: int = 3,
    total_tokens: int = 12,
    window: int = 64,
    unroll: int = 3,
    unroll_decay: float = 0.8,
    negatives: int | None = None,
    config_overrides: dict | None = None,
    top_k_labels: int = 32,
    batch_size: int = 512,
    shortlist: int = 0,
    init=None,
    **options,
) -> dict:
    """Distil an EAGLE-3 drafter for ``model`` (a bundled name or a model folder) into ``out``.

    The pipeline of ``specdec.training.run.train_drafter``, which ``options`` go to (``steps``,
    ``minutes``, ``prompts``, ``lr``, ``resume`` ...). draft_vocab: the draft vocabulary's size
    (0: the target's whole vocabulary); top_k, depth, total_tokens: the tree the checkpoint
    records and evaluation drafts with; window, unroll, unroll_decay, negatives: the loss
    (``specdec_eagle3.task.Eagle3Task``); batch_size counts positions (``batch_size // window``
    windows); top_k_labels: the teacher's top-k soft labels. ``init``: an EAGLE-3 checkpoint
    trained for this target to start from; its draft vocabulary and fused layers are kept.
    ``shortlist`` is refused: the draft vocabulary is ``draft_vocab``.
    """
    if shortlist:
        raise InvalidInputError(
            "EAGLE-3 drafts over its own draft vocabulary: give "
            "--draft-vocab N (draft_vocab=N), not --shortlist"
        )
    overrides = dict(config_overrides or {})
    init_ids = None
    if init is not None:
        init_ids, overrides["hidden_layers"] = _init_vocabulary(init)
    llama = LlamaConfig.from_folder(Path(resolve_model(model)))
    layers = tuple(overrides.get("hidden_layers") or default_hidden_layers(llama.num_hidden_layers))
    overrides["hidden_layers"] = layers

    def make_task(
        target, seed: int, *, shortlist: np.ndarray | None = None, data=None
    ) -> Eagle3Task:
        vocab = int(target.embed_tokens.shape[0])
        ids = init_ids if init_ids is not None else shortlist
        ids = np.arange(vocab) if ids is None else ids
        config = default_config(
            target,
            draft_vocab_size=len(ids),
            top_k=top_k,
            depth=depth,
            total_tokens=total_tokens,
            **overrides,
        )
        task = Eagle3Task(
            config,
            embed_tokens=target.embed_tokens,
            ids=ids,
            window=window,
            unroll=unroll,
            unroll_decay=unroll_decay,
            negatives=negatives,
            data=data,
        )
        init_weights(
            task.module,
            lm_head_rows=target.lm_head[torch.as_tensor(ids)],
            final_norm=_final_norm(target),
            generator=torch.Generator().manual_seed(seed),
        )
        return task

    def index_view(data):
        return attrs.evolve(
            data, hidden=torch.arange(data.num_positions)[:, None], layers=None, layer_ids=()
        )

    shape = {
        "window": window,
        "unroll": unroll,
        "unroll_decay": unroll_decay,
        "negatives": negatives,
        "draft_vocab": len(init_ids) if init_ids is not None else draft_vocab,
    }
    tree = {"top_k": top_k, "depth": depth, "total_tokens": total_tokens}
    options["run_settings"] = {
        "tree": tree,
        **shape,
        "hidden_layers": list(layers),
        "config_overrides": config_overrides,
        **options.get("run_settings", {}),
    }
    return train_drafter(
        "eagle3",
        make_task,
        model,
        out,
        top_k=top_k_labels,
        batch_size=batch_size,
        shortlist=0 if init_ids is not None else int(draft_vocab),
        init=init,
        loop_data=index_view,
        report_training=shape,
        teacher_layers=tuple(sorted(set(layers))),
        **options,
    )
