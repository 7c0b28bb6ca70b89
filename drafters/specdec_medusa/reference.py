"""Medusa heads in float64 NumPy (Cai et al., "Medusa", arXiv 2401.10774, section 2.1.1).

Head k maps the target's last hidden state h (after the final norm) at the position that
produced the root token to logits over the token k+1 positions after the root:

    x_0 = h
    x_{j+1} = x_j + SiLU(W_{k,j} x_j + b_{k,j})          j = 0..num_layers-1
    logits_k = U_k x_{num_layers}                        U_k: own (V, H) weight, or the LM head

The drafter proposes each head's top-T tokens; a static tree (``specdec_medusa.tree``)
combines them into the candidates the target verifies.
"""

from __future__ import annotations

from typing import Mapping

import numpy as np

from specdec.capabilities import DrafterCaps
from specdec.models.checkpoints import check_weight_shapes

from specdec.types import Draft, DraftContext
from specdec_medusa.config import MedusaConfig, tree_size


def silu(x: np.ndarray) -> np.ndarray:
    """x * sigmoid(x), float64, written to avoid overflow for large |x|."""
    return x * (0.5 * (1.0 + np.tanh(0.5 * x)))


def check_weights(config: MedusaConfig, weights: Mapping[str, np.ndarray]) -> None:
    """Raise ValueError unless ``weights`` has exactly the names and shapes ``config`` expects."""
    check_weight_shapes(
        config.weight_shapes(),
        weights,
        label="Medusa",
        settings=f"num_heads={config.num_heads}, num_layers={config.num_layers}, "
        f"head={config.head!r}",
    )


def _check_lm_head(config: MedusaConfig, lm_head) -> np.ndarray | None:
    if lm_head is None:
        if config.head == "tied":
            raise ValueError(
                "a Medusa drafter with head='tied' needs the target's lm_head (V, H); pass lm_head="
            )
        return None
    lm_head = np.asarray(lm_head, dtype=np.float64)
    if lm_head.shape != (config.vocab_size, config.hidden_size):
        raise ValueError(
            f"lm_head has shape {lm_head.shape}, expected (vocab_size, hidden_size) = "
            f"{(config.vocab_size, config.hidden_size)}"
        )
    return lm_head


def head_logits(
    config: MedusaConfig,
    weights: Mapping[str, np.ndarray],
    lm_head: np.ndarray | None,
    hidden: np.ndarray,
) -> np.ndarray:
    """Logits of every head. hidden (B, H) -> (B, K, V) float64.

    ``lm_head`` (V, H) is the target's output projection, needed when ``config.head == "tied"``
    and ignored otherwise.
    """
    hidden = np.asarray(hidden, dtype=np.float64)
    if hidden.ndim != 2 or hidden.shape[1] != config.hidden_size:
        raise ValueError(f"hidden must have shape (B, {config.hidden_size}), got {hidden.shape}")
    lm_head = _check_lm_head(config, lm_head)
    logits = np.empty((hidden.shape[0], config.num_heads, config.vocab_size))  # (B, K, V)
    for k in range(config.num_heads):
        x = hidden  # (B, H)
        # Residual SiLU blocks: x <- x + SiLU(W x + b).
        for j in range(config.num_layers):
            weight = np.asarray(weights[f"medusa_head.{k}.{j}.linear.weight"], dtype=np.float64)
            bias = np.asarray(weights[f"medusa_head.{k}.{j}.linear.bias"], dtype=np.float64)
            x = x + silu(x @ weight.T + bias)
        # Vocabulary projection: the head's own, or the target's LM head.
        if config.head == "full":
            projection = np.asarray(
                weights[f"medusa_head.{k}.{config.num_layers}.weight"], dtype=np.float64
            )
        else:
            projection = lm_head
        logits[:, k, :] = x @ projection.T
    return logits


def top_tokens(logits: np.ndarray, top_t: int) -> np.ndarray:
    """The ``top_t`` highest logits' token ids, best first, equal logits in ascending id order.

    logits (..., V) -> (..., T) int64.
    """
    order = np.argsort(-np.asarray(logits, dtype=np.float64), axis=-1, kind="stable")
    return order[..., :top_t].astype(np.int64)


def init_random_weights(config: MedusaConfig, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """Random float64 weights with decisive logits, for tests and demos.

    For a hidden state with entries of order 1 (as after an RMS norm), the full heads give
    logits with standard deviation ~4, so the top tokens are separated by clear gaps; the
    residual blocks stay close to the identity, as trained Medusa heads start.
    """
    h, v = config.hidden_size, config.vocab_size
    weights: dict[str, np.ndarray] = {}
    for k in range(config.num_heads):
        for j in range(config.num_layers):
            weights[f"medusa_head.{k}.{j}.linear.weight"] = rng.normal(
                0.0, 0.5 / np.sqrt(h), size=(h, h)
            )
            weights[f"medusa_head.{k}.{j}.linear.bias"] = rng.normal(0.0, 0.1, size=(h,))
        if config.head == "full":
            weights[f"medusa_head.{k}.{config.num_layers}.weight"] = rng.normal(
                0.0, 4.0 / np.sqrt(h), size=(v, h)
            )
    return weights


class MedusaDrafter:
    """Satisfies ``specdec.protocols.Drafter`` with the float64 reference heads.

    config: the heads' ``MedusaConfig``; weights: name -> array (see ``specdec_medusa.config``);
    lm_head (V, H): the target's LM head, required when ``config.head == "tied"``; top_t: T,
    overriding ``config.top_t``. The drafter is stateless across steps.

    ``tree_builder`` names the registered tree builder and its options that turn this
    drafter's proposals into a tree: ``("medusa_tree", {"choices": config.choices})``.
    """

    def __init__(
        self,
        config: MedusaConfig,
        weights: Mapping[str, np.ndarray],
        *,
        lm_head: np.ndarray | None = None,
        top_t: int | None = None,
    ):
        check_weights(config, weights)
        top_t = config.top_t if top_t is None else top_t
        if (
            isinstance(top_t, bool)
            or not isinstance(top_t, int)
            or not 1 <= top_t <= config.vocab_size
        ):
            raise ValueError(
                f"top_t must be an integer in [1, vocab_size={config.vocab_size}], got {top_t!r}"
            )
        self.config = config
        self.weights = {
            name: np.asarray(array, dtype=np.float64) for name, array in weights.items()
        }
        self.lm_head = _check_lm_head(config, lm_head)
        self.top_t = top_t
        self.caps = DrafterCaps(
            tree_builder=("medusa_tree", {"choices": config.choices}),
            max_tree_size=tree_size(config),
        )

    def propose(self, context: DraftContext) -> Draft:
        """Each head's top-T tokens: ``head_tokens`` (B, K, T) int64, best first."""
        logits = head_logits(self.config, self.weights, self.lm_head, context.hidden)  # (B, K, V)
        return Draft(root_tokens=context.root_tokens, head_tokens=top_tokens(logits, self.top_t))
