"""What ``torch.compile`` would buy on the default path's two per-step pieces of work, measured.

1. ReDrafter's beam search (W=2, L=3, the shipped SmolLM2-135M checkpoint, with its weights in
   the target's dtype and in int8 as measured), eager against ``torch.compile(dynamic=False)``,
   with the caches warm and with them evicted before each call (as after a target forward).
2. The target's decoder-layer math for one token (RMSNorm, the packed q/k/v, rotary, o, gate/up
   and down products, residuals; attention, the KV cache and the LM head left out), 30 layers in
   a row, eager against compiled.

Prints the compile times and the medians (ms). Run from the repository root:

    OMP_NUM_THREADS=2 python benchmarks/compile_costs.py
"""

from __future__ import annotations

import time

import numpy as np
import torch
import torch.nn.functional as F

import specdec
from decode_timing import median_seconds
from specdec_redrafter.checkpoint import load_redrafter_checkpoint
from specdec_redrafter.torch import RedrafterModule
from specdec_torch.layers import apply_rotary, rms_norm

CHECKPOINT = "drafters/specdec_redrafter/weights/smollm2-135m"


def ms(run, repeats: int = 100) -> float:
    return round(median_seconds(run, repeats) * 1e3, 3)


def cold_ms(run, eviction: torch.Tensor, repeats: int = 50) -> float:
    """Median ms of ``run()`` with the caches evicted (outside the timing) before each call."""
    times = []
    for _ in range(repeats):
        eviction.add_(1)
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return round(float(np.median(times)) * 1e3, 3)


def compiled(function, first_call) -> tuple:
    """(``torch.compile(function)``, seconds its first call ``first_call(compiled)`` took: the
    compile)."""
    fast = torch.compile(function, dynamic=False)
    start = time.perf_counter()
    first_call(fast)
    return fast, round(time.perf_counter() - start, 1)


def beam_search(target, int8: bool | None) -> dict:
    config, weights = load_redrafter_checkpoint(CHECKPOINT)
    module = RedrafterModule(
        config, weights, embed_tokens=target.embed_tokens, lm_head=target.lm_head, int8=int8
    )
    hidden, roots = torch.randn(1, config.hidden_size, dtype=target.dtype), torch.tensor([42])
    search = (  # noqa: E731
        lambda fn: lambda: fn(hidden, roots, width=2, length=3, keep_log_probs=False)
    )
    eviction = torch.randn(32_000_000, dtype=target.dtype)  # 64 MB, more than the caches
    search(module.beam_search)()  # int8=None: the measured choices are made eagerly first
    fast, seconds = compiled(module.beam_search, lambda fn: search(fn)())
    out = {"compile_s": seconds}
    assert torch.equal(search(fast)()[0], search(module.beam_search)()[0]), "compiled beams differ"
    for label, fn in (("eager", module.beam_search), ("compiled", fast)):
        out[f"{label} warm"] = ms(search(fn), 50)
        out[f"{label} cold"] = cold_ms(search(fn), eviction)
    return out


def layer_math(target) -> dict:
    cfg = target.config
    heads, kv_heads, dim = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
    group = heads // kv_heads

    def layer(x, cos, sin, qkv, o, gate_up, down, norm1, norm2):
        h = rms_norm(x, norm1, cfg.rms_norm_eps)
        q, k, v = F.linear(h, qkv).split([heads * dim, kv_heads * dim, kv_heads * dim], dim=-1)
        q = apply_rotary(q.view(1, 1, heads, dim).transpose(1, 2), cos, sin)
        k = apply_rotary(k.view(1, 1, kv_heads, dim).transpose(1, 2), cos, sin)
        mixed = q.transpose(1, 2).reshape(1, -1) + (k.transpose(1, 2).reshape(1, -1) + v).repeat(
            1, group
        )  # no attention
        x = x + F.linear(mixed, o)
        gate, up = F.linear(rms_norm(x, norm2, cfg.rms_norm_eps), gate_up).chunk(2, dim=-1)
        return x + F.linear(F.silu(gate) * up, down)

    weights = [
        (
            packed[0],
            mod.self_attn.o_proj.weight,
            packed[2],
            mod.mlp.down_proj.weight,
            mod.input_layernorm.weight,
            mod.post_attention_layernorm.weight,
        )
        for packed, mod in zip(target._packed, target._layers)
    ]
    cos, sin = (torch.randn(1, 1, 1, dim, dtype=target.dtype) for _ in range(2))

    def run(fn):
        x = torch.randn(1, cfg.hidden_size, dtype=target.dtype)
        for w in weights:
            x = fn(x, cos, sin, *w)
        return x

    fast, seconds = compiled(layer, run)
    out = {"compile_s": seconds}
    eager, quick = [], []
    for _ in range(3):  # interleaved rounds
        eager.append(ms(lambda: run(layer), 30))
        quick.append(ms(lambda: run(fast), 30))
    out.update(
        {"eager 30 layers": float(np.median(eager)), "compiled 30 layers": float(np.median(quick))}
    )
    return out


def main() -> None:
    target = specdec.load("smollm2-135m", backend="torch")
    print("dtype", target.dtype, "threads", torch.get_num_threads())
    with torch.inference_mode():
        for int8 in (False, None):
            print(f"beam search ms, int8={int8}", beam_search(target, int8), flush=True)
        print("layer math ms", layer_math(target), flush=True)


if __name__ == "__main__":
    main()
