"""General-knowledge requests: everyday and academic topics that the shipped documents lack.

The corpus's own topics come from its documents (Python docs, the standard library, Shakespeare);
MT-Bench-like chat asks about cooking, a trip or the economy. This module gives the ``general``
kind of the prompt mix (``specdec.training.selfinstruct``): a topic from ``TOPICS``
(our own list of subject areas, never the benchmark prompts) or a city from the IANA time-zone names
that ship with Python (``zoneinfo``), asked about through a request template (``TEMPLATES``) or,
through ``selfinstruct``, by the target itself. A topic's split is a hash of its name, like a
document's, so held-out prompts ask about topics that no training prompt names.
(Whether topics explain the gap between held-out and MT-Bench tokens per step was measured: they do
not; docs/training-results.md, "Everyday topics".)
"""

from __future__ import annotations

import functools
import zoneinfo

import numpy as np

from specdec.training.corpus import _choose, _split_of

__all__ = ["ROLES", "TEMPLATES", "TOPICS", "general_prompt", "general_topic"]

TOPICS = tuple(
    sorted(
        set(
            """
healthy breakfast ideas|baking bread at home|vegetarian cooking|street food|coffee|tea ceremonies|
spices|food waste|growing tomatoes|houseplants|composting|beekeeping|keeping chickens|
adopting a dog|training a cat|aquariums|bird watching|hiking|camping in the mountains|road trips|
traveling on a budget|learning to swim|running a marathon|yoga|meditation|sleep|stress at work|
public speaking|job interviews|writing a resume|remote work|starting a small business|saving money|
budgeting|credit cards|buying a first home|renting an apartment|retirement savings|inflation|
interest rates|supply and demand|the stock market|cryptocurrency|international trade|minimum wage|
unemployment|taxes|online shopping|advertising|social media|smartphones|video games|electric cars|
public transport|cycling in cities|air travel|high-speed trains|renewable energy|solar panels|
wind power|nuclear power|climate change|recycling|plastic pollution|ocean currents|coral reefs|
rainforests|deserts|volcanoes|earthquakes|hurricanes|glaciers|the water cycle|photosynthesis|
the human immune system|vaccines|antibiotics|the human heart|the brain|nutrition|vitamins|genetics|
evolution|dinosaurs|black holes|the solar system|the Moon landing|Mars exploration|telescopes|
gravity|electricity|magnetism|light and color|sound waves|atoms|chemical reactions|
the periodic table|acids and bases|plate tectonics|weather forecasting|artificial intelligence|
machine learning|the internet|cybersecurity|passwords|robots|3D printing|quantum computers|
databases|spreadsheets|smart homes|the printing press|the Industrial Revolution|ancient Egypt|
ancient Greece|the Roman Empire|the Silk Road|the Renaissance|the Middle Ages|the French Revolution|
the American Revolution|the Cold War|the invention of the telephone|the history of medicine|
the history of money|world religions|democracy|human rights|the United Nations|free speech|
ethics of technology|philosophy of mind|stoicism|happiness|friendship|kindness|leadership|teamwork|
negotiation|conflict resolution|parenting|education reform|homeschooling|learning a second language|
reading habits|libraries|poetry|novels|science fiction|mystery stories|fairy tales|theater|
classical music|jazz|learning the guitar|painting|photography|architecture|museums|fashion|
film making|animation|comic books|board games|chess|soccer|basketball|tennis|the Olympic Games|
volunteering|city planning|traffic|housing prices|aging populations|immigration|tourism|small towns|
farming|fishing|forests|wildlife conservation|endangered species|zoos|national parks|
bees and pollination|time management|procrastination|habits|goal setting|memory|creativity|
critical thinking|decision making|birthdays|weddings|holidays|gift giving|moving to a new city|
first day at school|customer service|restaurants|hotels|airports|hospitals|fire safety|first aid|
road safety|personal privacy|misinformation
""".replace("\n", "").split("|")
        )
        - {""}
    )
)

ROLES = (
    "a chef",
    "a detective",
    "a pilot",
    "a museum guide",
    "a park ranger",
    "a teacher",
    "a doctor",
    "a travel agent",
    "a sports coach",
    "a librarian",
    "a ship captain",
    "a shopkeeper",
    "a scientist",
    "a news reporter",
    "a personal trainer",
    "a job interviewer",
    "a tour guide",
    "an astronaut",
    "a farmer",
    "a career counselor",
    "a film critic",
    "a software engineer",
    "a historian",
    "a judge",
)

TEMPLATES = {  # our own phrasings of everyday requests; {topic} and {place} are filled in
    "blog": "Write a short blog post about {topic}.",
    "travel": "Write a travel blog post about a trip to {place}.",
    "plan": "Plan a three-day trip to {place}. What should a visitor see and eat?",
    "email": "Write a short email to a friend about {topic}.",
    "persuade": "Write a persuasive paragraph arguing that {topic} deserves more attention.",
    "poem": "Write a short poem about {topic}.",
    "story": "Write a short story that involves {topic}.",
    "roleplay": "Pretend you are {role}. Someone asks you about {topic}. How do you answer?",
    "act": "Act as {role} and give me three pieces of advice about {topic}.",
    "explain": "Explain {topic} to a ten-year-old.",
    "what": "What is the most important thing to know about {topic}?",
    "facts": "Give me five interesting facts about {topic}.",
    "pros": "What are the pros and cons of {topic}?",
    "compare": "Compare {topic} and {other}. What do they have in common?",
    "history": "Briefly describe the history of {topic}.",
    "future": "How might {topic} change over the next twenty years?",
    "tips": "What are some practical tips for {topic}?",
    "mistakes": "What are common mistakes people make with {topic}, and how can they be avoided?",
    "outline": "Write an outline for a presentation on {topic}.",
    "summary": "Summarize the main debates about {topic} in a few sentences.",
    "questions": "Write three quiz questions about {topic}, with answers.",
    "json": (
        "List three key ideas about {topic} as a JSON array of objects with \"idea\" and \"why\" "
        "fields."
    ),
    "words": "Describe {topic} in exactly three sentences.",
    "cost": "A ticket to {place} costs ${a} and a hotel costs ${b} per night. How much do {n} "
    "nights and the ticket cost? Explain your answer.",
    "rate": "A shop sells {a} items on Monday and {b} more each day after that. How many items "
    "does it sell on day {n}, and in total over those {n} days?",
    "logic": "Three friends like {topic}, {other} and {third}, one each. Ana does not like "
    "{third}, and Ben likes {other}. Who likes what? Explain your reasoning.",
}


@functools.lru_cache(maxsize=1)
def places() -> tuple[str, ...]:
    """City names from the IANA time-zone database that ships with Python
    ("Europe/Paris" -> "Paris")."""
    names = set()
    for zone in zoneinfo.available_timezones():
        area, _, city = zone.partition("/")
        if (
            area
            in {"Africa", "America", "Asia", "Atlantic", "Australia", "Europe", "Indian", "Pacific"}
            and city
            and "/" not in city
            and not any(ch.isdigit() for ch in city)
        ):
            names.add(city.replace("_", " "))
    return tuple(sorted(names))


@functools.lru_cache(maxsize=4)
def _of_split(split: str) -> tuple[tuple[str, ...], tuple[str, ...]]:
    topics = tuple(t for t in TOPICS if _split_of("topic:" + t) == split)
    cities = tuple(p for p in places() if _split_of("place:" + p) == split)
    return topics, cities


def general_topic(split: str, rng: np.random.Generator) -> str:
    """A topic of ``split``: one of ``TOPICS`` (or, one time in eight, a city)."""
    topics, cities = _of_split(split)
    return (
        f"visiting {_choose(rng, cities)}"
        if cities and rng.random() < 0.125
        else _choose(rng, topics)
    )


def general_prompt(split: str, rng: np.random.Generator) -> list[dict]:
    """One everyday request of ``split`` as a one-turn chat (module docstring)."""
    topics, cities = _of_split(split)
    name = _choose(rng, list(TEMPLATES))
    topic = _choose(rng, topics)
    other, third = rng.choice([t for t in topics if t != topic], size=2, replace=False)
    a, b, n = int(rng.integers(20, 900)), int(rng.integers(3, 60)), int(rng.integers(2, 9))
    text = TEMPLATES[name].format(
        topic=topic,
        other=other,
        third=third,
        role=_choose(rng, ROLES),
        place=_choose(rng, cities or topics),
        a=a,
        b=b,
        n=n,
    )
    return [{"role": "user", "content": text}]
