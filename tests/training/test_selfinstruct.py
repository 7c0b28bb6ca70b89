"""Self-instruct and plain-text teacher prompts (``specdec.training.selfinstruct``)."""

from __future__ import annotations

import pytest

from specdec.training.selfinstruct import (
    KINDS,
    META,
    MIX_KINDS,
    MixedPrompts,
    clean_request,
    meta_request,
)


@pytest.mark.parametrize(
    "reply, expected",
    [
        (
            "What is the probability of rolling a 6 on a six-sided die?",
            "What is the probability of rolling a 6 on a six-sided die?",
        ),
        (
            (
                'A user could ask: "How do I log errors with the logging module?"\n\n'
                'The assistant can respond ...'
            ),
            "How do I log errors with the logging module?",
        ),
        (
            "Question: Why did the Roman Empire fall?\nIt fell because ...",
            "Why did the Roman Empire fall?",
        ),
        ('"Write a haiku about autumn leaves."', "Write a haiku about autumn leaves."),
        (
            (
                'Here\'s an example of a role-play task about travel:\n\n'
                '"Pretend you are my guide and plan a day in Rome."'
            ),
            "Pretend you are my guide and plan a day in Rome.",
        ),
    ],
)
def test_clean_request_takes_the_request_out_of_a_reply(reply, expected):
    assert clean_request(reply) == expected


@pytest.mark.parametrize(
    "reply",
    [
        "I'm ready to assist you. What can I help you with?",
        "What a wonderful question! Here's a possible answer:",
        "Here's an example of a task:",
        "Short?",
        "x" * 700,
        "1234 5678 9012 3456",
    ],
)
def test_clean_request_drops_replies_that_are_not_requests(reply):
    assert clean_request(reply) is None


def test_meta_prompts_name_the_kind_and_the_topic():
    for phrasing in range(len(META)):
        (message,) = meta_request("math", "the tempest", phrasing)
        assert (
            message["role"] == "user"
            and KINDS["math"] in message["content"]
            and "the tempest" in message["content"]
        )


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    from specdec.training.corpus import Corpus

    lib = tmp_path_factory.mktemp("lib")
    for i in range(12):
        (lib / f"mod{i}.py").write_text(
            f'def area_{i}(w, h):\n    """Return the area of a {i} by h box."""\n    return w * h\n'
        )
    return Corpus(stdlib=lib)


def test_mixed_prompts_deal_every_kind_deterministically(corpus, tiny_target):
    mix = tuple((kind, 1.0) for kind in MIX_KINDS)
    source = MixedPrompts(corpus, tiny_target, seed=0, mix=mix, batch_size=8)
    prompts = source("train", 0, 32)
    kinds = [source.kind_of(i, "train") for i in range(32)]
    assert set(kinds) == set(MIX_KINDS)
    for kind, prompt in zip(kinds, prompts, strict=True):
        if kind == "plain":
            assert all(isinstance(t, int) for t in prompt) and prompt, (
                "plain text is token ids, no chat template"
            )
        else:
            assert len(prompt) == 1 and prompt[0]["role"] == "user" and prompt[0]["content"].strip()
    made = source.stats
    assert all(made[kind] == kinds.count(kind) for kind in MIX_KINDS)
    asked = made["written_by_target"] + made["fallback"]
    assert (
        kinds.count("self_instruct")
        <= asked
        <= kinds.count("self_instruct") + kinds.count("general")
    )
    again = MixedPrompts(corpus, tiny_target, seed=0, mix=mix, batch_size=8)
    assert again("train", 8, 24) == prompts[8:], (
        "prompt i does not depend on how many are asked for"
    )


def test_a_mix_that_is_not_one_is_refused(corpus, tiny_target):
    for mix in ((), (("poems", 1.0),), (("corpus", -1.0), ("plain", 2.0))):
        with pytest.raises(ValueError, match="mix must give"):
            MixedPrompts(corpus, tiny_target, mix=mix)
