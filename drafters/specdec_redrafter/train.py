"""Training a ReDrafter by distillation from its target (arXiv 2403.09919, section 3.3).

``RedrafterNet`` is the drafter as a trainable ``torch.nn.Module`` whose parameter names are
the checkpoint's weight names (``specdec_redrafter.config``), with the same math as the
reference (``specdec_redrafter.reference``); the target's embedding and LM head are borrowed,
frozen. Training is teacher-forced over all L-1 drafted positions at once: at position t (root
x_{t+1}, hidden h_t) the recurrence runs over the target's own continuation,

    s_1 = rnn(e(x_{t+1}))              step 1 predicts x_{t+2}
    s_k = rnn(e(x_{t+k}), s_{k-1})     step k predicts x_{t+k+1}

and each step's logits head([h_t ; s_k]) are pulled towards the target's top-k distribution at
position t+k (``soft_cross_entropy``), summed over the steps. Held-out evaluation runs the
inference module's beam search (``specdec_redrafter.torch.RedrafterModule``) on the trained
weights and counts the drafted tokens that match the target's greedy continuation.

Shapes: B positions, D = L-1 drafted steps, V vocab, H hidden, E exit_dim.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import attrs
import numpy as np
import torch
import torch.nn.functional as F

from specdec.models.checkpoints import save_checkpoint
from specdec.training.evaluate import beam_acceptance, gather_window
from specdec.training.loop import sampled_soft_cross_entropy, soft_cross_entropy
from specdec.training.run import train_drafter
from specdec_redrafter.config import RedrafterConfig, check_weights
from specdec_redrafter.torch import RedrafterModule

__all__ = ["RedrafterNet", "RedrafterTask", "default_config", "train_redrafter"]


class _Block(torch.nn.Module):
    """Residual SiLU block: x <- x + SiLU(linear(x)) (weight names ``lm_head.{i}.linear.*``)."""

    def __init__(self, width: int):
        super().__init__()
        self.linear = torch.nn.Linear(width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + F.silu(self.linear(x))


class RedrafterNet(torch.nn.Module):
    """A trainable ReDrafter. ``state_dict()`` holds exactly ``config.weight_shapes()``.

    embed_tokens (V, H) and target_lm_head (V, H): the target's tensors, kept as plain attributes
    (not parameters, not saved). ``generator`` seeds the initialisation: residual blocks start at
    zero (identity), the head reads h (so training starts from the target's own next-token
    distribution) and a small random part of s.
    """

    def __init__(
        self,
        config: RedrafterConfig,
        *,
        embed_tokens: torch.Tensor,
        target_lm_head: torch.Tensor | None,
        generator: torch.Generator | None = None,
    ):
        super().__init__()
        if config.head == "tied" and target_lm_head is None:
            raise ValueError("a ReDrafter with head='tied' needs the target's LM head (V, H)")
        self.config = config
        self.embed_tokens, self.target_lm_head = (
            embed_tokens.detach(),
            (None if target_lm_head is None else target_lm_head.detach()),
        )
        hidden, exit_dim = config.hidden_size, config.exit_dim
        self.input_proj = torch.nn.Linear(2 * hidden, exit_dim) if exit_dim != 2 * hidden else None
        layers: list[torch.nn.Module] = [_Block(exit_dim) for _ in range(config.num_draft_layers)]
        if config.head == "full":
            layers.append(torch.nn.Linear(exit_dim, config.vocab_size, bias=False))
        self.lm_head = torch.nn.ModuleList(layers)
        self.head_proj = (
            torch.nn.Linear(exit_dim, hidden, bias=False) if config.head == "tied" else None
        )
        if config.rnn:
            self.rnn_w = torch.nn.Linear(hidden, hidden, bias=False)
            self.rnn_u = torch.nn.Linear(hidden, hidden)
        self._initialise(generator)

    @torch.no_grad()
    def _initialise(self, generator: torch.Generator | None) -> None:
        hidden, exit_dim = self.config.hidden_size, self.config.exit_dim

        def normal(shape, std):
            return torch.randn(shape, generator=generator) * std

        embed_rms = float(self.embed_tokens.float().pow(2).mean().sqrt()) or 1.0
        if self.config.rnn:
            # W e ~ unit scale
            self.rnn_w.weight.copy_(normal((hidden, hidden), 1.0 / (hidden**0.5 * embed_rms)))
            self.rnn_u.weight.copy_(normal((hidden, hidden), 0.5 / hidden**0.5))
            self.rnn_u.bias.zero_()
        if self.input_proj is not None:
            self.input_proj.weight.copy_(normal((exit_dim, 2 * hidden), 1.0 / (2 * hidden) ** 0.5))
            self.input_proj.bias.zero_()
        for block in self.lm_head[: self.config.num_draft_layers]:
            block.linear.weight.zero_()
            block.linear.bias.zero_()
        # Read h into the head: [I, small noise] when the features are [h ; s], random otherwise.
        reader = normal((hidden, exit_dim), 0.01 / exit_dim**0.5)
        if self.input_proj is None:
            reader[:, :hidden] += torch.eye(hidden)
        if self.head_proj is not None:
            self.head_proj.weight.copy_(reader)
        else:
            lm_head = (
                self.target_lm_head
                if self.target_lm_head is not None
                else normal((self.config.vocab_size, hidden), 1.0 / hidden**0.5)
            )
            self.lm_head[-1].weight.copy_(lm_head.float() @ reader)

    def rnn_step(self, state: torch.Tensor | None, tokens: torch.Tensor) -> torch.Tensor:
        """s_{k-1} (..., H) or None at k = 1, tokens (...) -> s_k (..., H) (config.rnn_variant)."""
        embedding = F.embedding(tokens, self.embed_tokens).to(self.head_dtype)
        if not self.config.rnn:
            return embedding if state is None else state + embedding
        variant = self.config.rnn_variant
        if variant == "apple":  # s_0 = 0; s_k = SiLU(W e_k + U s_{k-1} + b)
            return F.silu(
                self.rnn_w(embedding)
                + self.rnn_u(torch.zeros_like(embedding) if state is None else state)
            )
        if variant == "trtllm":  # s_1 = W e_1; s_k = W e_k + U s_{k-1} + b
            return (
                self.rnn_w(embedding)
                if state is None
                else self.rnn_w(embedding) + self.rnn_u(state)
            )
        if variant == "paper":  # s_1 = e_1; s_k = SiLU(W e_k + U s_{k-1} + b)
            return embedding if state is None else F.silu(self.rnn_w(embedding) + self.rnn_u(state))
        raise ValueError(f"unknown rnn_variant {variant!r}")

    @property
    def head_dtype(self) -> torch.dtype:
        return next(self.parameters()).dtype

    def features(self, hidden: torch.Tensor, state: torch.Tensor) -> torch.Tensor:
        """The vocabulary projection's input. hidden (..., H), state (..., H), broadcast ->
        (..., F), F = H for the tied head (after head_proj), E for the full head."""
        hidden, state = torch.broadcast_tensors(hidden.to(state.dtype), state)
        x = torch.cat([hidden, state], dim=-1)  # (..., 2H)
        if self.input_proj is not None:
            x = self.input_proj(x)  # (..., E)
        for block in self.lm_head[: self.config.num_draft_layers]:
            x = block(x)
        return x if self.head_proj is None else self.head_proj(x)

    @property
    def vocab_weight(self) -> torch.Tensor:
        """(V, F): the target's LM head (tied) or the drafter's own head (full)."""
        return self.lm_head[-1].weight if self.head_proj is None else self.target_lm_head

    def logits(self, hidden: torch.Tensor, state: torch.Tensor) -> torch.Tensor:
        """hidden (..., H) and state (..., H), broadcast -> logits (..., V)."""
        x = self.features(hidden, state)
        return F.linear(x, self.vocab_weight.to(x.dtype))

    def forward(
        self, hidden: torch.Tensor, tokens: torch.Tensor, *, features_only: bool = False
    ) -> torch.Tensor:
        """Teacher-forced logits of all D steps. hidden (B, H); tokens (B, D): x_{t+1} .. x_{t+D}
        -> logits (B, D, V), step k scoring x_{t+k+1} (or their ``features`` (B, D, F))."""
        states, state = [], None
        for k in range(tokens.shape[1]):
            state = self.rnn_step(state, tokens[:, k])  # (B, H)
            states.append(state)
        states = torch.stack(states, dim=1)  # (B, D, H)
        return (
            self.features(hidden[:, None, :], states)
            if features_only
            else self.logits(hidden[:, None, :], states)
        )

    def weights(self) -> dict[str, np.ndarray]:
        """Name -> float64 array, the checkpoint's weights."""
        return {
            name: tensor.detach().double().cpu().numpy()
            for name, tensor in self.state_dict().items()
        }

    def load_weights(self, weights: dict[str, Any]) -> None:
        """Inverse of ``weights`` (checked against the config). Weights with fewer residual blocks
        than the config (a checkpoint trained with a smaller ``--draft-layers``) get the extra
        blocks at zero, which is the identity (x + SiLU(0) = x): the net computes what the
        checkpoint did, and training grows it from there."""
        weights = self._grown(dict(weights))
        check_weights(self.config, weights)
        self.load_state_dict(
            {
                name: torch.as_tensor(np.asarray(a), dtype=self.head_dtype)
                for name, a in weights.items()
            }
        )

    def _grown(self, weights: dict[str, Any]) -> dict[str, Any]:
        """``weights`` with the residual blocks they lack, at zero (``load_weights``)."""
        blocks = self.config.num_draft_layers
        given = sum(f"lm_head.{i}.linear.weight" in weights for i in range(blocks))
        if given in (0, blocks) or f"lm_head.{given}.linear.weight" in weights:
            return weights
        if self.config.head == "full" and f"lm_head.{given}.weight" in weights:
            weights[f"lm_head.{blocks}.weight"] = weights.pop(f"lm_head.{given}.weight")
        width = self.config.exit_dim
        for i in range(given, blocks):
            weights[f"lm_head.{i}.linear.weight"] = np.zeros((width, width))
            weights[f"lm_head.{i}.linear.bias"] = np.zeros(width)
        return weights


def default_config(
    *,
    vocab_size: int,
    hidden_size: int,
    target: dict,
    beam_width: int = 4,
    beam_length: int = 5,
    **overrides,
) -> RedrafterConfig:
    """The recipe for small targets: tied head (projection to H, then the target's frozen LM head),
    exit_dim 2H, 1 residual block (on a few hundred thousand decoded positions, 2 blocks memorised
    SmolLM2's training continuations more and generalised no better; the ReDrafter shipped for it,
    trained on 1.3M positions of its own answers, has 2), Apple's recurrence."""
    fields = dict(
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        exit_dim=2 * hidden_size,
        num_draft_layers=1,
        rnn=True,
        rnn_variant="apple",
        head="tied",
        beam_width=beam_width,
        beam_length=beam_length,
        target=target,
    )
    fields.update(overrides)
    return RedrafterConfig(**fields)


class RedrafterTask:
    """ReDrafter for ``specdec.training.loop.train``: D = beam_length - 1 teacher-forced steps.

    negatives: when set, the loss's softmax normaliser is estimated on the batch's label tokens
    plus that many sampled tokens (``sampled_soft_cross_entropy``) instead of all V.
    shortlist: the vocabulary shortlist (``specdec.drafting.shortlist``) the saved drafter drafts
    from; training still spreads the loss over all V (the restriction only drops tokens the target
    rarely says), and held-out evaluation drafts with the shortlist, as inference will.
    """

    def __init__(
        self,
        config: RedrafterConfig,
        *,
        embed_tokens: torch.Tensor,
        lm_head: torch.Tensor | None,
        seed: int = 0,
        negatives: int | None = None,
        shortlist: np.ndarray | None = None,
    ):
        self.shortlist = None if shortlist is None else np.asarray(shortlist, dtype=np.int64)
        self.config = attrs.evolve(
            config, shortlist_size=None if shortlist is None else len(self.shortlist)
        )
        self.negatives = negatives
        # the loss runs over all V; the shortlist is inference's
        config = attrs.evolve(config, shortlist_size=None)
        self.module = RedrafterNet(
            config,
            embed_tokens=embed_tokens.float(),
            target_lm_head=None if lm_head is None else lm_head.float(),
            generator=torch.Generator().manual_seed(seed),
        )
        self.depth = config.beam_length - 1
        self._inference = (
            None  # the inference module on the current weights, rebuilt after training steps
        )

    def loss(self, window, generator: torch.Generator | None = None) -> torch.Tensor:
        self._inference = None
        hidden, tokens = window.hidden.float(), window.tokens[:, : self.depth]
        if self.negatives and generator is not None:
            features = self.module(hidden, tokens, features_only=True)  # (B, D, F)
            return sampled_soft_cross_entropy(
                features,
                self.module.vocab_weight,
                window.label_ids,
                window.label_probs,
                window.valid,
                negatives=self.negatives,
                generator=generator,
            )
        logits = self.module(hidden, tokens)  # (B, D, V)
        return soft_cross_entropy(logits, window.label_ids, window.label_probs, window.valid)

    def accept(self, data, indices: torch.Tensor) -> torch.Tensor:
        """Beam search of the inference module on the current weights; matched prefix per
        position."""
        net = self.module
        if self._inference is None:
            self._inference = RedrafterModule(
                self.config,
                self.weights(),
                embed_tokens=net.embed_tokens,
                lm_head=net.target_lm_head,
            )
        inference = self._inference
        window = gather_window(data, indices, self.depth, labels=False)
        beams, _, _ = inference.beam_search(
            window.hidden.float(),
            window.tokens[:, 0],
            width=self.config.beam_width,
            length=self.config.beam_length,
            keep_log_probs=False,
        )
        return beam_acceptance(beams, window.tokens[:, 1:], window.valid)

    def save(self, folder: Path, *, dtype=np.float32) -> Path:
        return save_checkpoint(folder, self.config.to_dict(), self.weights(), dtype=dtype)

    def weights(self) -> dict[str, np.ndarray]:
        """The checkpoint's weights: the network's, plus the shortlist when there is one."""
        weights = self.module.weights()
        if self.shortlist is not None:
            weights["vocab_shortlist"] = self.shortlist
        return weights


def train_redrafter(
    model,
    out,
    *,
    beam_width: int = 4,
    beam_length: int = 5,
    draft_layers: int = 1,
    config_overrides: dict | None = None,
    negatives: int | None = None,
    **options,
) -> dict:
    """Distil a ReDrafter for ``model`` (a bundled name or a model folder) into folder ``out``.

    ``draft_layers``: residual blocks (``num_draft_layers``; ``config_overrides`` wins).
    ``negatives``: sampled-softmax loss (``RedrafterTask``). ``options`` go to
    ``specdec.training.run.train_drafter`` (budget, data sizes, resume ...).
    """

    def make_task(
        target, seed: int, *, shortlist: np.ndarray | None = None, data=None
    ) -> RedrafterTask:
        config = default_config(
            vocab_size=target.embed_tokens.shape[0],
            hidden_size=target.embed_tokens.shape[1],
            target={
                "name": target.name,
                "fingerprint": target.fingerprint,
                "vocab_size": int(target.embed_tokens.shape[0]),
                "hidden_size": int(target.embed_tokens.shape[1]),
            },
            beam_width=beam_width,
            beam_length=beam_length,
            **{"num_draft_layers": draft_layers, **(config_overrides or {})},
        )
        return RedrafterTask(
            config,
            embed_tokens=target.embed_tokens,
            lm_head=target.lm_head,
            seed=seed,
            negatives=negatives,
            shortlist=shortlist,
        )

    options["run_settings"] = {
        "beam_width": beam_width,
        "beam_length": beam_length,
        "draft_layers": draft_layers,
        "negatives": negatives,
        "config_overrides": config_overrides,
        **options.get("run_settings", {}),
    }
    return train_drafter("redrafter", make_task, model, out, **options)
