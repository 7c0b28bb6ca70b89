"""The torch target's self-test of exact mode (``specdec.tuning.exactness``): do this machine's
kernels give each row the same bits alone and among other rows?

Exact mode (``specdec_torch.exact``) relies on measured kernel behaviour: a product of two or
more rows rounds each row the same way whatever the row count (a one-row product is computed as
two), row-wise operations (norms, SiLU, rotary) are per row, and the attention form is per query.
Each is run here on random inputs of the target's own shapes and dtype, on its device, once per
machine and software (``specdec.tuning.exactness.cached_check``), and compared bitwise:

- every product of a decoder layer (with layer 0's weights) and the LM head: rows of calls of
  1, 2, 3, 5, 8, 17, 64 and more rows against the same rows of one larger call;
- RMSNorm, SiLU times the up projection and rotary embeddings: a few rows against many;
- attention: a query alone against the same query as a node deep in the second beam of a tree,
  beside other rows of other lengths, in the form this process uses (kernel or split).

The products compare about 40 thousand outputs per weight, enough to see the one output in
several thousand that differed for a one-row product before it was computed as two.
"""

from __future__ import annotations

import hashlib
from typing import Callable

import torch

from specdec.tuning.exactness import InvarianceCheck, cached_check
from specdec_torch.device import describe_device
from specdec_torch.exact import (
    TAIL,
    attend_kernel,
    attend_split,
    in_row_blocks,
    linear_rows,
    plan_kernel,
    split_order,
)
from specdec_torch.kernels import SOURCE
from specdec_torch.layers import apply_rotary, rms_norm, rotary_cos_sin
from specdec_torch.products import head_product

__all__ = ["check_row_invariance", "check_target_kernels"]

SMALL_ROWS = (1, 2, 3, 5, 8, 17)  # calls of these many rows, covering COVERED rows each
COVERED = 48
LARGE_ROWS = (64, 200)  # and one call of the first rows, up to the largest forward checked
LAYER_ROWS = 576  # rows of the reference call for layer products: a prompt chunk and a tree
HEAD_ROWS = 128  # for the LM head (its rows: tree nodes and the last token of each chunk)
# Where products are not invariant in one call, the blocks of rows tried, largest first (oneDNN's
# AMX kernels on two threads keep each row's bits up to 32 rows a call)
ROW_BLOCKS = (64, 32, 16, 8)


def _rows_agree(product: Callable[[torch.Tensor], torch.Tensor], inputs: torch.Tensor) -> bool:
    """Each call of ``product`` on a slice of ``inputs`` gives the same rows as one call on all."""
    whole = product(inputs)
    for rows in SMALL_ROWS:
        for start in range(0, min(COVERED, len(inputs)) - rows + 1, rows):
            if not torch.equal(product(inputs[start : start + rows]), whole[start : start + rows]):
                return False
    return all(
        torch.equal(product(inputs[:rows]), whole[:rows])
        for rows in LARGE_ROWS
        if rows < len(inputs)
    )


def _products(target) -> list[tuple[str, torch.Tensor, torch.Tensor | None, int]]:
    """(name, weight, bias, rows checked) of layer 0's products and the LM head."""
    layer = target._layers[0]
    attention, mlp = layer.self_attn, layer.mlp
    if target._packed is not None:
        qkv, qkv_bias, gate_up, gate_up_bias = target._packed[0]
        products = [
            ("q/k/v projection", qkv, qkv_bias),
            ("gate/up projection", gate_up, gate_up_bias),
        ]
    else:
        products = [
            (
                f"{name} projection",
                getattr(attention, f"{name}_proj").weight,
                getattr(attention, f"{name}_proj").bias,
            )
            for name in ("q", "k", "v")
        ]
        products += [
            (
                f"{name} projection",
                getattr(mlp, f"{name}_proj").weight,
                getattr(mlp, f"{name}_proj").bias,
            )
            for name in ("gate", "up")
        ]
    products += [
        ("o projection", attention.o_proj.weight, attention.o_proj.bias),
        ("down projection", mlp.down_proj.weight, mlp.down_proj.bias),
    ]
    return [(name, w, b, LAYER_ROWS) for name, w, b in products] + [
        ("LM head", target.lm_head, None, HEAD_ROWS)
    ]


def _attention_agrees(target, generator: torch.Generator) -> bool:
    """A query alone equals the same query as a node of a tree in the second beam, beside a row of
    another length, in this target's exact attention form."""
    cfg, dtype, device = target.config, target.dtype, target.device
    heads, kv_heads, dim = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
    length, nodes = 300, 9  # committed positions; tree: root, a 4-node decoy beam, then the path
    size = length + nodes
    cache = torch.randn((2, 3, kv_heads, size + 8, dim), generator=generator).to(
        dtype=dtype, device=device
    )
    path = [0, 5, 6, 7, 8]  # root then the second beam: its nodes sit after the decoy's
    # slot 1 holds, at the plain layout, what slot 0's tree holds
    for depth, node in enumerate(path):
        cache[:, 1, :, length + depth] = cache[:, 0, :, length + node]
    cache[:, 1, :, :length] = cache[:, 0, :, :length]
    queries = torch.randn((1, heads, nodes, dim), generator=generator).to(
        dtype=dtype, device=device
    )
    parents = [-1, 0, 1, 2, 3, 0, 5, 6, 7]
    tree_mask = torch.zeros((1, 1, nodes, size), dtype=torch.bool, device=device)
    tree_mask[..., :length] = True
    for i in range(nodes):
        j = i
        while j >= 0:
            tree_mask[0, 0, i, length + j] = True
            j = parents[j]
    other = torch.zeros((1, 1, nodes, size), dtype=torch.bool, device=device)
    other[..., :120] = True  # a shorter row beside it
    mask = torch.cat([tree_mask, other])
    both = torch.cat(
        [queries, torch.randn(queries.shape, generator=generator).to(dtype=dtype, device=device)]
    )
    tree = _attend(target, both, cache, torch.tensor([0, 2], device=device), mask)[0]
    for depth, node in enumerate(path):
        alone_mask = torch.zeros((1, 1, 1, length + depth + 1 + 7), dtype=torch.bool, device=device)
        alone_mask[..., : length + depth + 1] = True  # trailing slots outside the query's keys
        alone = _attend(
            target,
            queries[:, :, node : node + 1],
            cache,
            torch.tensor([1], device=device),
            alone_mask,
        )
        if not torch.equal(alone[0, 0], tree[node]):
            return False
    return True


def _attend(target, query, cache, rows, mask) -> torch.Tensor:
    if target.exact_form == "kernel":
        return attend_kernel(target._kernel, query, cache[0], cache[1], plan_kernel(mask, rows))
    size = mask.shape[-1]
    keys, values = cache[0][rows][:, :, :size], cache[1][rows][:, :, :size]
    return attend_split(query, keys, values, split_order(mask))


def _failed_product(target, block: int | None, checked: list[str]) -> str | None:
    """The first of the target's products (``_products``) whose rows are not invariant when
    computed in calls of at most ``block`` rows (None: any), in words; None when all are.
    Appends what it checks to ``checked``."""
    generator = torch.Generator().manual_seed(0)
    for name, weight, bias, rows in _products(target):
        inputs = torch.randn((rows, weight.shape[1]), generator=generator)
        inputs = inputs.to(weight.dtype).to(weight.device)
        if name == "LM head":
            row_product = lambda x, w=weight: head_product(x, w, exact=True)  # noqa: E731
        else:
            row_product = lambda x, w=weight, b=bias: linear_rows(x, w, b)  # noqa: E731
        label = f"{name} {tuple(weight.shape)}"
        checked.append(label)
        if not _rows_agree(lambda x, p=row_product: in_row_blocks(p, x, block), inputs):
            return label
    return None


def _labels(target) -> list[str]:
    return [f"{name} {tuple(weight.shape)}" for name, weight, _, _ in _products(target)]


def check_target_kernels(target) -> InvarianceCheck:
    """Run the checks now (module docstring) with ``target.exact`` on; restores it after."""
    generator = torch.Generator().manual_seed(0)
    checked: list[str] = []
    was = target.exact
    target.exact = True
    try:
        with torch.inference_mode():
            products: list[str] = []
            failed, block = _failed_product(target, None, products), None
            if failed is not None:  # the largest block of rows that keeps them, if any
                fits = (size for size in ROW_BLOCKS if _failed_product(target, size, []) is None)
                block = next(fits, None)
                if block is None:
                    return InvarianceCheck(holds=False, failed=failed, checked=tuple(products))
                products = [
                    f"{label} in calls of at most {block} rows" for label in _labels(target)
                ]
            checked += products
            hidden = target.hidden_size
            x = (
                torch.randn((LAYER_ROWS, hidden), generator=generator)
                .to(target.dtype)
                .to(target.device)
            )
            norm = target._layers[0].input_layernorm.weight
            row_ops = {
                "RMSNorm": lambda rows: rms_norm(rows, norm, target.config.rms_norm_eps),
                "SiLU times up": lambda rows: torch.nn.functional.silu(rows) * rows.flip(-1),
            }
            for name, op in row_ops.items():
                checked.append(name)
                if not _rows_agree(op, x):
                    return InvarianceCheck(holds=False, failed=name, checked=tuple(checked))
            checked.append("rotary embedding")
            dim, heads = target.config.head_dim, target.config.num_attention_heads
            positions = torch.arange(LAYER_ROWS, device=target.device)[None]
            cos, sin = rotary_cos_sin(positions, target._inv_freq, target.dtype)
            q = (
                torch.randn((1, heads, LAYER_ROWS, dim), generator=generator)
                .to(target.dtype)
                .to(target.device)
            )
            whole = apply_rotary(q, cos, sin)
            for start, rows in ((0, 1), (7, 1), (3, 5), (40, 17)):
                part = apply_rotary(
                    q[:, :, start : start + rows],
                    cos[:, :, start : start + rows],
                    sin[:, :, start : start + rows],
                )
                if not torch.equal(part, whole[:, :, start : start + rows]):
                    return InvarianceCheck(
                        holds=False, failed="rotary embedding", checked=tuple(checked)
                    )
            checked.append(f"attention ({target.exact_form})")
            if not _attention_agrees(target, generator):
                return InvarianceCheck(
                    holds=False, failed=f"attention ({target.exact_form})", checked=tuple(checked)
                )
    finally:
        target.exact = was
    return InvarianceCheck(holds=True, checked=tuple(checked), row_block=block)


def check_row_invariance(target) -> InvarianceCheck:
    """``check_target_kernels``, cached per machine, software, dtype and shapes."""
    was = target.exact
    target.exact = True  # decides the attention form (compiled kernel or torch operations)
    form = target.exact_form
    target.exact = was
    shapes = sorted(str(tuple(w.shape)) for _, w, _, _ in _products(target))
    key = {
        "backend": "torch",
        "device": describe_device(str(target.device)),
        "dtype": str(target.dtype),
        "shapes": shapes,
        "heads": [
            target.config.num_attention_heads,
            target.config.num_key_value_heads,
            target.config.head_dim,
        ],
        "form": form,
        "tail": TAIL,
        "kernel": hashlib.sha256(SOURCE.read_bytes()).hexdigest()[:16]
        if form == "kernel"
        else None,
    }
    return cached_check(key, lambda: check_target_kernels(target))
