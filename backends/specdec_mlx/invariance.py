"""The MLX target's self-test of exact mode (``specdec.tuning.exactness``), as
``specdec_torch.invariance`` does for torch: on random inputs of the target's own shapes and dtype,
each product of layer 0 (q, k, v and o projections, the MLP) and the LM head must give rows of calls
of 1, 2, 3, 5, 8, 17 and 64 rows the bits of the same rows in one larger call; RMSNorm likewise; and
attention (split form) a query alone the bits of the same query as a node deep in a tree's second
beam, beside a row of another length. Which BLAS MLX runs on decides much of it on a Linux CPU (the
wheel's reference BLAS computes each row alone; OpenBLAS blocks rows), so it is part of the key.
"""

from __future__ import annotations

import mlx.core as mx
import numpy as np

from specdec.tuning.exactness import InvarianceCheck, cached_check
from specdec_mlx.blas import _state
from specdec_mlx.device import describe_device
from specdec_mlx.exact import TAIL, attend_split, split_order

__all__ = ["check_row_invariance", "check_target_kernels"]

SMALL_ROWS = (1, 2, 3, 5, 8, 17)
COVERED = 48
LARGE_ROWS = (64,)
LAYER_ROWS = 160  # a prompt chunk (128) and trees beside it
HEAD_ROWS = 96


def _equal(a: mx.array, b: mx.array) -> bool:
    return bool(np.array_equal(np.array(a.astype(mx.float32)), np.array(b.astype(mx.float32))))


def _rows_agree(product, inputs: mx.array) -> bool:
    whole = product(inputs)
    for rows in SMALL_ROWS:
        for start in range(0, min(COVERED, inputs.shape[0]) - rows + 1, rows):
            if not _equal(product(inputs[start : start + rows]), whole[start : start + rows]):
                return False
    return all(
        _equal(product(inputs[:rows]), whole[:rows])
        for rows in LARGE_ROWS
        if rows < inputs.shape[0]
    )


def _random(shape, dtype, seed: int) -> mx.array:
    return mx.array(np.random.default_rng(seed).standard_normal(shape).astype(np.float32)).astype(
        dtype
    )


def _attention_agrees(target) -> bool:
    cfg, dtype = target.config, target.dtype
    heads, kv_heads, dim = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
    length, nodes, parents = 150, 9, [-1, 0, 1, 2, 3, 0, 5, 6, 7]
    size, path = length + nodes, [0, 5, 6, 7, 8]
    keys = np.array(_random((2, 2, kv_heads, size + 8, dim), dtype, 1).astype(mx.float32))
    plain = keys.copy()  # row 1: the path at the plain layout (its nodes at consecutive positions)
    for depth, node in enumerate(path):
        plain[:, 1, :, length + depth] = keys[:, 0, :, length + node]
    plain[:, 1, :, :length] = keys[:, 0, :, :length]
    cache = mx.array(plain).astype(dtype)
    mask = np.zeros((2, 1, nodes, size), dtype=bool)
    mask[0, 0, :, :length] = True
    for i in range(nodes):
        j = i
        while j >= 0:
            mask[0, 0, i, length + j] = True
            j = parents[j]
    mask[1, 0, :, :60] = True  # a shorter row beside it
    queries = _random((2, heads, nodes, dim), dtype, 2)
    tree_keys = mx.array(keys).astype(dtype)
    tree = attend_split(
        queries,
        tree_keys[0, :, :, :size],
        tree_keys[1, :, :, :size],
        split_order(mx.array(mask)),
        target._scale,
    )[0]
    for depth, node in enumerate(path):
        alone = np.zeros((1, 1, 1, length + depth + 1 + 5), dtype=bool)
        alone[..., : length + depth + 1] = True  # trailing slots outside the query's keys
        width = alone.shape[-1]
        out = attend_split(
            queries[:1, :, node : node + 1],
            cache[0, 1:2, :, :width],
            cache[1, 1:2, :, :width],
            split_order(mx.array(alone)),
            target._scale,
        )
        if not _equal(out[0, 0], tree[node]):
            return False
    return True


def check_target_kernels(target) -> InvarianceCheck:
    """Run the checks now (module docstring)."""
    layer = target._layers[0]
    attention = layer.self_attn
    products = [
        (f"{name} projection", getattr(attention, f"{name}_proj")) for name in ("q", "k", "v", "o")
    ]
    products += [("MLP", layer.mlp), ("LM head", target._head)]
    checked = []
    for seed, (name, module) in enumerate(products):
        width = (
            target.config.num_attention_heads * target.config.head_dim
            if name == "o projection"
            else target.hidden_size
        )
        rows = HEAD_ROWS if name == "LM head" else LAYER_ROWS
        checked.append(name)
        if not _rows_agree(
            lambda x, m=module: target.exact_product(m, x),
            _random((rows, width), target.dtype, seed),
        ):
            return InvarianceCheck(holds=False, failed=name, checked=tuple(checked))
    checked.append("RMSNorm")
    if not _rows_agree(
        layer.input_layernorm, _random((LAYER_ROWS, target.hidden_size), target.dtype, 9)
    ):
        return InvarianceCheck(holds=False, failed="RMSNorm", checked=tuple(checked))
    checked.append("attention (split)")
    if not _attention_agrees(target):
        return InvarianceCheck(holds=False, failed="attention (split)", checked=tuple(checked))
    return InvarianceCheck(holds=True, checked=tuple(checked))


def check_row_invariance(target) -> InvarianceCheck:
    """``check_target_kernels``, cached per machine, software, BLAS, dtype and shapes."""
    cfg = target.config
    key = {
        "backend": "mlx",
        "device": describe_device(None),
        "dtype": str(target.dtype),
        "blas": str(_state.get("loaded")),
        "tail": TAIL,
        "padding": "min_rows",
        "shapes": [
            target.hidden_size,
            cfg.intermediate_size,
            cfg.num_attention_heads,
            cfg.num_key_value_heads,
            cfg.head_dim,
            target.vocab_size,
            type(target._layers[0].self_attn.q_proj).__name__,
        ],
    }
    return cached_check(key, lambda: check_target_kernels(target))
