"""Everyday topics for teacher prompts (``specdec.training.topics``)."""

from __future__ import annotations

import re

import numpy as np
import pytest

from specdec.training.topics import TEMPLATES, TOPICS, general_prompt, general_topic, places


def _named(text: str, names) -> set[str]:
    return {name for name in names if re.search(rf"\b{re.escape(name)}\b", text)}


def test_places_are_city_names():
    cities = places()
    assert len(cities) > 200 and "Paris" in cities and "New York" in cities
    assert not any("/" in c or "_" in c or any(ch.isdigit() for ch in c) for c in cities)


@pytest.mark.parametrize("split, other", [("train", "heldout"), ("heldout", "train")])
def test_a_split_asks_only_about_its_own_topics(split, other):
    from specdec.training.topics import _of_split

    own_topics, own_cities = _of_split(split)
    other_topics, other_cities = _of_split(other)
    assert own_topics and other_topics and not set(own_topics) & set(other_topics)
    assert not set(own_cities) & set(other_cities) and len(own_topics) + len(other_topics) == len(
        TOPICS
    )
    # a name of the other split may be part of one of ours ("tea" in "tea ceremonies"): those cannot
    # be told apart
    foreign = [
        t
        for t in other_topics + other_cities
        if not any(t in mine for mine in own_topics + own_cities)
    ]
    rng = np.random.default_rng(0)
    for _ in range(300):
        (message,) = general_prompt(split, rng)
        assert message["role"] == "user" and message["content"].strip()
        assert not _named(message["content"], foreign), message["content"]
        topic = general_topic(split, rng)
        assert topic in own_topics or topic.removeprefix("visiting ") in own_cities


def test_general_prompts_are_deterministic_and_varied():
    first = [general_prompt("train", np.random.default_rng(i))[0]["content"] for i in range(200)]
    again = [general_prompt("train", np.random.default_rng(i))[0]["content"] for i in range(200)]
    assert first == again
    assert len(set(first)) > 190  # a one-topic template can repeat
    used = {
        name
        for name, text in TEMPLATES.items()
        for prompt in first
        if re.fullmatch(re.sub(r"\\\{\w+\\\}", ".+", re.escape(text)), prompt, re.S)
    }
    assert len(used) > len(TEMPLATES) // 2
