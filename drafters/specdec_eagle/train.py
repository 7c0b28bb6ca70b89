"""Training an EAGLE drafter by distillation from its target (EAGLE-1, arXiv 2401.15077, section 4).

The teacher data (``specdec.training.teacher``) hold, for every position p of the target's own
continuations, its feature f_p, its greedy token x_{p+1} and its top-k next-token distribution.
EAGLE reads runs of positions: a training example is a window of ``window`` consecutive
positions p = t .. t+T-1 of one sequence, where the draft layer runs causally over the entries
(x_{p+1}, f_p + noise) exactly as it does at decode time (``specdec_eagle.torch.EagleNet``), and
its output at p is pulled towards the next feature and the next distribution:

    loss = feature_weight * SmoothL1(out_p, f_{p+1})            (mean over H, over positions)
         + ce_weight * soft cross-entropy(lm_head(out_p), teacher distribution at p+1)

``noise``: uniform noise U(-noise, noise) on the input features, which stand in for the draft's
own, slightly wrong, features at deeper tree levels (EAGLE's data augmentation). The cross-entropy
runs over all V or, with ``negatives``, over the batch's label tokens plus sampled negatives
(``specdec.training.loop.sampled_soft_cross_entropy``).

The shared loop (``specdec.training.loop.train``) draws positions and gathers per-position
windows; EAGLE's windows need runs of positions, so ``train_eagle`` gives the loop an index view
of the training data (its ``hidden`` holds each position's index) and ``EagleTask.loss`` reads the
windows from the real data. ``--batch-size`` keeps its meaning: positions per optimiser step
(``batch_size // window`` windows). Held-out evaluation runs the inference code's tree search
(``specdec_eagle.torch.TreeSearch``) at every position the greedy replay visits, with the draft
cache of the sequence so far, and counts the drafted tokens greedy verification would accept.
"""

from __future__ import annotations

from pathlib import Path

import attrs
import numpy as np
import torch
import torch.nn.functional as F

from specdec.models.checkpoints import save_checkpoint
from specdec.models.llama import LlamaConfig
from specdec.training.evaluate import beam_acceptance, gather_window
from specdec.training.loop import sampled_soft_cross_entropy, soft_cross_entropy
from specdec.training.run import train_drafter
from specdec_eagle.checkpoint import config_for_target
from specdec_eagle.config import EagleConfig
from specdec_eagle.torch import EagleNet, TorchEagleDrafter, TreeContext, TreeSearch

__all__ = ["EagleTask", "default_config", "init_weights", "train_eagle", "tree_acceptance"]


def default_config(
    target, *, top_k: int = 4, depth: int = 3, total_tokens: int = 12, **overrides
) -> EagleConfig:
    """The draft layer for a ``TeacherTarget``: the target's head layout, MLP width, rotary base
    and norm epsilon, fc with a bias (EAGLE-1)."""
    llama = LlamaConfig.from_folder(target.folder)
    record = {
        "name": target.name,
        "fingerprint": target.fingerprint,
        "vocab_size": llama.vocab_size,
        "hidden_size": llama.hidden_size,
    }
    return config_for_target(
        llama, record, top_k=top_k, depth=depth, total_tokens=total_tokens, **overrides
    )


@torch.no_grad()
def init_weights(net, generator: torch.Generator | None = None) -> None:
    """Start from "the next feature is this one": fc reads the feature through the identity (the
    embedding half small and random), the attention's and the MLP's output projections are zero,
    so the untrained draft returns f_p; the other projections are random 1/sqrt(fan_in)."""
    hidden = net.config.hidden_size

    def normal(module, fan_in: int, std_scale: float = 1.0):
        module.weight.copy_(
            torch.randn(module.weight.shape, generator=generator) * std_scale / fan_in**0.5
        )

    embed_rms = float(net.embed_tokens.float().pow(2).mean().sqrt()) or 1.0
    fc = (
        torch.randn(hidden, 2 * hidden, generator=generator)
        * 0.01
        / ((2 * hidden) ** 0.5 * embed_rms)
    )
    fc[:, hidden:] += torch.eye(hidden)
    net.fc.weight.copy_(fc)
    if net.fc.bias is not None:
        net.fc.bias.zero_()
    layer = net.layers[0]
    for proj in (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj):
        normal(proj, hidden)
    layer.self_attn.o_proj.weight.zero_()
    normal(layer.mlp.gate_proj, hidden)
    normal(layer.mlp.up_proj, hidden)
    layer.mlp.down_proj.weight.zero_()
    layer.post_attention_layernorm.weight.fill_(1.0)


class EagleTask:
    """EAGLE for ``specdec.training.loop.train`` over an index view of the data (``train_eagle``).

    window: positions per training window; noise: half-width of the uniform noise on input
    features; feature_weight, ce_weight: the two terms of the loss; unroll: drafting steps
    trained per position (1: EAGLE-1; more: step s reads the draft's own step s-1 outputs as
    features, as tree level s does, its loss weighted unroll_decay ** (s-1)); negatives:
    sampled-softmax loss; shortlist: the vocabulary shortlist the saved drafter drafts from
    (training spreads the loss over all V; evaluation drafts with the shortlist, as inference will).
    """

    depth = 0  # the loop's windows carry the sampled index only (train_eagle's index view)

    def __init__(
        self,
        config: EagleConfig,
        *,
        embed_tokens: torch.Tensor,
        lm_head: torch.Tensor,
        seed: int = 0,
        window: int = 64,
        noise: float = 0.1,
        feature_weight: float = 1.0,
        ce_weight: float = 0.1,
        unroll: int = 1,
        unroll_decay: float = 0.8,
        negatives: int | None = None,
        shortlist: np.ndarray | None = None,
        data=None,
    ):
        self.shortlist = None if shortlist is None else np.asarray(shortlist, dtype=np.int64)
        self.config = attrs.evolve(
            config, shortlist_size=None if shortlist is None else len(self.shortlist)
        )
        self.window, self.noise = int(window), float(noise)
        self.feature_weight, self.ce_weight, self.negatives = (
            float(feature_weight),
            float(ce_weight),
            negatives,
        )
        self.unroll, self.unroll_decay = int(unroll), float(unroll_decay)
        self.module = EagleNet(
            attrs.evolve(config, shortlist_size=None),
            embed_tokens=embed_tokens.float(),
            lm_head=lm_head.float(),
        )
        init_weights(self.module, torch.Generator().manual_seed(seed))
        self.data = data  # the training data (TeacherData) that the loop's index view stands for
        self._inference = None  # (drafter, held-out draft caches) on the current weights

    # ------------------------------------------------------------------------------ training

    def windows(self, data, starts: torch.Tensor, offset: int = 0):
        """Window positions p = start + j (j < T) read ``offset`` tokens ahead: the token
        x_{p+1+offset}, the features f_p and f_{p+1+offset}, the teacher's distribution at
        p+1+offset. Positions past the sequence are clamped inside it. -> tokens (n, T), features
        (n, T, H), targets (n, T, H), label ids and probs (n, T, k), valid (n, T): the target
        position exists in the sequence."""
        steps = torch.arange(self.window)
        remaining = data.remaining[starts][:, None]  # positions after the start in its sequence
        at = lambda shift: torch.where(
            steps[None] + shift <= remaining,
            starts[:, None] + steps + shift,  # noqa: E731
            starts[:, None],
        )
        valid = steps[None] + 1 + offset <= remaining
        targets = at(1 + offset)
        return (
            data.next_tokens[at(offset)],
            data.hidden[at(0)].float(),
            data.hidden[targets].float(),
            data.label_ids[targets],
            data.label_probs[targets],
            valid,
        )

    def forward_windows(self, tokens: torch.Tensor, features: torch.Tensor, past=None):
        """The draft layer over windows: tokens (n, T), features (n, T, H) -> out (n, T, H), keys,
        values. Without ``past``: causal over the window (entries of true features). With ``past``
        (keys, values of earlier unrolled steps, the first one causal): entry j sits one position
        later than in the previous step and attends to the first step's entries up to j, to the same
        j's entries of the later steps, and to itself (a tree node over its ancestors)."""
        n, length = tokens.shape
        eye = torch.eye(length, dtype=torch.bool)
        blocks = [torch.ones(length, length, dtype=torch.bool).tril()]
        if past is not None:
            blocks += [eye] * len(past[0])
        positions = (torch.arange(length) + (0 if past is None else len(past[0]))).expand(n, length)
        mask = torch.cat(blocks, dim=1).expand(n, length, -1)
        keys = None if past is None else torch.cat(past[0], dim=2)
        values = None if past is None else torch.cat(past[1], dim=2)
        return self.module.layer(self.module.fuse(tokens, features), positions, keys, values, mask)

    def step_loss(self, out, targets, label_ids, label_probs, valid, generator) -> torch.Tensor:
        """feature_weight * SmoothL1 + ce_weight * soft cross-entropy, per valid position."""
        count = valid.sum().clamp(min=1)
        feature_loss = (
            F.smooth_l1_loss(out, targets, reduction="none").mean(-1) * valid
        ).sum() / count
        if self.negatives and generator is not None:
            ce = sampled_soft_cross_entropy(
                out,
                self.module.lm_head,
                label_ids,
                label_probs,
                valid,
                negatives=self.negatives,
                generator=generator,
            )
        else:
            ce = soft_cross_entropy(
                F.linear(out, self.module.lm_head), label_ids, label_probs, valid
            )
        return self.feature_weight * feature_loss + self.ce_weight * ce * out.shape[0] / count

    def loss(self, window, generator: torch.Generator | None = None) -> torch.Tensor:
        self._inference = None
        indices = window.hidden[:, 0].long()
        starts = indices[: max(1, indices.shape[0] // self.window)]
        tokens, features, targets, label_ids, label_probs, valid = self.windows(self.data, starts)
        if self.noise:
            features = (
                features + (torch.rand(features.shape, generator=generator) * 2 - 1) * self.noise
            )
        out, keys, values = self.forward_windows(tokens, features)
        total = self.step_loss(out, targets, label_ids, label_probs, valid, generator)
        past = ([keys], [values])
        # the draft reads its own predicted features, as deeper tree levels do
        for step in range(1, self.unroll):
            tokens, _, targets, label_ids, label_probs, valid = self.windows(
                self.data, starts, offset=step
            )
            out, keys, values = self.forward_windows(tokens, out, past)
            total = total + self.unroll_decay**step * self.step_loss(
                out, targets, label_ids, label_probs, valid, generator
            )
            past[0].append(keys)
            past[1].append(values)
        return total

    # ------------------------------------------------------------------------------ evaluation

    def weights(self) -> dict[str, np.ndarray]:
        """The checkpoint's weights: the network's, plus the shortlist when there is one."""
        weights = self.module.weights()
        if self.shortlist is not None:
            weights["vocab_shortlist"] = self.shortlist
        return weights

    def _drafter(self, data):
        """The inference drafter on the current weights and the draft cache of every held-out
        position (keys and values (Hkv, P, Dh) over ``data``'s flat positions, each sequence from
        its own start), rebuilt after training steps."""
        if self._inference is not None and self._inference[0] is data:
            return self._inference[1:]
        net = self.module
        drafter = TorchEagleDrafter(
            self.config, self.weights(), embed_tokens=net.embed_tokens, lm_head=net.lm_head
        )
        cfg = self.config
        keys = torch.zeros(cfg.num_kv_heads, data.num_positions, cfg.head_dim)
        values = torch.zeros_like(keys)
        starts = data.starts().tolist() + [data.num_positions]
        with torch.no_grad():
            for begin, end in zip(starts[:-1], starts[1:]):
                length = end - begin
                positions = torch.arange(length)[None]
                mask = torch.ones(length, length, dtype=torch.bool).tril()[None]
                x = drafter.net.fuse(
                    data.next_tokens[begin:end][None], data.hidden[begin:end][None].float()
                )
                _, k, v = drafter.net.layer(x, positions, None, None, mask)
                keys[:, begin:end], values[:, begin:end] = k[0], v[0]
        self._inference = (data, drafter, keys, values, data.starts())
        return self._inference[1:]

    def accept(self, data, indices: torch.Tensor) -> torch.Tensor:
        """The inference tree at each position (its cache: the sequence's earlier positions);
        the drafted tokens greedy verification accepts there."""
        drafter, keys, values, starts = self._drafter(data)
        return tree_acceptance(
            data, indices, drafter, keys, values, starts, data.hidden[indices].float()
        )

    def save(self, folder: Path, *, dtype=np.float32) -> Path:
        return save_checkpoint(folder, self.config.to_dict(), self.weights(), dtype=dtype)


def train_eagle(
    model,
    out,
    *,
    top_k: int = 4,
    depth: int = 3,
    total_tokens: int = 12,
    window: int = 64,
    noise: float = 0.1,
    feature_weight: float = 1.0,
    ce_weight: float = 0.1,
    unroll: int = 1,
    negatives: int | None = None,
    config_overrides: dict | None = None,
    top_k_labels: int = 32,
    batch_size: int = 512,
    **options,
) -> dict:
    """Distil an EAGLE drafter for ``model`` (a bundled name or a model folder) into folder ``out``.

    The pipeline of ``specdec.training.run.train_drafter`` (output folder checks, teacher data and
    its cache, shortlist, the shared loop with its evaluations, best and last checkpoints, resume,
    report), which ``options`` go to; ``batch_size`` counts positions (windows of ``window``),
    ``top_k_labels`` is the teacher's top-k soft labels. top_k, depth, total_tokens: the tree the
    checkpoint records and evaluation drafts with.
    """

    def make_task(
        target, seed: int, *, shortlist: np.ndarray | None = None, data=None
    ) -> EagleTask:
        config = default_config(
            target, top_k=top_k, depth=depth, total_tokens=total_tokens, **(config_overrides or {})
        )
        return EagleTask(
            config,
            embed_tokens=target.embed_tokens,
            lm_head=target.lm_head,
            seed=seed,
            window=window,
            noise=noise,
            feature_weight=feature_weight,
            ce_weight=ce_weight,
            unroll=unroll,
            negatives=negatives,
            shortlist=shortlist,
            data=data,
        )

    def index_view(data):
        return attrs.evolve(data, hidden=torch.arange(data.num_positions)[:, None])

    shape = {
        "window": window,
        "noise": noise,
        "feature_weight": feature_weight,
        "ce_weight": ce_weight,
        "unroll": unroll,
        "negatives": negatives,
    }
    options["run_settings"] = {
        "tree": {"top_k": top_k, "depth": depth, "total_tokens": total_tokens},
        **shape,
        "config_overrides": config_overrides,
        **options.get("run_settings", {}),
    }
    return train_drafter(
        "eagle",
        make_task,
        model,
        out,
        top_k=top_k_labels,
        batch_size=batch_size,
        loop_data=index_view,
        report_training=shape,
        **options,
    )


def tree_acceptance(
    data, indices: torch.Tensor, drafter, keys, values, starts, features
) -> torch.Tensor:
    """The drafted tokens greedy verification accepts at positions ``indices`` of ``data`` when
    the inference tree search (``specdec_eagle.torch.TreeSearch``) runs there over the draft
    layer's cached ``keys`` / ``values`` (layer entries of every position; ``starts``: each
    sequence's first) of the sequence so far, from the root features ``features`` (B, H). EAGLE's
    and EAGLE-3's held-out evaluations."""
    sequence_start = starts[data.sequence[indices]]  # (B,)
    lengths = indices - sequence_start  # entries before the root entry
    span = max(int(lengths.max()), 1)
    where = sequence_start[:, None] + torch.arange(span)[None]  # (B, span)
    ctx_mask = torch.arange(span)[None] < lengths[:, None]
    where = torch.where(ctx_mask, where, 0)
    ctx_keys = keys[:, where].permute(1, 0, 2, 3)  # (B, Hkv, span, Dh)
    ctx_values = values[:, where].permute(1, 0, 2, 3)
    with torch.no_grad():
        search = TreeSearch(drafter, TreeContext(ctx_keys, ctx_values, ctx_mask, lengths))
        beams = search.run(data.next_tokens[indices], features)
    window = gather_window(data, indices, drafter.depth, labels=False)
    return beam_acceptance(beams, window.tokens[:, 1:], window.valid)
