"""The answer store (``specdec.drafting.store``): its chain against its readable twin, files
and their checks, the lookup beam drafting from it where the text has no match, lossless
decoding with it, and ``specdec store``."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import specdec
from specdec.cli.main import main as cli_main
from specdec.drafting.lookup import row_chain
from specdec.drafting.store import (
    AnswerStore,
    build_store,
    load_store,
    resolve_store,
    shipped_store,
    store_chain_reference,
)
from specdec.errors import IncompatibleDrafterError, InvalidInputError
from specdec.testing import make_random_drafter

sequences_strategy = st.lists(
    st.lists(st.integers(0, 4), min_size=1, max_size=14), min_size=1, max_size=6
)


@settings(max_examples=200, deadline=None)
@given(
    sequences=sequences_strategy,
    history=st.lists(st.integers(0, 4), min_size=1, max_size=8),
    length=st.integers(1, 6),
    min_share=st.sampled_from([0.0, 0.34, 0.5, 1.0]),
)
def test_the_store_chain_is_its_reference(sequences, history, length, min_share):
    # token ids of a five-id vocabulary: many matches and ties, integers only (no near-ties)
    arrays = [np.array(s, dtype=np.int64) for s in sequences]
    store = AnswerStore(arrays, vocab_size=5)
    fast = store.chain(np.array(history), length, min_share=min_share)
    slow = store_chain_reference(
        arrays, np.array(history), length, span=store.span, min_share=min_share
    )
    assert fast.tolist() == slow.tolist()


def test_the_store_follows_the_longest_match_then_the_most_shared_token():
    store = AnswerStore(
        [np.array([1, 2, 3, 4]), np.array([9, 2, 3, 5]), np.array([8, 2, 3, 5, 6])], vocab_size=10
    )
    # [1, 2, 3] occurs once (-> 4); [7, 2, 3] never, [2, 3] three times: 5 twice, 4 once
    assert store.chain(np.array([1, 2, 3]), 3).tolist() == [4]
    assert store.chain(np.array([7, 2, 3]), 3).tolist() == [5, 6]
    assert store.chain(np.array([7, 2, 3]), 3, min_share=0.7).tolist() == []  # 5: 2 of 3
    assert store.chain(np.array([7]), 3).tolist() == []  # 7 never occurs
    # vocabularies of 2**16 ids and more pack fewer tokens per key
    assert AnswerStore([np.array([1])], vocab_size=2**16).span == 3


def test_a_long_range_of_matches_is_sampled_evenly():
    # 600 matches of [1]: 400 go on with 2, 200 with 3; a 256-match sample keeps the majority
    sequences = [np.array([1, 2])] * 400 + [np.array([1, 3])] * 200
    store = AnswerStore(sequences, vocab_size=4)
    assert store.chain(np.array([1]), 2, sample=256).tolist() == [2]


def test_a_store_file_round_trips_and_is_checked(tmp_path, target):
    store = build_store([[5, 6, 7], [1]], [[8, 9], [2, 3, 4]], vocab_size=96, model="m", context=2)
    assert len(store) == 2 + 2 + 1 + 3
    path = store.save(tmp_path / "s.npz")
    loaded = load_store(path, target)
    assert loaded.tokens.tolist() == store.tokens.tolist() and loaded.model == "m"
    assert loaded.chain(np.array([6, 7]), 3).tolist() == [8, 9]
    other = build_store([[1]], [[2]], vocab_size=50, model="other").save(tmp_path / "o.npz")
    with pytest.raises(IncompatibleDrafterError, match="another model .'other', vocab_size 50"):
        load_store(other, target)
    (tmp_path / "bad.npz").write_bytes(b"not a store")
    with pytest.raises(InvalidInputError, match="is not an answer store"):
        load_store(tmp_path / "bad.npz", target)
    with pytest.raises(InvalidInputError, match="is not a file"):
        load_store(tmp_path / "none.npz", target)
    with pytest.raises(InvalidInputError, match="outside"):
        AnswerStore([np.array([96])], vocab_size=96)


def test_a_store_option_resolves_or_names_the_fix(target):
    assert resolve_store("auto", target) is None  # none ships for a random model
    assert resolve_store(False, target) is None
    with pytest.raises(InvalidInputError, match="no answer store ships .*`specdec store"):
        resolve_store(True, target)
    with pytest.raises(InvalidInputError, match="store must be"):
        resolve_store(3, target)


def test_the_store_continues_only_where_the_text_has_no_match():
    store = AnswerStore([np.array([4, 5, 6, 7])], vocab_size=10)
    options = dict(max_ngram=3, min_ngram=2, unigram_length=3)
    # "1 2" occurred before: the row's own text wins
    assert row_chain(np.array([1, 2, 9, 1, 2]), 3, **options, store=store).tolist() == [9, 1, 2]
    # no match in the text: the store continues "4 5" -> 6 7
    assert row_chain(np.array([3, 4, 5]), 3, **options, store=store).tolist() == [6, 7]
    assert row_chain(np.array([3, 4, 5]), 3, **options).tolist() == []


def _decode(target, drafter, **options):
    return specdec.generate(
        target, [1, 2], drafter=drafter, backend="numpy", max_new_tokens=24, stop_at_eos=False,
        **options,
    )  # fmt: skip


def test_decoding_with_a_store_is_lossless_and_drafts_from_it(target, tmp_path):
    plain = _decode(target, "none")
    # a store of the target's own answer: its continuation is accepted
    path = build_store([[1, 2]], [plain.tokens], vocab_size=96).save(tmp_path / "own.npz")
    looked = _decode(target, "lookup", store=str(path))
    assert looked.tokens == plain.tokens
    assert looked.stats.accepted_tokens > 0 and looked.stats.steps < plain.stats.steps
    # a store of other text: drafts are refused, the output is the same
    noise = build_store([[3]], [np.arange(90) % 7], vocab_size=96).save(tmp_path / "noise.npz")
    other = _decode(target, "lookup", store=str(noise))
    assert other.tokens == plain.tokens


def test_a_store_joins_a_model_drafters_lookup_beam_by_name_or_path(model_dir, target, tmp_path):
    redrafter = make_random_drafter(tmp_path / "rd", model_dir, kind="redrafter", seed=3)

    def decode(**options):
        return _decode(target, redrafter, speculation="always", **options)

    plain = _decode(target, "none")
    own = build_store([[1, 2]], [plain.tokens], vocab_size=96).save(tmp_path / "own.npz")
    alone, stored = decode(lookup=True), decode(lookup=str(own))  # CLI: lookup=own.npz
    assert stored.tokens == alone.tokens == plain.tokens
    assert stored.stats.accepted_tokens > alone.stats.accepted_tokens
    with pytest.raises(specdec.InvalidInputError, match="no answer store ships"):
        decode(lookup="store")  # none ships for a random model
    with pytest.raises(specdec.InvalidInputError, match="nothing.npz is not a file"):
        decode(lookup="nothing.npz")


def test_specdec_store_builds_a_store_from_token_sequences(model_dir, tmp_path, capsys):
    data = tmp_path / "answers.npz"
    np.savez(
        data,
        tokens=np.array([1, 2, 3, 4, 5, 1, 2, 6], dtype=np.uint16),
        prompt_lengths=np.array([2, 2], dtype=np.int32),
        response_lengths=np.array([3, 1], dtype=np.int32),
    )
    out = tmp_path / "store.npz"
    code = cli_main(["store", "--model", str(model_dir), "--data", str(data), "--out", str(out)])
    assert code == 0
    assert "1 answers" in capsys.readouterr().out  # the second prompt repeats the first
    store = load_store(out)
    assert store.tokens.tolist() == [1, 2, 3, 4, 5, -1] and store.model == "llama"


def test_a_store_ships_for_the_bundled_model():
    class Named:
        name, vocab_size = "smollm2-135m", 49152

    path = shipped_store(Named())
    assert path is not None and len(load_store(path, Named())) > 2_000_000
