"""End-to-end decoding on the numpy backend: greedy parity, batches, sampling, stats."""

from __future__ import annotations

import attrs
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import specdec
from specdec.decode.budget import Speculation, StepBudgets
from specdec.plugins.builtin import NumpyBackend
from specdec.testing import OracleDrafter, greedy_continuations, make_random_drafter


def repeating(path, kind: str, *, heads: int | None = None):
    """Turn the random drafter at ``path`` into one that drafts the root token again (its head reads
    the target's hidden state through the target's LM head). The random target repeats its last
    token, so these drafts are accepted. Medusa: only the first ``heads`` heads repeat."""
    if kind == "redrafter":
        from specdec_redrafter.checkpoint import load_redrafter_checkpoint, save_redrafter

        config, weights = load_redrafter_checkpoint(path)
        assert config.head == "tied" and config.exit_dim == 2 * config.hidden_size
        weights = {
            name: np.zeros_like(w) if name.startswith("lm_head.") else w
            for name, w in weights.items()
        }
        weights["head_proj.weight"] = np.eye(
            config.hidden_size, 2 * config.hidden_size
        )  # reads h, not the state
        return save_redrafter(path, config, weights)
    from specdec_medusa.checkpoint import load_medusa_checkpoint, save_medusa

    config, weights = load_medusa_checkpoint(path)
    assert config.head == "tied"
    zero = [f"medusa_head.{k}." for k in range(config.num_heads if heads is None else heads)]
    weights = {
        name: np.zeros_like(w) if name.startswith(tuple(zero)) else w for name, w in weights.items()
    }
    return save_medusa(path, config, weights)


@pytest.fixture(scope="module")
def drafters(model_dir, tmp_path_factory):
    root = tmp_path_factory.mktemp("drafters")
    return {
        "redrafter": make_random_drafter(root / "redrafter", model_dir, kind="redrafter", seed=3),
        "redrafter_full": make_random_drafter(
            root / "rd_full", model_dir, kind="redrafter", seed=4, head="full", num_draft_layers=2
        ),
        "medusa": make_random_drafter(root / "medusa", model_dir, kind="medusa", seed=5),
        "redrafter_repeat": repeating(
            make_random_drafter(root / "rd_rep", model_dir, kind="redrafter", seed=6), "redrafter"
        ),
        "medusa_repeat_2": repeating(
            make_random_drafter(root / "md_rep", model_dir, kind="medusa", seed=7, head="tied"),
            "medusa",
            heads=2,
        ),
    }


prompts_strategy = st.lists(
    st.lists(st.integers(0, 95), min_size=1, max_size=7), min_size=1, max_size=3
)


@settings(max_examples=30)
@given(
    prompts=prompts_strategy,
    width=st.integers(1, 3),
    length=st.integers(2, 4),
    kind=st.sampled_from(
        ["redrafter", "redrafter_full", "medusa", "redrafter_repeat", "medusa_repeat_2"]
    ),
)
def test_greedy_parity_with_trained_style_drafters(target, drafters, prompts, width, length, kind):
    plain = specdec.generate(target, prompts, drafter="none", backend="numpy", max_new_tokens=9)
    options = {} if kind.startswith("medusa") else {"beam_width": width, "beam_length": length}
    spec = specdec.generate(
        target, prompts, drafter=drafters[kind], backend="numpy", max_new_tokens=9, **options
    )
    assert spec.tokens == plain.tokens, (
        f"generate(drafter={kind}, W={width}, L={length}) differs for {prompts}"
    )
    if "repeat" in kind:  # the accept-and-commit path is exercised, not only the all-rejected one
        assert spec.stats.accepted_tokens >= len(prompts), (kind, spec.stats)


@settings(max_examples=30)
@given(
    prompts=prompts_strategy,
    width=st.integers(1, 3),
    length=st.integers(2, 5),
    corruption=st.sampled_from([0.0, 0.2, 0.5, 1.0]),
    seed=st.integers(0, 2**16),
)
def test_greedy_parity_with_oracle_drafter(target, prompts, width, length, corruption, seed):
    new = 10
    truth = greedy_continuations(target, prompts, new + length)
    oracle = OracleDrafter(
        truth,
        prompts=prompts,
        vocab_size=target.vocab_size,
        backend=NumpyBackend(),
        target=target,
        beam_width=width,
        beam_length=length,
        corruption=corruption,
        rng=np.random.default_rng(seed),
    )
    spec = specdec.generate(
        target, prompts, drafter=oracle, backend="numpy", max_new_tokens=new, stop_at_eos=False
    )
    assert spec.tokens == [t[:new] for t in truth], (
        f"oracle W={width} L={length} corruption={corruption}"
    )
    if (
        corruption == 0.0
    ):  # the first step after prefill accepts all L - 1 drafted tokens of every row
        assert spec.stats.accepted_tokens >= len(prompts) * (length - 1), spec.stats
    if corruption == 1.0:  # every drafted token differs from the truth
        assert spec.stats.accepted_tokens == 0, spec.stats


def _perfect_oracle(target, prompts, *, width: int, length: int, new: int):
    """(a drafter proposing the target's own greedy continuation, the steps of streaming
    ``prompts`` with it for ``new`` tokens each)."""
    truth = greedy_continuations(target, prompts, new + length)
    oracle = OracleDrafter(
        truth,
        prompts=prompts,
        vocab_size=target.vocab_size,
        backend=NumpyBackend(),
        target=target,
        beam_width=width,
        beam_length=length,
        corruption=0.0,
    )
    steps = specdec.stream(target, prompts, oracle, "numpy", max_new_tokens=new, stop_at_eos=False)
    return oracle, list(steps)


def test_self_drafting_accepts_everything(target):
    """A drafter that proposes the target's own continuation has every drafted token accepted."""
    prompts, length, new = [[1, 2, 3], [7]], 4, 13
    oracle, steps = _perfect_oracle(target, prompts, width=2, length=length, new=new)
    # Prefill emits 1 token, each later step L (3 accepted + bonus): 1 + 3*4 = 13 tokens in 4 steps.
    assert [list(s.num_accepted) for s in steps[1:]] == [[3, 3]] * 3
    assert all(
        len(row) == new for row in [sum((s.new_tokens[b] for s in steps), []) for b in range(2)]
    )


def test_a_cut_last_step_counts_only_the_accepted_tokens_it_kept(target):
    """A step that the request's length (or a stop token) cut short counted every drafted token
    the verifier accepted, emitted or not: "2 of 6 drafted tokens accepted" over 13 tokens in 13
    steps, where the engine said 0. generate's stats now count what was kept, as the engine's
    Completion does: tokens = 1 + steps + accepted."""
    prompts, length, new = [[1, 2, 3]], 4, 11  # 1 + 4 + 4 + 2: the last step keeps 2 of 4
    oracle, steps = _perfect_oracle(target, prompts, width=1, length=length, new=new)
    assert [int(s.num_accepted[0]) for s in steps[1:]] == [3, 3, 3]  # what the verifier accepted
    assert [len(s.new_tokens[0]) for s in steps] == [1, 4, 4, 2]
    result = specdec.generate(
        target, prompts[0], oracle, "numpy", max_new_tokens=new, stop_at_eos=False
    )
    stats = result.stats
    assert len(result.tokens) == new == 1 + stats.decode_row_steps + stats.accepted_tokens
    # a beam of 4 (root and 3 drafted) a step: how far auto cut the trees is said in words
    assert stats.verified_drafts == 3 * stats.drafting_row_steps == 9
    assert "(3.0 verified a drafting step)" in stats.describe_speculation()
    with specdec.Engine(target, drafter=oracle, backend="numpy") as engine:
        done = engine.submit(prompts[0], max_new_tokens=new, ignore_eos=True).result()
    assert done.accepted_tokens == stats.accepted_tokens


def test_tokens_per_step_counts_bonus_token(target):
    plain = specdec.generate(target, [5, 6], drafter="none", backend="numpy", max_new_tokens=6)
    assert plain.stats.tokens_per_step == 1.0
    assert plain.stats.steps == 6 and plain.stats.new_tokens == 6


def test_batch_rows_match_rows_alone_greedy(target, drafters):
    prompts = [[3], [9, 8, 7, 6, 5, 4], [11, 12]]
    batch = specdec.generate(
        target, prompts, drafter=drafters["redrafter"], backend="numpy", max_new_tokens=8
    )
    for row, prompt in enumerate(prompts):
        alone = specdec.generate(
            target, prompt, drafter=drafters["redrafter"], backend="numpy", max_new_tokens=8
        )
        assert batch.tokens[row] == alone.tokens, (
            f"row {row} of the batch differs from the row alone"
        )


@pytest.mark.parametrize("kind", ["redrafter", "medusa", "none"])
def test_batch_rows_match_rows_alone_sampling(target, drafters, kind):
    prompts, seeds = [[3], [9, 8, 7, 6], [11, 12]], [101, 202, 303]
    drafter = drafters.get(kind, kind)
    batch = specdec.generate(
        target,
        prompts,
        drafter=drafter,
        backend="numpy",
        max_new_tokens=8,
        temperature=0.8,
        top_p=0.9,
        seed=seeds,
    )
    for row, prompt in enumerate(prompts):
        alone = specdec.generate(
            target,
            prompt,
            drafter=drafter,
            backend="numpy",
            max_new_tokens=8,
            temperature=0.8,
            top_p=0.9,
            seed=[seeds[row]],
        )
        assert batch.tokens[row] == alone.tokens, (
            f"{kind}: sampled row {row} differs from the row alone"
        )


def test_sampling_is_reproducible_and_seed_dependent(target, drafters):
    run = lambda seed: (
        specdec.generate(
            target,
            [1, 2],
            drafter=drafters["redrafter"],
            backend="numpy",
            max_new_tokens=12,
            temperature=1.0,
            seed=seed,
        ).tokens
    )
    assert run(7) == run(7)
    assert len({tuple(run(s)) for s in range(4)}) > 1, (
        "different seeds should give different samples"
    )


def test_sampled_redrafter_uses_rejection_verifier(target, drafters):
    from specdec.generation.api import prepare
    from specdec.reference.verify import ExactTreeVerifier, RejectionVerifier

    common = dict(max_new_tokens=4, top_k=None, top_p=None, dtype=None, device=None, registry=None)
    plan = prepare(
        target,
        [1],
        drafters["redrafter"],
        "numpy",
        temperature=0.9,
        options={"sample": True},
        **common,
    )[0]
    assert isinstance(plan.verifier, RejectionVerifier), type(plan.verifier)
    plan = prepare(
        target, [1], drafters["redrafter"], "numpy", temperature=0.9, options={}, **common
    )[0]
    assert isinstance(plan.verifier, ExactTreeVerifier), type(plan.verifier)
    result = specdec.generate(
        target,
        [[1, 2], [4]],
        drafter=drafters["redrafter"],
        backend="numpy",
        max_new_tokens=10,
        temperature=0.9,
        seed=5,
        sample=True,
    )
    again = specdec.generate(
        target,
        [[1, 2], [4]],
        drafter=drafters["redrafter"],
        backend="numpy",
        max_new_tokens=10,
        temperature=0.9,
        seed=5,
        sample=True,
    )
    assert result.tokens == again.tokens and all(len(t) == 10 for t in result.tokens)


def test_text_prompt_and_stats(target, drafters):
    result = specdec.generate(
        target, "alpha beta", drafter=drafters["medusa"], backend="numpy", max_new_tokens=5
    )
    assert isinstance(result.text, str) and len(result.tokens) == 5
    stats = result.stats
    assert stats.verified_tokens >= stats.steps - 1 and stats.drafted_tokens > 0
    assert stats.time_total > 0 and stats.tokens_per_second > 0


def test_stop_at_eos(model_dir, tmp_path):
    target = specdec.load(model_dir, backend="numpy")
    tokens = specdec.generate(
        target, [4, 5], drafter="none", backend="numpy", max_new_tokens=12
    ).tokens
    eos = tokens[3]
    object.__setattr__(target, "eos_token_ids", (eos,)) if hasattr(
        type(target), "__attrs_attrs__"
    ) else setattr(target, "eos_token_ids", (eos,))
    stopped = specdec.generate(
        target, [4, 5], drafter="none", backend="numpy", max_new_tokens=12
    ).tokens
    assert stopped == tokens[: tokens.index(eos) + 1]


def _lookup_stats(target, prompts, max_new_tokens, speculation):
    """The stats of prompt lookup decoding ``prompts`` on the numpy reference."""
    return specdec.generate(
        target,
        prompts,
        drafter="lookup",
        backend="numpy",
        max_new_tokens=max_new_tokens,
        speculation=speculation,
    ).stats


def test_stats_say_how_often_the_rows_drafted(target):
    """What speculation chose is in the result: decode row-steps that drafted, of all of them."""
    import specdec

    plain = specdec.generate(
        target, [5, 6, 7, 5, 6, 7], drafter="none", backend="numpy", max_new_tokens=8
    )
    assert plain.stats.drafting_row_steps == 0 and plain.stats.decode_row_steps == 7
    assert plain.stats.describe_speculation().startswith("drafted in 0 of 7 decode steps")
    # a batch counts row steps, and says so (31 of 31 "decode steps" beside 29 steps read wrong)
    batch = specdec.generate(
        target, [[5, 6, 7], [7, 6, 5, 4]], drafter="none", backend="numpy", max_new_tokens=8
    )
    assert batch.stats.decode_row_steps > batch.stats.steps
    assert batch.stats.describe_speculation().startswith(
        f"drafted in 0 of {batch.stats.decode_row_steps} decode row steps"
    )
    stats = _lookup_stats(target, [5, 6, 7, 5, 6, 7], 8, "always")
    assert 0 < stats.drafting_row_steps <= stats.decode_row_steps
    assert stats.drafting_share == stats.drafting_row_steps / stats.decode_row_steps
    # and why the others decoded plainly, each counted once
    plain_steps = stats.decode_row_steps - stats.drafting_row_steps
    assert sum(stats.plain_reasons.values()) == plain_steps
    assert set(stats.plain_reasons) <= {"no draft"}  # "always": only where lookup found nothing


def test_stats_say_why_steps_decoded_plainly(target):
    """Per request: each decode row-step that did not draft, by why (it was not reported)."""
    from specdec.decode.budget import PLAIN_REASONS

    never = _lookup_stats(target, [5, 6, 7, 5, 6, 7], 8, "never")
    assert never.plain_reasons == {"never": never.decode_row_steps}
    assert (
        "plain steps by reason: 7 never (plain decoding asked for: speculation='never' or "
        "drafter='none')" in never.describe_speculation()
    )  # drafter="none" counts its steps as "never" too, with no speculation='never' named
    # nothing drafted: not "0 of 0 drafted tokens accepted"
    assert "; nothing drafted; 1.00 tokens per step" in never.describe_speculation()
    # each reason in words where it is counted (only "prediction" was explained there)
    from specdec.types import REASON_WORDS

    assert set(REASON_WORDS) == set(PLAIN_REASONS)
    said = attrs.evolve(never, plain_reasons={"measuring": 3, "realized": 4}).describe_speculation()
    assert (
        "3 measuring (plain steps auto times drafting against), 4 realized (drafting steps " in said
    )
    assert said.endswith("drafts every step, to compare with what auto chose"), said  # in none
    # drafting in most steps, the hint reads as boilerplate: only where auto drafted in few
    most = attrs.evolve(
        never,
        plain_reasons={"prediction": 1},
        drafting_row_steps=never.decode_row_steps - 1,
        drafted_tokens=10,
    )
    assert "speculation='always'" not in most.describe_speculation(), most
    # named: the suite's default is "always" (tests/conftest.py)
    auto = _lookup_stats(target, [[5, 6, 7, 5, 6, 7], [1, 2, 3]], 12, "auto")
    assert sum(auto.plain_reasons.values()) == auto.decode_row_steps - auto.drafting_row_steps
    assert set(auto.plain_reasons) <= set(PLAIN_REASONS)


class _HalfPlain(Speculation):
    """Request 0 drafts its whole tree at every step, the others decode plainly: every step has
    two groups of rows, one drafting and one plain."""

    def __init__(self):
        super().__init__("always")

    def step_budgets(self, request_ids, chunk_tokens=0):
        self.reasons = {i: "prediction" for i in request_ids if i != 0}
        budgets = {i: (None if i == 0 else 0) for i in request_ids}
        return StepBudgets(budgets, len(request_ids), 1)


def test_a_step_of_a_drafting_and_a_plain_group_counts_every_rows_reason(target):
    stats = specdec.generate(
        target,
        [[5, 6, 7, 5, 6, 7], [1, 2, 3, 1, 2, 3]],
        drafter="lookup",
        backend="numpy",
        max_new_tokens=8,
        speculation=_HalfPlain(),
        stop_at_eos=False,
    ).stats
    plain = stats.decode_row_steps - stats.drafting_row_steps
    assert (
        stats.plain_reasons.get("prediction") == 7
    )  # request 1's: its first token is the prompt's
    assert sum(stats.plain_reasons.values()) == plain


def test_a_loaded_target_decodes_on_the_backend_that_loaded_it(model_dir):
    """generate(target) with no backend uses the backend ``specdec.load`` loaded it on; before,
    it took torch whenever torch was installed and refused a numpy target."""
    target = specdec.load(model_dir, backend="numpy")
    given = specdec.generate(target, [1, 2, 3], drafter="lookup", backend="numpy", max_new_tokens=6)
    default = specdec.generate(target, [1, 2, 3], drafter="lookup", max_new_tokens=6)
    assert default.tokens == given.tokens
    with specdec.Engine(target, drafter="lookup", max_new_tokens=6) as engine:
        assert list(engine.submit([1, 2, 3]).result().tokens) == list(given.tokens)


def test_a_plan_says_what_it_decodes_with(target):
    """repr(decode_plan(...)) named object addresses and the lookup wrapper's class."""
    plan = specdec.decode_plan(target, "lookup", "numpy", draft_length=4)
    text = repr(plan)
    assert "object at 0x" not in text
    assert "drafter 'lookup'" in text and "draft_length=4" in text
    assert "verifier 'greedy'" in text and "speculation=" in text


def test_each_streamed_forward_has_its_own_step_index(model_dir):
    """With one slot, the second prompt's admission came with the index of the first prompt's
    last decode step ("4 ... False" then "4 ... True"): two forwards, one index."""
    target = specdec.load(model_dir, backend="numpy", slots=1)
    steps = list(specdec.stream(target, [[5, 6, 7], [1, 2, 3]], drafter="lookup", max_new_tokens=4))
    assert sum(s.is_prefill for s in steps) == 2, steps  # one admission per prompt, apart
    assert [s.step for s in steps] == list(range(len(steps)))
