"""The alternatives users would pick instead, timed the same way: transformers' ``generate()``
(plain, prompt-lookup, assisted) and mlx-lm's generation (plain, draft model)."""

from __future__ import annotations

import time
from typing import Callable

from specdec.bench.methods import Method
from specdec.models.bundled import resolve_model
from specdec.models.hf_loading import from_pretrained_quietly
from specdec.errors import require


def peer_runner(
    method: Method, model, target, dtype: str | None, max_new_tokens: int
) -> Callable[..., dict]:
    """A callable(prompt ids, temperature, seed) -> measurements for a peer method."""
    if method.kind.startswith("hf"):
        return _hf_runner(method, model, target, dtype, max_new_tokens)
    return _mlx_lm_runner(method, model, target, max_new_tokens)


def _hf_runner(method: Method, model, target, dtype, max_new_tokens):
    torch = require("torch", extra="torch", feature="the transformers baselines")
    transformers = require("transformers", extra="torch", feature="the transformers baselines")
    # transformers' own default, as users get it
    own = method.options.get("dtype", dtype) in (
        "own",
        None,
    )
    dtype_arg = {} if own else {"dtype": getattr(torch, method.options.get("dtype", dtype))}
    load = lambda source: from_pretrained_quietly(
        transformers, resolve_model(source), **dtype_arg
    ).eval()
    hf_model = load(model)
    eos = list(getattr(target, "eos_token_ids", ())) or None
    options = dict(max_new_tokens=max_new_tokens, eos_token_id=eos, pad_token_id=(eos or [0])[0])
    if method.kind == "hf-pld":
        options["prompt_lookup_num_tokens"] = int(
            method.options.get("prompt_lookup_num_tokens", 10)
        )
    if method.kind == "hf-assisted":
        options["assistant_model"] = load(method.options["draft_model"])

    def run(ids: list[int], temperature: float, seed: int) -> dict:
        torch.manual_seed(seed)
        sampling = (
            dict(do_sample=False)
            if temperature == 0
            else dict(do_sample=True, temperature=temperature, top_k=0, top_p=1.0)
        )
        input_ids = torch.tensor([ids])
        start = time.perf_counter()
        with torch.inference_mode():
            out = hf_model.generate(
                input_ids, attention_mask=torch.ones_like(input_ids), **options, **sampling
            )
        seconds = time.perf_counter() - start
        return dict(
            new_tokens=int(out.shape[1] - len(ids)),
            seconds=seconds,
            tokens=tuple(out[0, len(ids) :].tolist()),
        )

    return run


def _mlx_lm_runner(method: Method, model, target, max_new_tokens):
    mx = require("mlx.core", extra="mlx", feature="the mlx-lm baselines")
    mlx_lm = require("mlx_lm", extra="mlx", feature="the mlx-lm baselines")
    from mlx_lm.sample_utils import make_sampler  # optional: mlx_lm (mlx extra)

    lm, tokenizer = mlx_lm.load(str(resolve_model(model)))
    draft = (
        mlx_lm.load(str(resolve_model(method.options["draft_model"])))[0]
        if method.kind == "mlx-lm-draft"
        else None
    )

    def run(ids: list[int], temperature: float, seed: int) -> dict:
        mx.random.seed(seed)
        tokens = []
        start = time.perf_counter()
        for response in mlx_lm.stream_generate(
            lm,
            tokenizer,
            ids,
            max_tokens=max_new_tokens,
            draft_model=draft,
            sampler=make_sampler(temp=temperature),
        ):
            tokens.append(int(response.token))
        seconds = time.perf_counter() - start
        return dict(new_tokens=len(tokens), seconds=seconds, tokens=tuple(tokens))

    return run
