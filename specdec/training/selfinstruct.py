"""More varied teacher prompts: requests the target writes itself, everyday topics, and plain text.

A drafter trained on a few thousand template requests learns those templates' answers and little
else (72% top-1 on its training positions against 36% held out), and the corpus's own topics are
Python and Shakespeare. Three more kinds of prompt widen what it sees, at no cost in data that
ships:

- **self-instruct**: the target is asked, as a chat, to write one request of a given kind
  (writing, role-play, reasoning, a math word problem, coding, extraction, STEM, humanities)
  about a topic drawn from a corpus document (``specdec.training.instructions``); its greedy
  reply, cleaned (``clean_request``), becomes the user turn that the teacher then answers. The
  requests are the target's own, in its own words, never the benchmark prompts.
- **general**: an everyday or academic topic (``specdec.training.topics``: cooking, a trip to a
  city, inflation, volcanoes, ...), half the time asked about through one of our request
  templates, half the time through a request the target writes as above.
- **plain text**: a corpus prompt's text with no chat template around it, which the target
  continues as a completion, as ``specdec.generate(model, "some text")`` does.

``MixedPrompts`` deals prompt i of a split to one of the four kinds (``MIX_KINDS``) with its own
generator seeded by (seed, split, i), so the stream is deterministic and prefix-stable like the
corpus's; a target-written request that cleans to nothing falls back to the corpus prompt of the
same index (self-instruct) or to the template request (general).
"""

from __future__ import annotations

import re
from typing import Sequence

import numpy as np

from specdec.training.corpus import SPLITS, Corpus

__all__ = [
    "DEFAULT_MIX",
    "KINDS",
    "MIX_KINDS",
    "MixedPrompts",
    "check_mix",
    "clean_request",
    "meta_request",
]

MIX_VERSION = (
    3  # bump when the kinds, the meta prompt or the cleaning change: it keys the teacher cache
)
MIX_KINDS = ("corpus", "self_instruct", "general", "plain")
DEFAULT_MIX = (("corpus", 0.3), ("self_instruct", 0.15), ("general", 0.35), ("plain", 0.2))
REQUEST_TOKENS = 64  # the longest request the target writes

KINDS = {  # the kind of request, as the meta prompts name it
    "writing": "a creative writing",
    "roleplay": "a role-play",
    "reasoning": "a logic puzzle",
    "math": "a math word problem",
    "coding": "a Python programming",
    "extraction": "an information extraction",
    "stem": "a science or technology",
    "humanities": "a history or philosophy",
}
# phrasings a 135M chat model answers with a request (the second, quoted after "could ask:")
META = (
    "Write {kind} question that someone might ask about {topic}. Write only the question.",
    (
        "Give an example of {kind} task about {topic} that a user could ask an assistant to do. "
        "Reply with the task only."
    ),
)
_QUOTED = re.compile(r"(?:\b(?:ask|send|request)s?\s*:?|:)\s*[\"“]([^\"”]{15,600})[\"”]", re.I)
_LABEL = re.compile(
    r"^\s*(?:\*\*)?(?:user request|request|user|question|prompt|task)\s*[:\-]\s*(?:\*\*)?\s*", re.I
)
_NOT_A_REQUEST = re.compile(
    r"^(?:i'?m (?:sorry|ready|here|happy)|i cannot|i can't|as an ai|sure\b|here is|here's|what a\b|"
    r"certainly|of course|hello|hi\b)",
    re.I,
)


def check_mix(mix: Sequence) -> None:
    """Refuse a prompt mix that is not (kind, share) pairs of ``MIX_KINDS`` with non-negative
    shares summing to more than 0 (``InvalidInputError``, a ``ValueError``)."""
    from specdec.errors import InvalidInputError

    unknown = {kind for kind, _ in mix} - set(MIX_KINDS)
    if unknown or not mix or any(share < 0 for _, share in mix) or sum(s for _, s in mix) <= 0:
        raise InvalidInputError(
            f"mix must give non-negative shares of {', '.join(MIX_KINDS)}; got {mix!r}"
        )


def meta_request(kind: str, topic: str, phrasing: int = 0) -> list[dict]:
    """The chat that asks the target for one request of ``kind`` about ``topic``."""
    return [
        {
            "role": "user",
            "content": META[phrasing % len(META)].format(kind=KINDS[kind], topic=topic),
        }
    ]


def clean_request(text: str) -> str | None:
    """The request in a target's reply, or None when there is none: a request quoted after "could
    ask:" is taken out, otherwise the first line; a label ("Question:") and surrounding quotes are
    removed; a reply that greets, refuses or introduces an answer is dropped; the request must be
    15 to 600 characters and hold a word."""
    quoted = _QUOTED.search(text)
    text = quoted.group(1) if quoted else text.strip().split("\n", 1)[0]
    text = _LABEL.sub("", text.strip(), count=1).strip()
    if len(text) >= 2 and text[0] in "\"'“" and text[-1] in "\"'”":
        text = text[1:-1].strip()
    if _NOT_A_REQUEST.match(text) or not re.search(r"[A-Za-z]{3}", text):
        return None
    return text if 15 <= len(text) <= 600 else None


class MixedPrompts:
    """A prompt source (``split, start, count -> prompts``) mixing corpus chats, self-instruct
    chats and plain-text token ids (module docstring), for ``build_teacher_data``.

    corpus: the prompt corpus; target: the ``TeacherTarget`` that writes the requests and
    encodes plain text; mix: (kind, share) pairs; seed: the stream's seed.
    """

    def __init__(
        self,
        corpus: Corpus,
        target,
        *,
        seed: int = 0,
        mix: Sequence = DEFAULT_MIX,
        batch_size: int = 64,
    ):
        check_mix(mix)
        self.corpus, self.target, self.seed, self.batch_size = (
            corpus,
            target,
            int(seed),
            int(batch_size),
        )
        self.mix = tuple((kind, float(share)) for kind, share in mix)
        self.stats = {**{kind: 0 for kind in MIX_KINDS}, "written_by_target": 0, "fallback": 0}

    def key(self) -> dict:
        """What identifies this prompt stream in the teacher-data cache."""
        return {
            "mix": MIX_VERSION,
            "shares": [list(item) for item in self.mix],
            "request_tokens": REQUEST_TOKENS,
        }

    def kind_of(self, index: int, split: str) -> str:
        rng = np.random.default_rng([self.seed, SPLITS[split], index, 7])
        shares = np.array([share for _, share in self.mix])
        return self.mix[int(rng.choice(len(shares), p=shares / shares.sum()))][0]

    def __call__(self, split: str, start: int, count: int) -> list:
        from specdec.training.corpus import build_prompts
        from specdec.training.instructions import _topics
        from specdec.training.topics import general_prompt, general_topic

        base = build_prompts(self.corpus, count, split=split, seed=self.seed, start=start)
        prompts: list = []
        asked: list[tuple[int, list[dict], list[dict]]] = []  # (offset, meta chat, fallback chat)
        for offset, prompt in enumerate(base):
            index = start + offset
            kind = self.kind_of(index, split)
            if kind == "plain":
                prompts.append(list(self.target.tokenizer.encode(prompt.text).ids))
            elif kind == "self_instruct":
                rng = np.random.default_rng([self.seed, SPLITS[split], index, 11])
                request_kind = list(KINDS)[int(rng.integers(len(KINDS)))]
                ((_, topic),) = _topics(self.corpus, split, rng, 1)
                asked.append(
                    (
                        offset,
                        meta_request(request_kind, topic, phrasing=int(rng.integers(len(META)))),
                        list(prompt.messages),
                    )
                )
                prompts.append(None)
            elif kind == "general":  # an everyday topic: half the requests written by the target
                rng = np.random.default_rng([self.seed, SPLITS[split], index, 13])
                fallback = general_prompt(split, rng)
                if rng.random() < 0.5:
                    request_kind = list(KINDS)[int(rng.integers(len(KINDS)))]
                    asked.append(
                        (
                            offset,
                            meta_request(
                                request_kind,
                                general_topic(split, rng),
                                phrasing=int(rng.integers(len(META))),
                            ),
                            fallback,
                        )
                    )
                    prompts.append(None)
                else:
                    prompts.append(fallback)
            else:
                prompts.append(list(prompt.messages))
            self.stats[kind] += 1
        for (offset, _, fallback), reply in zip(
            asked, self._replies([messages for _, messages, _ in asked])
        ):
            request = clean_request(reply)
            if request is None:
                prompts[offset] = fallback
                self.stats["fallback"] += 1
            else:
                prompts[offset] = [{"role": "user", "content": request}]
                self.stats["written_by_target"] += 1
        return prompts

    def _replies(self, chats: list[list[dict]]) -> list[str]:
        """The target's greedy replies to ``chats`` (at most REQUEST_TOKENS tokens each)."""
        if not chats:
            return []
        from specdec.training.teacher import greedy_teacher

        ids = [self.target.encode(chat) for chat in chats]
        data = greedy_teacher(
            self.target.model,
            ids,
            max_new_tokens=REQUEST_TOKENS,
            top_k=1,
            eos_token_ids=self.target.eos_token_ids,
            batch_size=self.batch_size,
        )
        tokens, sequence = data.next_tokens.tolist(), data.sequence.tolist()
        eos = set(self.target.eos_token_ids)
        replies: list[list[int]] = [[] for _ in chats]
        for token, row in zip(tokens, sequence):
            if token not in eos:
                replies[row].append(token)
        return [self.target.tokenizer.decode(reply) for reply in replies]
