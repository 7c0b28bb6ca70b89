"""End-to-end decoding on the torch backend: same tokens as the numpy reference (greedy and
seeded sampling), greedy parity with transformers' own generate(), self-drafting, bfloat16."""

from __future__ import annotations

import os

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

torch = pytest.importorskip("torch")  # required when SPECDEC_TEST_BACKENDS names torch (conftest)

import specdec
from specdec.testing import (
    OracleDrafter,
    checks,
    greedy_continuations,
    make_random_drafter,
    make_random_model,
)
from specdec_torch.backend import TorchBackend

DEVICE = os.environ.get("SPECDEC_TORCH_DEVICE", "cpu")
PROMPTS = [[3], [9, 8, 7, 6, 5, 4], [11, 12]]


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """Random llama and qwen2 targets with a ReDrafter (tied and full head) and a Medusa each."""
    root = tmp_path_factory.mktemp("torch_generate")
    shape = dict(vocab_size=96, hidden_size=32, num_layers=2, num_heads=4, num_kv_heads=2)
    out = {}
    for arch, seed in (("llama", 11), ("qwen2", 12)):
        model = make_random_model(root / arch, seed=seed, architecture=arch, **shape)
        out[arch] = {
            "model": model,
            "none": "none",
            "redrafter": make_random_drafter(
                root / f"{arch}_rd", model, kind="redrafter", seed=seed + 1
            ),
            "redrafter_full": make_random_drafter(
                root / f"{arch}_rdf",
                model,
                kind="redrafter",
                seed=seed + 2,
                head="full",
                num_draft_layers=2,
                rnn_variant="trtllm",
            ),
            "medusa": make_random_drafter(root / f"{arch}_md", model, kind="medusa", seed=seed + 3),
        }
    return out


DRAFTERS = ["none", "redrafter", "redrafter_full", "medusa"]


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
@pytest.mark.parametrize("drafter", DRAFTERS)
def test_same_tokens_as_numpy_greedy_and_sampled_float64(world, arch, drafter):
    """float64: every drafter emits the reference's tokens, greedy and with the same seed."""
    model, path = world[arch]["model"], world[arch][drafter]
    for options in (
        {},
        dict(temperature=0.8, seed=3),
        dict(temperature=1.2, top_k=6, top_p=0.9, seed=[4, 5, 6]),
    ):
        checks.check_generation(
            "torch", model, path, prompts=PROMPTS, dtype="float64", max_new_tokens=10, **options
        )


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
@pytest.mark.parametrize(
    "drafter, extra",
    [("lookup", dict(draft_length=3, min_ngram=1)), ("redrafter", dict(lookup=True))],
)
def test_lookup_gives_the_same_tokens_as_numpy_float64(world, arch, drafter, extra):
    """Prompt lookup alone and beside ReDrafter: host-side n-gram drafts joined to torch beams."""
    model, path = world[arch]["model"], world[arch].get(drafter, drafter)
    prompts = [[1, 2, 3, 1, 2, 3, 1, 2], [4], [5, 6, 5, 6, 5]]
    for options in ({}, dict(temperature=0.8, seed=3)):
        checks.check_generation(
            "torch",
            model,
            path,
            prompts=prompts,
            dtype="float64",
            max_new_tokens=12,
            **extra,
            **options,
        )


@pytest.mark.parametrize(
    "options",
    [
        dict(sample=True),
        dict(sample=True, verifier="exact"),
        dict(verifier="redrafter_published"),
        dict(verifier="typical"),
        dict(verifier="rejection", sample=True, beam_width=3, beam_length=5),
    ],
)
def test_same_tokens_as_numpy_for_every_verifier(world, options):
    checks.check_generation(
        "torch",
        world["llama"]["model"],
        world["llama"]["redrafter"],
        prompts=PROMPTS,
        dtype="float64",
        max_new_tokens=10,
        temperature=0.9,
        seed=8,
        **options,
    )


def _transformers_greedy(model, prompt: list[int], new_tokens: int) -> list[int]:
    """transformers' own greedy decoding of one prompt, with a check that no step was a near-tie."""
    input_ids = torch.tensor([prompt])
    out = model.generate(
        input_ids,
        attention_mask=torch.ones_like(input_ids),
        max_new_tokens=new_tokens,
        min_new_tokens=new_tokens,
        do_sample=False,
        output_scores=True,
        return_dict_in_generate=True,
        pad_token_id=0,
    )
    for step, scores in enumerate(out.scores):
        top = torch.topk(scores[0].float(), 2).values
        assert top[0] - top[1] > 1e-3, (
            f"step {step} of prompt {prompt} is a near-tie; pick another model seed"
        )
    return out.sequences[0, len(prompt) :].tolist()


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_greedy_parity_with_transformers_generate_float32(world, arch):
    """Each row of a ragged batch equals transformers' generate() on that row alone, for every
    drafter."""
    from transformers import AutoModelForCausalLM

    model_dir, new = world[arch]["model"], 12
    hf = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
    expected = [_transformers_greedy(hf, prompt, new) for prompt in PROMPTS]
    target = specdec.load(
        model_dir, backend="torch", dtype="float32", device=DEVICE, slots=len(PROMPTS)
    )
    for drafter in DRAFTERS:
        got = specdec.generate(
            target, PROMPTS, drafter=world[arch][drafter], backend="torch", max_new_tokens=new
        ).tokens
        assert got == expected, (
            f"generate({arch}, drafter={drafter}, torch float32) differs from transformers"
        )


@settings(max_examples=8)
@given(
    width=st.integers(1, 3),
    length=st.integers(2, 5),
    corruption=st.sampled_from([0.0, 0.3, 1.0]),
    seed=st.integers(0, 2**16),
)
def test_greedy_parity_with_oracle_drafter_float32(world, width, length, corruption, seed):
    target = specdec.load(
        world["llama"]["model"], backend="torch", dtype="float32", device=DEVICE, slots=len(PROMPTS)
    )
    new = 10
    truth = greedy_continuations(target, PROMPTS, new + length, backend="torch")
    oracle = OracleDrafter(
        truth,
        prompts=PROMPTS,
        vocab_size=target.vocab_size,
        backend=TorchBackend(),
        target=target,
        beam_width=width,
        beam_length=length,
        corruption=corruption,
        rng=np.random.default_rng(seed),
    )
    got = specdec.generate(
        target, PROMPTS, drafter=oracle, backend="torch", max_new_tokens=new, stop_at_eos=False
    )
    assert got.tokens == [t[:new] for t in truth], (
        f"oracle W={width} L={length} corruption={corruption} (torch)"
    )


def test_self_drafting_accepts_everything(world):
    """A drafter proposing the target's own continuation has every drafted token accepted."""
    prompts, length, new = [[1, 2, 3], [7]], 4, 13
    target = specdec.load(
        world["qwen2"]["model"], backend="torch", dtype="float32", device=DEVICE, slots=len(prompts)
    )  # both rows decode in every step
    truth = greedy_continuations(target, prompts, new + length, backend="torch")
    oracle = OracleDrafter(
        truth,
        prompts=prompts,
        vocab_size=target.vocab_size,
        backend=TorchBackend(),
        target=target,
        beam_width=2,
        beam_length=length,
        corruption=0.0,
    )
    steps = list(
        specdec.stream(target, prompts, oracle, "torch", max_new_tokens=new, stop_at_eos=False)
    )
    assert [list(s.num_accepted) for s in steps[1:]] == [[3, 3]] * 3, (
        "self-drafting must accept every token (torch)"
    )


def test_batch_rows_match_rows_alone_when_sampling(world):
    model, drafter = world["llama"]["model"], world["llama"]["redrafter"]
    target = specdec.load(
        model, backend="torch", dtype="float64", device=DEVICE, slots=len(PROMPTS)
    )
    seeds = [21, 22, 23]
    batch = specdec.generate(
        target,
        PROMPTS,
        drafter=drafter,
        backend="torch",
        max_new_tokens=9,
        temperature=1.0,
        seed=seeds,
    ).tokens
    for row, prompt in enumerate(PROMPTS):
        alone = specdec.generate(
            target,
            prompt,
            drafter=drafter,
            backend="torch",
            max_new_tokens=9,
            temperature=1.0,
            seed=[seeds[row]],
        ).tokens
        assert alone == batch[row], (
            f"row {row} decoded alone differs from the batch (torch, sampling)"
        )


def _decisive_prompts(target, candidates, new_tokens: int, margin: float) -> list[list[int]]:
    """The candidate prompts whose greedy continuation never has a top-2 logit gap below
    ``margin`` (measured in float32 by the torch target on the teacher-forced sequence)."""
    from specdec.reference.tree import build_prefix_tree

    backend = TorchBackend()
    chosen = []
    continuations = greedy_continuations(target, candidates, new_tokens, backend="torch")
    slot = np.array([0])
    for prompt, continuation in zip(candidates, continuations, strict=True):
        output = target.admit(0, prompt)
        chain = build_prefix_tree(np.array([[continuation]]))
        tree_logits = target.forward_tree(
            checks.to_backend_tree(chain, backend, target), slot
        ).logits[0]
        target.release(0)
        logits = torch.cat([output.logits[None], tree_logits], 0)  # (1 + new_tokens, V)
        top = torch.topk(logits.float(), 2, dim=-1).values
        if bool(torch.all(top[:, 0] - top[:, 1] > margin)):
            chosen.append(prompt)
    return chosen


def test_bfloat16_speculative_greedy_equals_plain_bfloat16(world):
    """bfloat16 smoke run: on prompts whose greedy path has logit gaps > 0.5 (bfloat16 rounding
    moves these logits by far less), speculative greedy output equals plain bfloat16 decoding."""
    model = world["llama"]["model"]
    new = 12
    reference = specdec.load(model, backend="torch", dtype="float32", device=DEVICE, slots=3)
    rng = np.random.default_rng(0)
    candidates = [rng.integers(0, 96, size=int(rng.integers(1, 6))).tolist() for _ in range(6)]
    prompts = _decisive_prompts(reference, candidates, new, margin=0.5)[:3]
    assert len(prompts) >= 2, (
        "too few decisive prompts for the bfloat16 smoke run; change the candidate seed"
    )
    target = specdec.load(
        model, backend="torch", dtype="bfloat16", device=DEVICE, slots=len(prompts)
    )
    plain = specdec.generate(
        target, prompts, drafter="none", backend="torch", max_new_tokens=new
    ).tokens
    assert plain == greedy_continuations(reference, prompts, new, backend="torch"), (
        "bfloat16 left the float32 path"
    )
    for drafter in ("redrafter", "medusa"):
        spec = specdec.generate(
            target, prompts, drafter=world["llama"][drafter], backend="torch", max_new_tokens=new
        )
        assert spec.tokens == plain, (
            f"bfloat16 greedy with drafter={drafter} differs from plain bfloat16 decoding"
        )
        assert spec.stats.steps <= new + 1
