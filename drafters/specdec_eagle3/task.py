"""The EAGLE-3 training task: training-time test over windows of teacher data, and held-out
acceptance from the inference tree search (``specdec_eagle3.train`` runs it in the shared loop).

**Training-time test** (arXiv 2503.01840, section 3.2). A training example is a window of T
consecutive positions p = t .. t+T-1 of one sequence. Step 0 runs the draft layer causally over
the entries (x_{p+1}, g_p), g_p = fc([low_p ; mid_p ; high_p]) the fused target layers, exactly
as the drafter's cache does at decode time. Step j > 0 runs the entries (x_{p+1+j},
out^{j-1}_p): each reads the draft's own output of step j-1 at the same window index as its
feature, sits at rotary position p + j, and is a tree node of level j whose root entry is step
0's entry p. Its query attends to step 0's entries 0 .. p (the cache and the root entry) and to
its own chain, the entries of steps 1 .. j at index p (``unrolled_mask``):

    step j, window index i:   step 0 keys: i' <= i      step s (1 <= s <= j) keys: i' == i

Worked example, T = 3, step 2 (keys laid out as step 0's three, then step 1's, then step 2's):

    i = 0:  1 0 0 | 1 0 0 | 1 0 0
    i = 1:  1 1 0 | 0 1 0 | 0 1 0
    i = 2:  1 1 1 | 0 0 1 | 0 0 1

The output of step j at p predicts x_{p+2+j}: its loss is the soft cross-entropy over the draft
vocabulary against the teacher's top-k distribution at position p+1+j, mapped to draft ids
(``map_labels``: ids outside the draft vocabulary dropped, the rest renormalised), at positions
that exist in the sequence and whose target argmax x_{p+2+j} is in the draft vocabulary, weighted
``unroll_decay ** j``. No feature regression. Tokens are the target's own (teacher forcing), as
an accepted draft's are.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from specdec.training.loop import sampled_soft_cross_entropy, soft_cross_entropy
from specdec_eagle.train import tree_acceptance
from specdec_eagle3.checkpoint import d2t_from_ids, save_eagle3
from specdec_eagle3.config import Eagle3Config
from specdec_eagle3.torch import Eagle3Net, TorchEagle3Drafter

__all__ = ["Eagle3Task", "map_labels", "target_to_draft", "unrolled_mask"]


def unrolled_mask(length: int, step: int) -> torch.Tensor:
    """(T, T * (step + 1)) bool: which keys the step-``step`` queries of a window of T positions
    attend to; keys are step 0's T entries, then step 1's, ... then this step's (module
    docstring)."""
    blocks = [torch.ones(length, length, dtype=torch.bool).tril()]
    blocks += [torch.eye(length, dtype=torch.bool)] * step
    return torch.cat(blocks, dim=1)


def target_to_draft(ids, vocab_size: int) -> torch.Tensor:
    """(V,) int64: the draft id of each target id of the ascending draft vocabulary ``ids`` (N,),
    -1 for target ids outside it (the engines' ``t2d`` mask is ``t2d >= 0``)."""
    ids = torch.as_tensor(np.asarray(ids, dtype=np.int64))
    t2d = torch.full((vocab_size,), -1, dtype=torch.int64)
    t2d[ids] = torch.arange(len(ids))
    return t2d


def map_labels(label_ids: torch.Tensor, label_probs: torch.Tensor, t2d: torch.Tensor):
    """The teacher's top-k labels (..., k) of target ids as draft ids: (draft ids, probabilities)
    with ids outside the draft vocabulary pointing at draft id 0 with probability 0 (the loss
    renormalises what is left)."""
    local = t2d[label_ids]
    inside = local >= 0
    return torch.where(inside, local, 0), torch.where(inside, label_probs.float(), 0.0)


class Eagle3Task:
    """EAGLE-3 for ``specdec.training.loop.train`` over an index view of the data
    (``train_eagle3``).

    config: the drafter (its ``hidden_layers`` resolved, ``draft_vocab_size`` = len(ids));
    embed_tokens: the target's (V, H); ids: the draft vocabulary's ascending target ids; window:
    positions per training window; unroll: training-time-test steps (1: step 0 only);
    unroll_decay: step j's loss weight is unroll_decay ** j; negatives: sampled-softmax loss over
    that many draft ids beside the labels (None: the whole draft vocabulary); data: the training
    ``TeacherData`` (with the fused layers' outputs) that the loop's index view stands for.
    """

    depth = 0  # the loop's windows carry the sampled index only (train_eagle3's index view)

    def __init__(
        self,
        config: Eagle3Config,
        *,
        embed_tokens: torch.Tensor,
        ids,
        window: int = 64,
        unroll: int = 3,
        unroll_decay: float = 0.8,
        negatives: int | None = None,
        data=None,
    ):
        self.ids = np.asarray(ids, dtype=np.int64)
        if config.hidden_layers is None or len(self.ids) != config.draft_vocab_size:
            raise ValueError(
                "Eagle3Task needs a config with resolved hidden_layers and "
                "draft_vocab_size = len(ids)"
            )
        if int(unroll) < 1 or int(window) < 1:
            raise ValueError(
                f"unroll and window must be positive, got unroll={unroll}, window={window}"
            )
        self.config = config
        self.window, self.unroll, self.unroll_decay = int(window), int(unroll), float(unroll_decay)
        self.negatives = negatives if negatives and negatives < config.draft_vocab_size else None
        self.module = Eagle3Net(config, embed_tokens=embed_tokens.float())
        self.t2d = target_to_draft(self.ids, config.vocab_size)
        self.data = data
        self._inference = None  # (data, drafter, keys, values, fused, starts) on these weights

    @property
    def teacher_layers(self) -> tuple[int, ...]:
        """The decoder layers whose outputs the teacher data must hold (ascending, distinct)."""
        return tuple(sorted(set(self.config.hidden_layers)))

    def fused(self, data, positions: torch.Tensor) -> torch.Tensor:
        """g = fc([low ; mid ; high]) at flat ``positions`` (...) of ``data`` -> (..., H) (through
        the head's ``input_norm`` first where it has one)."""
        layers = data.layer_outputs(self.config.hidden_layers, positions)  # (..., 3, H)
        return self.module.features(list(layers.unbind(-2)))

    # ------------------------------------------------------------------------------ training

    def windows(self, data, starts: torch.Tensor, offset: int = 0):
        """Window positions p = start + i (i < T) at step ``offset``: flat indices of p (for the
        features), the tokens x_{p+1+offset}, the teacher's labels at p+1+offset and the loss
        mask (that position exists and its greedy token is in the draft vocabulary). Positions
        past the sequence read its start. -> where (n, T), tokens (n, T), label ids and
        probabilities (n, T, k) as draft ids, mask (n, T)."""
        steps = torch.arange(self.window)
        remaining = data.remaining[starts][:, None]  # positions after the start in its sequence

        def at(shift: int) -> torch.Tensor:
            inside = steps[None] + shift <= remaining
            return torch.where(inside, starts[:, None] + steps + shift, starts[:, None])

        targets = at(1 + offset)
        label_ids, label_probs = map_labels(
            data.label_ids[targets], data.label_probs[targets], self.t2d
        )
        mask = (steps[None] + 1 + offset <= remaining) & (self.t2d[data.next_tokens[targets]] >= 0)
        return at(0), data.next_tokens[at(offset)], label_ids, label_probs, mask

    def step(self, tokens: torch.Tensor, features: torch.Tensor, past=None):
        """Step len(past keys) of the unroll over windows: tokens (n, T), features (n, T, H);
        past: (keys, values) lists of the earlier steps' (n, Hkv, T, Dh), or None for step 0.
        -> out (n, T, H), keys, values (n, Hkv, T, Dh)."""
        n, length = tokens.shape
        step = 0 if past is None else len(past[0])
        positions = (torch.arange(length) + step).expand(n, length)
        mask = unrolled_mask(length, step).expand(n, length, -1)
        keys = None if past is None else torch.cat(past[0], dim=2)
        values = None if past is None else torch.cat(past[1], dim=2)
        return self.module.layer(self.module.fuse(tokens, features), positions, keys, values, mask)

    def step_loss(self, out, label_ids, label_probs, mask, generator) -> torch.Tensor:
        """Mean soft cross-entropy over the masked positions (the draft vocabulary's logits)."""
        count = mask.sum().clamp(min=1)
        normed = self.module.norm(out)
        if self.negatives and generator is not None:
            ce = sampled_soft_cross_entropy(
                normed,
                self.module.lm_head.weight,
                label_ids,
                label_probs,
                mask,
                negatives=self.negatives,
                generator=generator,
            )
        else:
            ce = soft_cross_entropy(self.module.lm_head(normed), label_ids, label_probs, mask)
        return ce * out.shape[0] / count  # soft_cross_entropy sums over T and divides by n

    def loss(self, window, generator: torch.Generator | None = None) -> torch.Tensor:
        self._inference = None
        indices = window.hidden[:, 0].long()
        starts = indices[: max(1, indices.shape[0] // self.window)]
        return self.unrolled_loss(self.data, starts, generator)

    def unrolled_loss(self, data, starts: torch.Tensor, generator=None) -> torch.Tensor:
        """The weighted loss of ``unroll`` steps over the windows starting at flat ``starts``."""
        where, tokens, label_ids, label_probs, mask = self.windows(data, starts)
        out, keys, values = self.step(tokens, self.fused(data, where))
        total = self.step_loss(out, label_ids, label_probs, mask, generator)
        past = ([keys], [values])
        for step in range(1, self.unroll):  # its own outputs as features, as tree level `step`
            _, tokens, label_ids, label_probs, mask = self.windows(data, starts, offset=step)
            out, keys, values = self.step(tokens, out, past)
            loss = self.step_loss(out, label_ids, label_probs, mask, generator)
            total = total + self.unroll_decay**step * loss
            past[0].append(keys)
            past[1].append(values)
        return total

    # ------------------------------------------------------------------------------ evaluation

    def weights(self) -> dict[str, np.ndarray]:
        """The checkpoint's weights: the network's and ``d2t``."""
        return {**self.module.weights(), "d2t": d2t_from_ids(self.ids)}

    def _drafter(self, data):
        """The inference drafter on the current weights, the draft cache of every position of
        ``data`` (keys and values (Hkv, P, Dh), each sequence from its own start) and the fused
        features (P, H); rebuilt after training steps."""
        if self._inference is not None and self._inference[0] is data:
            return self._inference[1:]
        drafter = TorchEagle3Drafter(
            self.config, self.weights(), embed_tokens=self.module.embed_tokens
        )
        cfg, net = self.config, drafter.net
        keys = torch.zeros(cfg.num_kv_heads, data.num_positions, cfg.head_dim)
        values = torch.zeros_like(keys)
        fused = torch.zeros(data.num_positions, cfg.hidden_size)
        starts = data.starts().tolist() + [data.num_positions]
        with torch.no_grad():
            for begin, end in zip(starts[:-1], starts[1:]):
                length = end - begin
                span = torch.arange(begin, end)
                layers = data.layer_outputs(cfg.hidden_layers, span).float()  # (n, 3, H)
                fused[begin:end] = net.features(list(layers.unbind(1)))
                mask = torch.ones(length, length, dtype=torch.bool).tril()[None]
                x = net.fuse(data.next_tokens[begin:end][None], fused[begin:end][None])
                _, k, v = net.layer(x, torch.arange(length)[None], None, None, mask)
                keys[:, begin:end], values[:, begin:end] = k[0], v[0]
        self._inference = (data, drafter, keys, values, fused, data.starts())
        return self._inference[1:]

    def accept(self, data, indices: torch.Tensor) -> torch.Tensor:
        """The inference tree at each position (its cache: the sequence's earlier positions);
        the drafted tokens greedy verification accepts there."""
        drafter, keys, values, fused, starts = self._drafter(data)
        return tree_acceptance(data, indices, drafter, keys, values, starts, fused[indices])

    def save(self, folder: Path, *, dtype=np.float32) -> Path:
        return save_eagle3(folder, self.config, self.weights(), dtype=dtype)
