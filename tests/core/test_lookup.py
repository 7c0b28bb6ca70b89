"""Prompt lookup drafting (``specdec.drafting.lookup``): the n-gram rule on worked examples, the
chain's length guarantee, the history the loop hands drafters, and lossless decoding alone or beside
ReDrafter."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import specdec
from specdec.drafting.none import NoDrafter
from specdec.errors import InvalidInputError
from specdec.generation.api import prepare
from specdec.drafting.lookup import (
    LookupDrafter,
    check_ngram_sizes,
    lookup_chain,
    next_token_by_lookup,
    row_chain,
)
from specdec.plugins.builtin import NumpyBackend
from specdec.testing import make_random_drafter
from specdec.types import DraftContext


def tokens(*ids):
    return np.array(ids, dtype=np.int64)


@pytest.mark.parametrize(
    "history, max_ngram, min_ngram, expected",
    [
        ((5, 6, 7, 5, 6), 2, 1, 7),  # suffix [5, 6] occurred at 0, followed by 7
        ((5, 6, 7, 9, 6), 2, 1, 7),  # [9, 6] never occurred: back off to [6], followed by 7
        ((5, 6, 7, 9, 6), 2, 2, None),  # ... unless 2-grams are the shortest allowed
        ((1, 2, 8, 1, 2, 9, 1, 2), 2, 1, 9),  # the most recent occurrence wins
        (
            (3, 1, 2, 4, 0, 1, 2, 5, 3, 1, 2),
            3,
            1,
            4,
        ),  # the longest suffix wins: [3, 1, 2] -> 4, not [1, 2] -> 5
        ((4,), 3, 1, None),  # nothing before the last token
        ((4, 4), 3, 1, 4),
    ],
)
def test_next_token_by_lookup_worked_examples(history, max_ngram, min_ngram, expected):
    assert (
        next_token_by_lookup(tokens(*history), max_ngram=max_ngram, min_ngram=min_ngram) == expected
    )


def test_lookup_chain_extends_over_its_own_tokens():
    # "a b c d a b" -> c d a b c ... (the copy continues past the end of the first occurrence)
    chain = lookup_chain(tokens(1, 2, 3, 4, 1, 2), 6, max_ngram=2, min_ngram=2)
    assert chain.tolist() == [3, 4, 1, 2, 3, 4]
    assert lookup_chain(tokens(1, 2, 3), 4, max_ngram=2, min_ngram=1).tolist() == []


@settings(max_examples=50)
@given(
    history=st.lists(st.integers(0, 3), min_size=1, max_size=30),
    length=st.integers(1, 8),
    max_ngram=st.integers(1, 4),
    min_ngram=st.integers(1, 4),
)
def test_lookup_chain_is_full_or_empty(history, length, max_ngram, min_ngram):
    """Once the first token is found the chain reaches ``length`` (module docstring's argument)."""
    min_ngram = min(min_ngram, max_ngram)
    chain = lookup_chain(np.array(history), length, max_ngram=max_ngram, min_ngram=min_ngram)
    first = next_token_by_lookup(np.array(history), max_ngram=max_ngram, min_ngram=min_ngram)
    assert len(chain) == (0 if first is None else length), (
        history,
        length,
        max_ngram,
        min_ngram,
        chain,
    )
    if first is not None:
        assert chain[0] == first


@settings(max_examples=200, deadline=None)
@given(
    history=st.lists(
        st.sampled_from([0, 1, 2, 256, 257, 65536, 65792, 2**31 - 1]), min_size=1, max_size=40
    ),
    length=st.integers(1, 12),
    max_ngram=st.integers(1, 4),
    min_ngram=st.integers(1, 4),
)
def test_lookup_chain_is_its_reference(history, length, max_ngram, min_ngram):
    """The byte search finds the reference's tokens; ids whose bytes repeat inside and across
    tokens (0, 1, 256, 65536, ...) make matches that straddle token boundaries, which must be
    skipped."""
    from specdec.drafting.lookup import lookup_chain_reference

    min_ngram = min(min_ngram, max_ngram)
    expected = lookup_chain_reference(
        np.array(history), length, max_ngram=max_ngram, min_ngram=min_ngram
    )
    got = lookup_chain(np.array(history), length, max_ngram=max_ngram, min_ngram=min_ngram)
    assert got.tolist() == expected.tolist(), (history, length, max_ngram, min_ngram)


def test_a_match_across_token_boundaries_is_not_an_occurrence():
    # [256, 0] is 00 01 00 00 00 00 00 00: the bytes of token 1 (01 00 00 00) appear at byte
    # offset 1, inside two tokens; that is no occurrence of [1]. The real one (position 0) counts.
    assert lookup_chain(tokens(256, 0, 9, 1), 1, max_ngram=1, min_ngram=1).tolist() == []
    assert lookup_chain(tokens(1, 7, 256, 0, 9, 1), 1, max_ngram=1, min_ngram=1).tolist() == [7]


@pytest.mark.parametrize("max_ngram, min_ngram", [(0, 1), (2, 3), (2.0, 1), (True, 1)])
def test_bad_ngram_sizes_are_refused(max_ngram, min_ngram):
    with pytest.raises(InvalidInputError, match="ngram"):
        check_ngram_sizes(max_ngram, min_ngram)


def test_lookup_drafter_alone_drafts_the_chain_or_nothing():
    drafter = LookupDrafter(NumpyBackend(), None, draft_length=3, max_ngram=2, min_ngram=1)
    history = (tokens(7, 1, 2, 3, 9, 1, 2), tokens(4, 5, 6))

    def propose(rows):
        roots = np.array([h[-1] for h in rows])
        return drafter.propose(
            DraftContext(root_tokens=roots, hidden=np.zeros((len(rows), 1)), history=rows)
        )

    assert propose(history).beams.tolist() == [
        [[2, 3, 9, 1]],
        [[6, 6, 6, 6]],
    ]  # row 1: no match, root repeated
    assert propose(history[1:]).beams.tolist() == [[[6]]]  # no row matches: a plain step


@pytest.fixture(scope="module")
def redrafter(model_dir, tmp_path_factory):
    return make_random_drafter(
        tmp_path_factory.mktemp("lookup") / "rd", model_dir, kind="redrafter", seed=3
    )


class RecordingDrafter:
    """Plain decoding that records the history each step hands it."""

    caps = specdec.DrafterCaps()

    def __init__(self):
        self.histories = []

    def propose(self, context):
        self.histories.append([h.tolist() for h in context.history])
        return NoDrafter().propose(context)


def test_loop_hands_drafters_prompt_and_emitted_tokens(target, redrafter):
    prompts = [[1, 2, 3], [9]]
    recorder = RecordingDrafter()
    steps = list(
        specdec.stream(target, prompts, recorder, "numpy", max_new_tokens=5, stop_at_eos=False)
    )
    emitted = [[], []]
    for step, seen in zip(
        steps[:-1], recorder.histories, strict=True
    ):  # the last step ends both rows
        for b in range(2):
            emitted[b] += step.new_tokens[b]
        assert seen == [prompts[b] + emitted[b] for b in range(2)]
    assert len(recorder.histories) == len(steps) - 1 == 4


repetitive_prompts = st.lists(
    st.lists(st.integers(0, 5), min_size=1, max_size=12), min_size=1, max_size=3
)


@settings(max_examples=10)
@given(prompts=repetitive_prompts, length=st.integers(2, 4), max_ngram=st.integers(1, 3))
def test_lookup_alone_and_beside_redrafter_keep_greedy_output(
    target, redrafter, prompts, length, max_ngram
):
    plain = specdec.generate(target, prompts, drafter="none", backend="numpy", max_new_tokens=12)
    alone = specdec.generate(
        target,
        prompts,
        drafter="lookup",
        backend="numpy",
        max_new_tokens=12,
        draft_length=length,
        max_ngram=max_ngram,
        min_ngram=1,
    )
    beside = specdec.generate(
        target,
        prompts,
        drafter=redrafter,
        backend="numpy",
        max_new_tokens=12,
        beam_width=2,
        beam_length=length,
        lookup=dict(max_ngram=max_ngram, min_ngram=1),
    )
    assert alone.tokens == plain.tokens, (
        f"drafter='lookup' k={length} n={max_ngram} differs for {prompts}"
    )
    assert beside.tokens == plain.tokens, (
        f"redrafter + lookup L={length} n={max_ngram} differs for {prompts}"
    )


def test_lookup_beam_is_accepted_when_the_target_repeats_itself(target):
    """Decode far enough for the random target to fall into a cycle; the lookup drafter then
    drafts it, and the target accepts: fewer steps than tokens."""
    plain = specdec.generate(
        target, [1], drafter="none", backend="numpy", max_new_tokens=60, stop_at_eos=False
    )
    looked = specdec.generate(
        target,
        [1],
        drafter="lookup",
        backend="numpy",
        max_new_tokens=60,
        stop_at_eos=False,
        min_ngram=1,
    )
    assert looked.tokens == plain.tokens
    assert looked.stats.accepted_tokens > 0 and looked.stats.steps < plain.stats.steps


def test_lookup_beside_a_drafter_adds_one_beam_of_its_own_length(target, redrafter):
    """W x (L - 1) model tokens plus the chain's draft_length when the lookup finds a chain;
    W x (L - 1) when it does not (its beam is then the root alone)."""
    every_token = list(range(target.vocab_size))  # whatever the root, its 1-gram occurred
    for chain in (1, 5):
        found = list(
            specdec.stream(
                target,
                every_token,
                drafter=redrafter,
                backend="numpy",
                max_new_tokens=2,
                beam_width=2,
                beam_length=3,
                lookup=dict(max_ngram=1, min_ngram=1, draft_length=chain),
            )
        )
        assert [int(step.num_drafted[0]) for step in found] == [0, 2 * 2 + chain]
        assert found[1].num_verified[0] <= 1 + 2 * 2 + chain
    assert [
        int(s.num_drafted[0])
        for s in specdec.stream(
            target,
            every_token,
            drafter=redrafter,
            backend="numpy",
            max_new_tokens=2,
            beam_width=2,
            beam_length=3,
            lookup=dict(max_ngram=1, min_ngram=1),
        )
    ] == [0, 2 * 2 + 10]
    missing = specdec.stream(
        target,
        [1, 2, 3],
        drafter=redrafter,
        backend="numpy",
        max_new_tokens=2,
        beam_width=2,
        beam_length=3,
        lookup=dict(max_ngram=2, min_ngram=2),
    )
    assert [int(step.num_drafted[0]) for step in missing] == [0, 2 * 2], (
        "the 2-gram [3, root] never occurred"
    )


def test_sampling_with_lookup_uses_the_exact_verifier(target, redrafter):
    plan, *_ = prepare(
        target,
        [1, 2],
        redrafter,
        "numpy",
        max_new_tokens=4,
        temperature=0.7,
        top_k=None,
        top_p=None,
        dtype=None,
        device=None,
        registry=None,
        options=dict(lookup=True),
    )
    assert type(plan.verifier).__name__ == "ExactTreeVerifier"
    out = specdec.generate(
        target,
        [1, 2, 1, 2],
        drafter=redrafter,
        backend="numpy",
        max_new_tokens=8,
        temperature=0.7,
        seed=1,
        lookup=True,
    )
    assert len(out.tokens) == 8


@pytest.mark.parametrize(
    "drafter, options, message",
    [
        ("medusa", {}, "prefix tree"),
        ("none", {}, "drafter='lookup'"),
        ("lookup", {}, "drafter='lookup'"),
        (
            "lookup",
            dict(lookup=5),
            r"lookup=5 adds .* prompt lookup alone: give its chain's length as draft_length=N",
        ),
        ("lookup", dict(lookup="store"), r"shipped for the model by default \(store='auto'"),
        ("redrafter", dict(sample=True, temperature=0.7), "samples its beams"),
        (
            "redrafter",
            dict(verifier="redrafter_published", temperature=0.7),
            "deterministic and have none",
        ),
        (
            "redrafter",
            dict(lookup=dict(max_ngram=2, bad=1)),
            "draft_length / max_ngram / min_ngram",
        ),
    ],
)
def test_lookup_misuse_names_the_fix(target, model_dir, tmp_path, drafter, options, message):
    if drafter in ("medusa", "redrafter"):
        drafter = make_random_drafter(tmp_path / drafter, model_dir, kind=drafter, seed=5)
    options = {"lookup": True, **options}
    with pytest.raises(
        InvalidInputError, match=message
    ):  # refused before the target's cache is touched
        prepare(
            target,
            [1, 2, 3],
            drafter,
            "numpy",
            max_new_tokens=3,
            temperature=options.pop("temperature", 0.0),
            top_k=None,
            top_p=None,
            dtype=None,
            device=None,
            registry=None,
            options=options,
        )


def test_drafted_tokens_counts_each_repeated_beam_once_and_only_within_its_length():
    from specdec.decode.batching import drafted_tokens

    beams = np.array([[[1, 2, 3], [1, 2, 4], [1, 2, 3]], [[5, 5, 5], [5, 5, 5], [5, 5, 5]]])
    assert drafted_tokens(beams).tolist() == [4, 2]
    # beam 2 of row 0 ends after [1, 2]: a different beam from beam 0 (1 token); in row 1 beam 1
    # ends at the root (nothing drafted) and beam 2 repeats beam 0
    lengths = np.array([[3, 3, 2], [3, 1, 3]])
    assert drafted_tokens(beams, lengths).tolist() == [5, 2]


def test_a_rows_lookup_drafts_do_not_depend_on_its_batch(tmp_path):
    """A row without a match drafted its root repeated whenever another row's chain made the
    draft long, and verified it: prompt (4, 5, 6) took one drafting step fewer beside the other
    two prompts than alone in a slot, so a request's drafts depended on what shared its step (the
    conformance kit's one-slot check tripped on it). It now drafts nothing until it has a match."""
    import specdec
    from specdec.testing import make_random_model

    path = make_random_model(
        tmp_path / "m",
        vocab_size=64,
        hidden_size=32,
        num_layers=2,
        num_heads=4,
        num_kv_heads=2,
        seed=0,
    )
    prompts = [[1, 2, 3, 1, 2, 3, 1, 2], [4, 5, 6], [7]]

    def verified(slots):
        target = specdec.load(path, backend="numpy", slots=slots)
        steps = specdec.stream(
            target,
            prompts,
            drafter="lookup",
            backend="numpy",
            max_new_tokens=16,
            stop_at_eos=False,
            speculation="always",
            unigram_length=0,  # a row drafts only once its last two tokens repeat
        )
        rows = [[] for _ in prompts]
        for step in steps:
            for b, new in enumerate(step.new_tokens):
                if new and not (step.prefilled is not None and step.prefilled[b]):
                    rows[b].append(int(step.num_verified[b]))
        return rows

    alone, together = verified(1), verified(3)
    assert together == alone
    assert together[1][:3] == [1, 1, 1]  # no match yet: plain steps, beside rows that drafted


def test_where_only_the_last_token_occurred_before_the_chain_is_short():
    history = tokens(7, 8, 9, 5, 7)  # no earlier "5 7"; 7 occurred at 0, followed by 8
    options = dict(max_ngram=3, min_ngram=2)
    assert lookup_chain(history, 6, **options).tolist() == []
    assert row_chain(history, 6, unigram_length=2, **options).tolist() == [8, 9]
    assert row_chain(history, 6, unigram_length=0, **options).tolist() == []
    assert row_chain(history, 1, unigram_length=2, **options).tolist() == [8]  # at most length
    # a match of min_ngram tokens keeps the whole length
    assert row_chain(tokens(7, 8, 9, 7, 8), 4, unigram_length=2, **options).tolist() == [9, 7, 8, 9]


def test_the_lookup_drafter_gives_a_short_chain_its_own_length():
    drafter = LookupDrafter(NumpyBackend(), None, draft_length=5, unigram_length=2)
    context = DraftContext(
        root_tokens=np.array([7, 3]),
        hidden=np.zeros((2, 1)),
        history=[tokens(7, 8, 9, 5, 7), tokens(1, 2, 3)],
    )
    draft = drafter.propose(context)
    assert draft.beam_lengths.tolist() == [[3], [1]]  # root + 8, 9; the root alone
    assert np.asarray(draft.beams)[0, 0, :3].tolist() == [7, 8, 9]
    assert np.asarray(draft.beams).shape == (2, 1, 3)  # greedy: as long as the longest chain


@pytest.mark.parametrize("value", [-1, 1.0, True])
def test_a_bad_unigram_length_is_refused(value):
    with pytest.raises(InvalidInputError, match="unigram_length must be an integer >= 0"):
        LookupDrafter(NumpyBackend(), None, unigram_length=value)
