"""Teacher data from token sequences (``specdec.training.sequences``): one teacher-forced forward
per sequence gives the records greedy decoding gives at the same positions, chats become one
sequence per assistant turn, and the cached shards resume and split by sequence."""

from __future__ import annotations

import json

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from specdec.cli.main import main  # noqa: E402
from specdec.errors import InvalidInputError  # noqa: E402
from specdec.training.sequences import (  # noqa: E402
    SequenceSettings,
    read_sequences,
    sequence_datasets,
    teacher_forced,
)
from specdec.training.teacher import (  # noqa: E402
    _decoding_target,
    greedy_teacher,
    load_teacher_target,
)

VOCAB = 64


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    from specdec.testing import make_random_model

    return make_random_model(
        tmp_path_factory.mktemp("sequences") / "llama",
        vocab_size=VOCAB,
        hidden_size=32,
        num_layers=3,
        num_heads=4,
        num_kv_heads=2,
        seed=3,
        eos_token_id=3,
        tie_word_embeddings=False,
        with_tokenizer=True,
    )


@pytest.fixture(scope="module")
def target(folder):
    return load_teacher_target(folder, dtype="float32")


def _prompts(count: int, seed: int = 0) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    return [
        [int(t) for t in rng.integers(4, VOCAB, size=int(rng.integers(3, 12)))]
        for _ in range(count)
    ]


def _answers(decoded, count: int) -> list[np.ndarray]:
    starts = list(decoded.starts().tolist()) + [decoded.num_positions]
    return [decoded.next_tokens[starts[i] : starts[i + 1]].numpy() for i in range(count)]


def _write_npz(path, prompts, answers):
    np.savez(
        path,
        tokens=np.concatenate([np.concatenate([p, a]) for p, a in zip(prompts, answers)]).astype(
            np.uint16
        ),
        prompt_lengths=np.array([len(p) for p in prompts], dtype=np.int32),
        response_lengths=np.array([len(a) for a in answers], dtype=np.int32),
    )
    return path


def test_teacher_forced_records_equal_what_greedy_decoding_records(tmp_path_factory):
    """The same positions, fed the target's own greedy answers: the same hidden states and
    layers bit for bit (exact mode: a row's results do not depend on the chunking), the same
    next tokens and soft labels, whatever the forward budget packs together."""
    from specdec.testing import make_random_model

    # SmolLM2-135M's widths in bfloat16, where this kind of CPU's kernels keep exact mode
    folder = make_random_model(
        tmp_path_factory.mktemp("exact-sequences") / "llama",
        vocab_size=512,
        hidden_size=576,
        intermediate_size=1536,
        num_layers=3,
        num_heads=9,
        num_kv_heads=3,
        seed=11,
        eos_token_id=3,
    )
    target = load_teacher_target(folder, dtype="bfloat16")
    check = _decoding_target(target.model, slots=1, capacity=8).check_row_invariance()
    if not check.holds:
        pytest.skip(f"exact mode does not hold on this machine: {check.failed}")
    prompts = [[int(t) for t in rng] for rng in np.random.default_rng(5).integers(4, 512, (6, 9))]
    decoded = greedy_teacher(
        target.model,
        prompts,
        max_new_tokens=12,
        top_k=5,
        eos_token_ids=target.eos_token_ids,
        batch_size=3,
        hidden_dtype=torch.bfloat16,
        layers=(0, 2),
        exact=True,
    )
    answers = _answers(decoded, len(prompts))
    for budget in (7, 2048):  # chunks that cut sequences, and whole sequences packed together
        settings = SequenceSettings(top_k=5, layers=(0, 2), budget=budget, slots=4, exact=True)
        forced = teacher_forced(target, [np.asarray(p) for p in prompts], answers, settings)
        assert torch.equal(forced.next_tokens, decoded.next_tokens)
        assert torch.equal(forced.sequence, decoded.sequence)
        assert torch.equal(forced.remaining, decoded.remaining)
        assert torch.equal(forced.hidden, decoded.hidden)
        assert torch.equal(forced.layers, decoded.layers)
        assert torch.equal(forced.label_ids[:, 0], decoded.next_tokens)  # greedy: top-1 is next
        assert torch.allclose(forced.label_probs.float(), decoded.label_probs.float(), atol=1e-3)


def test_chats_become_one_sequence_per_assistant_turn(target, tmp_path):
    from specdec.generation.chat import render_chat

    chat = [
        {"role": "user", "content": "a b"},
        {"role": "assistant", "content": "c d e"},
        {"role": "user", "content": "f"},
        {"role": "assistant", "content": "g h"},
    ]
    path = tmp_path / "logs.jsonl"
    path.write_text(
        json.dumps({"messages": chat}) + "\n\n" + json.dumps({"messages": chat[:2]}) + "\n"
    )
    sequences = read_sequences([path], target)
    assert len(sequences) == 2 and sequences.dropped_repeats == 1  # the second chat repeats turn 1
    for turn, prompt, answer in zip((1, 3), sequences.prompts, sequences.answers):
        assert (
            prompt.tolist()
            == target.tokenizer.encode(render_chat(target.chat_template, chat[:turn])).ids
        )
        full = render_chat(target.chat_template, chat[: turn + 1], add_generation_prompt=False)
        assert target.tokenizer.decode(answer.tolist()) in full and len(answer) > 0
    path.write_text('{"messages": "not a chat"}\n')
    with pytest.raises(InvalidInputError, match="line 1.*messages"):
        read_sequences([path], target)
    bad = _write_npz(tmp_path / "big.npz", [np.array([1, 2])], [np.array([VOCAB + 5])])
    with pytest.raises(InvalidInputError, match="beyond the model's vocabulary"):
        read_sequences([bad], target)


def test_datasets_split_by_sequence_are_cached_and_resume(target, tmp_path, monkeypatch, capsys):
    prompts = [np.asarray(p) for p in _prompts(40, seed=1)]
    rng = np.random.default_rng(2)
    answers = [rng.integers(4, VOCAB, size=int(rng.integers(2, 9))) for _ in prompts]
    files = [
        _write_npz(tmp_path / "a.npz", prompts[:25], answers[:25]),
        _write_npz(tmp_path / "b.npz", prompts[20:], answers[20:]),  # 5 repeated prompts
    ]
    settings = SequenceSettings(top_k=4, shard_size=8, hidden_dtype="float32")
    cache = tmp_path / "cache"
    datasets, stats, _ = sequence_datasets(
        target, files, heldout=6, settings=settings, cache=cache, progress=False
    )
    assert stats["sequences"] == 40 and stats["repeated_prompts_dropped"] == 5
    assert datasets["heldout"].num_sequences == 6 and datasets["train"].num_sequences == 34
    assert stats["shards_made"] == 1 + 5 and stats["positions_made"] == sum(len(a) for a in answers)
    said = capsys.readouterr().err  # quiet: a line per shard made
    assert "records heldout: shard 1 of 1 made" in said and "records train: shard 5 of 5" in said
    held = {
        tuple(datasets["heldout"].next_tokens[i : i + 2].tolist())
        for i in datasets["heldout"].starts().tolist()
    }
    trained = {
        tuple(datasets["train"].next_tokens[i : i + 2].tolist())
        for i in datasets["train"].starts().tolist()
    }
    assert not held & trained  # no sequence in both splits
    # a second run computes nothing: every shard is read back, the same records
    calls = []
    monkeypatch.setattr(
        "specdec.training.sequences.teacher_forced", lambda *a, **k: calls.append(1)
    )
    again, stats, _ = sequence_datasets(
        target, files, heldout=6, settings=settings, cache=cache, progress=False
    )
    assert not calls and stats["shards_reused"] == 6
    assert torch.equal(again["train"].hidden, datasets["train"].hidden)
    # a smaller budget takes the first training sequences, from the same shards
    part, _, _ = sequence_datasets(
        target, files, heldout=6, max_positions=20, settings=settings, cache=cache, progress=False
    )
    first = part["train"]
    assert 20 <= first.num_positions < 20 + 9 and not calls
    assert torch.equal(first.hidden, datasets["train"].hidden[: first.num_positions])


def test_the_cli_refuses_data_beside_decoding_options(tmp_path, capsys):
    status = main(
        [
            "train",
            "medusa",
            "--model",
            "smollm2-135m",
            "--out",
            str(tmp_path / "o"),
            "--minutes",
            "1",
            "--data",
            "x.npz",
            "--prompts",
            "10",
        ]
    )
    assert status != 0 and "--data" in capsys.readouterr().err
