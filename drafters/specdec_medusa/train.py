"""Training Medusa heads by distillation from their target (Cai et al. 2024, section 2.2, Medusa-1).

``MedusaNet`` holds the K heads as a trainable ``torch.nn.Module`` whose parameter names are the
checkpoint's (``specdec_medusa.config``), with the reference's math (``specdec_medusa.reference``):

    x_0 = h_t ; x_{j+1} = x_j + SiLU(W_{k,j} x_j + b_{k,j}) ; logits_k = U_k x
    (U_k own, or the LM head)

Head k (0-based) at position t (root x_{t+1}) predicts x_{t+k+2}; its loss is the cross-entropy
against the target's top-k distribution at position t+k+1 (which scores x_{t+k+2}), one loss
per head, summed. Residual blocks start at zero, so every head starts as the target's own LM head.
Held-out evaluation takes each head's top-T tokens with the inference module
(``specdec_medusa.torch.MedusaHeads``) and walks the static tree (``config.choices``).

Shapes: B positions, K heads, V vocab, H hidden.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from specdec.models.checkpoints import save_checkpoint
from specdec.training.evaluate import gather_window, tree_acceptance
from specdec.training.loop import sampled_soft_cross_entropy, soft_cross_entropy
from specdec.training.run import train_drafter
from specdec_medusa.config import MedusaConfig
from specdec_medusa.reference import check_weights
from specdec_medusa.torch import MedusaHeads
from specdec_torch.ops import top_k_lowest_index

__all__ = ["MedusaNet", "MedusaTask", "default_config", "train_medusa"]


class _Block(torch.nn.Module):
    """Residual SiLU block: x <- x + SiLU(linear(x)) (weight names
    ``medusa_head.{k}.{j}.linear.*``)."""

    def __init__(self, width: int):
        super().__init__()
        self.linear = torch.nn.Linear(width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + F.silu(self.linear(x))


class MedusaNet(torch.nn.Module):
    """Trainable Medusa heads. ``state_dict()`` holds exactly ``config.weight_shapes()``.

    target_lm_head (V, H): the target's LM head, a plain attribute (frozen, not saved); needed for
    ``head="tied"`` and used to initialise full heads.
    """

    def __init__(self, config: MedusaConfig, *, target_lm_head: torch.Tensor | None):
        super().__init__()
        if config.head == "tied" and target_lm_head is None:
            raise ValueError("Medusa heads with head='tied' need the target's LM head (V, H)")
        self.config = config
        self.target_lm_head = None if target_lm_head is None else target_lm_head.detach()
        heads = []
        for _ in range(config.num_heads):
            layers: list[torch.nn.Module] = [
                _Block(config.hidden_size) for _ in range(config.num_layers)
            ]
            if config.head == "full":
                layers.append(torch.nn.Linear(config.hidden_size, config.vocab_size, bias=False))
            heads.append(torch.nn.ModuleList(layers))
        self.medusa_head = torch.nn.ModuleList(heads)
        with torch.no_grad():
            for head in self.medusa_head:
                for block in head[: config.num_layers]:
                    block.linear.weight.zero_()
                    block.linear.bias.zero_()
                if config.head == "full" and self.target_lm_head is not None:
                    head[-1].weight.copy_(self.target_lm_head.float())

    def features(self, hidden: torch.Tensor) -> torch.Tensor:
        """Every head's input to its vocabulary projection. hidden (B, H) -> (B, K, H)."""
        outputs = []
        for head in self.medusa_head:
            x = hidden
            for block in head[: self.config.num_layers]:
                x = block(x)
            outputs.append(x)
        return torch.stack(outputs, dim=1)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        """Logits of every head. hidden (B, H) -> (B, K, V)."""
        x = self.features(hidden)  # (B, K, H)
        if self.config.head == "tied":
            return F.linear(x, self.target_lm_head.to(x.dtype))
        return torch.stack([head[-1](x[:, k]) for k, head in enumerate(self.medusa_head)], dim=1)

    def weights(self) -> dict[str, np.ndarray]:
        """Name -> float64 array, the checkpoint's weights."""
        return {
            name: tensor.detach().double().cpu().numpy()
            for name, tensor in self.state_dict().items()
        }

    def load_weights(self, weights: dict[str, Any]) -> None:
        check_weights(self.config, weights)
        # no parameters: tied heads without blocks
        dtype = next(self.parameters(), torch.empty(0)).dtype
        self.load_state_dict(
            {name: torch.as_tensor(np.asarray(a), dtype=dtype) for name, a in weights.items()}
        )


def default_config(*, vocab_size: int, hidden_size: int, target: dict, **overrides) -> MedusaConfig:
    """The recipe for small targets: K=4 tied heads of one residual block, the ``cpu16`` tree."""
    fields = dict(
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        num_heads=4,
        num_layers=1,
        head="tied",
        top_t=8,
        choices="cpu16",
        target=target,
    )
    fields.update(overrides)
    return MedusaConfig(**fields)


class MedusaTask:
    """Medusa for ``specdec.training.loop.train``: D = K, head k trained on step k+1.

    negatives: when set (tied heads only), the loss's softmax normaliser is estimated on the
    batch's label tokens plus that many sampled tokens (``sampled_soft_cross_entropy``).
    """

    def __init__(
        self, config: MedusaConfig, *, lm_head: torch.Tensor | None, negatives: int | None = None
    ):
        if negatives and config.head != "tied":
            raise ValueError("the sampled-softmax loss (negatives=) needs tied Medusa heads")
        self.config = config
        self.negatives = negatives
        self.module = MedusaNet(config, target_lm_head=None if lm_head is None else lm_head.float())
        self.depth = config.num_heads  # the window reaches x_{t+K+1}, head K-1's token
        self._inference = None

    def loss(self, window, generator: torch.Generator | None = None) -> torch.Tensor:
        self._inference = None
        if self.negatives and generator is not None:
            features = self.module.features(window.hidden.float())  # (B, K, H)
            return sampled_soft_cross_entropy(
                features,
                self.module.target_lm_head,
                window.label_ids,
                window.label_probs,
                window.valid,
                negatives=self.negatives,
                generator=generator,
            )
        # (B, K, V): head k scores x_{t+k+2}, window step k+1
        logits = self.module(window.hidden.float())
        return soft_cross_entropy(logits, window.label_ids, window.label_probs, window.valid)

    def accept(self, data, indices: torch.Tensor) -> torch.Tensor:
        """Each head's top-T by the inference module; deepest tree path matching the
        continuation."""
        if self._inference is None:
            self._inference = MedusaHeads(
                self.config,
                self.module.weights(),
                lm_head=self.module.target_lm_head,
                dtype=torch.float32,
                device=torch.device("cpu"),
            )
        window = gather_window(data, indices, self.depth, labels=False)
        logits = self._inference(window.hidden.float())  # (B, K, V)
        batch, heads, vocab = logits.shape
        _, tokens = top_k_lowest_index(logits.reshape(batch * heads, vocab), self.config.top_t)
        head_tokens = tokens.reshape(batch, heads, self.config.top_t)
        # window.tokens[:, 1:] holds x_{t+2} .. x_{t+K+1}: head k's node must equal x_{t+k+2}.
        return tree_acceptance(
            head_tokens, self.config.resolved_choices, window.tokens[:, 1:], window.valid
        )

    def save(self, folder: Path, *, dtype=np.float32) -> Path:
        return save_checkpoint(folder, self.config.to_dict(), self.module.weights(), dtype=dtype)


def train_medusa(
    model, out, *, config_overrides: dict | None = None, negatives: int | None = None, **options
) -> dict:
    """Distil Medusa heads for ``model`` (a bundled name or a model folder) into folder ``out``.

    ``negatives``: sampled-softmax loss (``MedusaTask``). ``options`` go to
    ``specdec.training.run.train_drafter`` (budget, data sizes, resume ...).
    """

    def make_task(target, seed: int, *, shortlist=None, data=None) -> MedusaTask:
        if shortlist is not None:
            raise ValueError(
                "vocabulary shortlists are built for ReDrafter only; train Medusa with shortlist=0"
            )
        vocab, hidden = (int(n) for n in target.embed_tokens.shape)
        config = default_config(
            vocab_size=vocab,
            hidden_size=hidden,
            target={
                "name": target.name,
                "fingerprint": target.fingerprint,
                "vocab_size": vocab,
                "hidden_size": hidden,
            },
            **(config_overrides or {}),
        )
        return MedusaTask(config, lm_head=target.lm_head, negatives=negatives)

    options["run_settings"] = {
        "negatives": negatives,
        "config_overrides": config_overrides,
        **options.get("run_settings", {}),
    }
    return train_drafter("medusa", make_task, model, out, **options)
