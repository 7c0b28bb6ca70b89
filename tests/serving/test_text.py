"""Incremental detokenization and stop strings (specdec.serving.text): the pieces add up to the
text of the whole sequence, and a stop string is cut where it first occurs, never streamed."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from specdec.serving.text import IncrementalText, StopStrings


def _byte_level_tokenizer():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=300, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tokenizer.train_from_iterator(
        ["héllo wörld, naïve café 日本語 🙂 tokens", "the cat sat on the mat"] * 10, trainer
    )
    return tokenizer


BYTE_LEVEL = _byte_level_tokenizer()


@settings(max_examples=60)
@given(
    text=st.text(alphabet="héloa wrd,ïcf日本🙂\n", min_size=1, max_size=30),
    cuts=st.lists(st.integers(1, 4)),
    context=st.integers(0, 3),
)
def test_pieces_add_up_to_the_whole_text_with_multibyte_characters(text, cuts, context):
    ids = BYTE_LEVEL.encode(text).ids
    prompt, ids = ids[:context], ids[context:]
    detok, pieces, start = IncrementalText(BYTE_LEVEL, prompt), [], 0
    for n in cuts + [len(ids)]:
        pieces.append(detok.add(ids[start : start + n]))
        start += n
        if start >= len(ids):
            break
    pieces.append(detok.flush())
    whole = BYTE_LEVEL.decode(prompt + ids)
    assert "".join(pieces) == whole[len(BYTE_LEVEL.decode(prompt)) :]
    assert all("\ufffd" not in piece for piece in pieces[:-1]) or "\ufffd" in whole


def test_word_level_text_has_the_spaces_of_the_whole_decode(model_dir):
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    detok = IncrementalText(tokenizer, [5, 6])
    assert [detok.add([7]), detok.add([8, 9])] == [
        " " + tokenizer.decode([7]),
        " " + tokenizer.decode([8, 9]),
    ]


def first_cut(text: str, stops: list[str], ends: list[int]) -> tuple[str, bool]:
    """The text up to the first stop string complete at one of ``ends`` (where pieces end): the
    earliest one in the text so far when a piece completes several."""
    for end in ends:
        found = [i for i in (text[:end].find(s) for s in stops) if i >= 0]
        if found:
            return text[: min(found)], True
    return text, False


@settings(max_examples=200)
@given(
    text=st.text(alphabet="abc", max_size=20),
    stops=st.lists(st.text(alphabet="abc", min_size=1, max_size=4), max_size=3),
    cuts=st.lists(st.integers(0, 5), max_size=10),
)
def test_stop_strings_cut_at_the_first_one_completed_and_never_stream_part_of_one(
    text, stops, cuts
):
    matcher, released, start, ends = StopStrings(stops), [], 0, []
    for n in cuts + [len(text)]:
        piece = text[start : start + n]
        start = min(start + n, len(text))
        ends.append(start)
        released.append(matcher.add(piece))
        if start >= len(text):
            break
    expected, hit = first_cut(text, stops, ends)
    for i in range(len(released)):
        assert expected.startswith("".join(released[: i + 1])), "released text is never taken back"
    if matcher.hit is None:
        released.append(matcher.flush())
    assert "".join(released) == expected and (matcher.hit is not None) == hit
