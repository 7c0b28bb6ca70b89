"""``specdec teacher``: the model's own greedy answers written as the token sequences
``specdec train --data`` reads, resumable from its parts (``specdec.training.answers``)."""

from __future__ import annotations

import json

import numpy as np
import pytest

pytest.importorskip("torch")

import specdec  # noqa: E402
from specdec.cli.main import main  # noqa: E402
from specdec.errors import InvalidInputError  # noqa: E402
from specdec.training import answers  # noqa: E402


@pytest.fixture
def prompts_file(tmp_path):
    path = tmp_path / "prompts.jsonl"
    lines = [
        {"messages": [{"role": "user", "content": "hello there"}]},
        {"prompt": "a b c"},
        {
            "messages": [
                {"role": "user", "content": "x"},
                {"role": "assistant", "content": "y"},
                {"role": "user", "content": "z"},
            ]
        },
    ]
    path.write_text("\n".join(json.dumps(line) for line in lines) + "\n")
    return path


def test_answers_are_plain_greedy_decoding_written_as_sequences(model_dir, prompts_file, tmp_path):
    out = tmp_path / "teacher.npz"
    args = [
        "teacher",
        "--model",
        str(model_dir),
        "--prompts",
        str(prompts_file),
        "--max-new-tokens",
        "9",
        "--batch-size",
        "2",
        "--dtype",
        "float32",
        "--out",
        str(out),
    ]
    assert main(args) == 0
    with np.load(out) as data:
        tokens, prompt_lengths = data["tokens"].astype(np.int64), data["prompt_lengths"]
        answer_lengths, source = data["response_lengths"], data["source"]
    assert len(prompt_lengths) == 3 and set(source.tolist()) == {answers.SOURCES.index("file")}
    target = specdec.load(model_dir, backend="torch", dtype="float32")
    ends = np.cumsum(prompt_lengths + answer_lengths)
    chats = [json.loads(line) for line in prompts_file.read_text().splitlines()]
    for end, p, n, chat in zip(ends, prompt_lengths, answer_lengths, chats):
        prompt = chat.get("messages") or chat["prompt"]
        plain = specdec.generate(target, prompt, drafter="none", max_new_tokens=9)
        start = end - p - n
        assert tokens[start + p : end].tolist() == plain.tokens
    assert not (tmp_path / ".teacher.npz.parts").exists()  # parts removed once written
    assert main(args) != 0  # --out exists: refused without --overwrite


def test_a_killed_run_continues_from_its_parts(model_dir, prompts_file, tmp_path, monkeypatch):
    target = specdec.load(model_dir, backend="torch", dtype="float32", slots=2)
    ids = answers.file_prompts(target, prompts_file)
    parts = tmp_path / "parts"
    first = answers.decode_answers(target, ids, max_new_tokens=5, chunk=2, parts=parts)
    assert len(list(parts.glob("answers-*.npz"))) == 2
    calls = []
    real = specdec.generate
    monkeypatch.setattr(specdec, "generate", lambda *a, **k: calls.append(1) or real(*a, **k))
    (parts / sorted(p.name for p in parts.glob("answers-*.npz"))[-1]).unlink()  # killed there
    again = answers.decode_answers(target, ids, max_new_tokens=5, chunk=2, parts=parts)
    assert again == first and len(calls) == 1  # only the missing part decoded again


def test_self_requests_sit_in_the_chat_templates_user_turn(model_dir, monkeypatch):
    target = specdec.load(model_dir, backend="torch", dtype="float32", slots=4)
    before, after = answers.open_user_turn(target.chat_template)
    rendered = specdec.generation.chat.render_chat(
        target.chat_template, [{"role": "user", "content": "REQ"}]
    )
    assert rendered == before + "REQ" + after
    monkeypatch.setattr(answers, "REQUEST_TOKENS", 3)  # a random model rarely ends its turn
    with pytest.raises(InvalidInputError, match="no request that ended its user turn"):
        answers.self_prompts(target, 1, seed=0, batch_size=4)
