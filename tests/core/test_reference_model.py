"""The float64 reference target: tree attention, commit, ragged batches, request slots, loading.

Most tests drive a fixed batch (``specdec.testing.batch.Batch``: prompt b in slot b); the slot
tests admit, run and release slots directly."""

from __future__ import annotations

import json
import struct

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from specdec.reference import model as model_module
from specdec.models.llama import LlamaConfig, read_safetensors
from specdec.reference.model import load_target
from specdec.testing.batch import Batch
from specdec.testing.models import make_random_model
from specdec.types import DraftTree, Verdict

VOCAB = 48
TOL = 1e-10


def make_tree(rows: list[tuple[list[int], list[int]]]) -> DraftTree:
    """A padded DraftTree from per-row (tokens, parents); padding nodes hang off the root."""
    batch, size = len(rows), max(len(tokens) for tokens, _ in rows)
    tokens = np.zeros((batch, size), dtype=np.int64)
    parents = np.zeros((batch, size), dtype=np.int64)
    depth = np.zeros((batch, size), dtype=np.int64)
    mask = np.zeros((batch, size, size), dtype=bool)
    for b, (row_tokens, row_parents) in enumerate(rows):
        for i in range(size):
            parent = row_parents[i] if i < len(row_tokens) else (0 if i else -1)
            parents[b, i] = parent
            tokens[b, i] = row_tokens[i] if i < len(row_tokens) else 0
            if i:
                depth[b, i] = depth[b, parent] + 1
                mask[b, i] = mask[b, parent]
            mask[b, i, i] = True
    num_nodes = np.array([len(tokens_) for tokens_, _ in rows], dtype=np.int64)
    return DraftTree(
        tokens=tokens, parents=parents, depth=depth, ancestor_mask=mask, num_nodes=num_nodes
    )


def path_to(parents: list[int], node: int) -> list[int]:
    path = [node]
    while path[-1] != 0:
        path.append(parents[path[-1]])
    return path[::-1]


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("models")
    small = dict(vocab_size=VOCAB, hidden_size=32, num_layers=2, seed=3)
    found = {
        "llama-gqa-tied": make_random_model(root / "a", num_heads=4, num_kv_heads=2, **small),
        "llama-mha-untied": make_random_model(
            root / "b", num_heads=4, num_kv_heads=4, tie_word_embeddings=False, **small
        ),
        "qwen2-bias": make_random_model(
            root / "c", num_heads=4, num_kv_heads=1, architecture="qwen2", **small
        ),
    }
    mistral = make_random_model(root / "d", num_heads=2, num_kv_heads=1, **small)
    config = json.loads((mistral / "config.json").read_text())
    config.update(model_type="mistral", architectures=["MistralForCausalLM"], sliding_window=5)
    (mistral / "config.json").write_text(json.dumps(config))
    found["mistral-window"] = mistral
    return found


MAX_ROWS, MAX_NODES = 3, 6  # prompts_st and tree_rows below
# positions per slot: the longest context (a prompt, two commits and a tree) is 9 + 2 * 6 + 6
CAPACITY = 64


@pytest.fixture(scope="module")
def targets(folders):
    """Fixed batches over targets with a slot for every node of the largest tree (the prefill
    check runs one sequence per node)."""
    return {
        name: Batch(load_target(folder, slots=MAX_ROWS * MAX_NODES, capacity=CAPACITY))
        for name, folder in folders.items()
    }


MODEL_NAMES = ["llama-gqa-tied", "llama-mha-untied", "qwen2-bias", "mistral-window"]

prompts_st = st.lists(
    st.lists(st.integers(0, VOCAB - 1), min_size=1, max_size=9), min_size=1, max_size=MAX_ROWS
)


@st.composite
def tree_rows(draw, batch: int, max_nodes: int = MAX_NODES):
    rows = []
    for _ in range(batch):
        size = draw(st.integers(1, max_nodes))
        parents = [-1] + [draw(st.integers(0, i - 1)) for i in range(1, size)]
        tokens = draw(st.lists(st.integers(0, VOCAB - 1), min_size=size, max_size=size))
        rows.append((tokens, parents))
    return rows


def check_tree_against_prefill(target, tree_rows_, contexts, out, label):
    """Every real node's output equals a fresh prefill of its row's context + the path to it."""
    sequences, where = [], []
    for b, (tokens, parents) in enumerate(tree_rows_):
        for i in range(len(tokens)):
            sequences.append(contexts[b] + [tokens[j] for j in path_to(parents, i)])
            where.append((b, i))
    fresh = target.prefill(sequences)
    for k, (b, i) in enumerate(where):
        np.testing.assert_allclose(
            out.logits[b, i],
            fresh.logits[k, 0],
            rtol=0,
            atol=TOL,
            err_msg=f"forward_tree logits, {label}, row {b} node {i}, sequence {sequences[k]}",
        )
        np.testing.assert_allclose(
            out.hidden[b, i],
            fresh.hidden[k, 0],
            rtol=0,
            atol=TOL,
            err_msg=f"forward_tree hidden, {label}, row {b} node {i}, sequence {sequences[k]}",
        )


@pytest.mark.parametrize("name", MODEL_NAMES)
@settings(derandomize=True, deadline=None, max_examples=8)
@given(data=st.data())
def test_tree_forward_matches_prefill_of_each_path(targets, name, data):
    target = targets[name]
    prompts = data.draw(prompts_st)
    rows = data.draw(tree_rows(len(prompts)))
    target.prefill(prompts)
    tree = make_tree(rows)
    out = target.forward_tree(tree)
    assert out.logits.shape == (len(prompts), tree.size, VOCAB) and out.hidden.shape == (
        len(prompts),
        tree.size,
        32,
    )
    np.testing.assert_array_equal(
        target.cache_lengths,
        [len(p) for p in prompts],
        err_msg="forward_tree must not change the committed cache",
    )
    check_tree_against_prefill(
        target, rows, prompts, out, f"{name}, prompts {prompts}, tree {rows}"
    )


@pytest.mark.parametrize("name", ["llama-gqa-tied", "qwen2-bias", "mistral-window"])
@settings(derandomize=True, deadline=None, max_examples=6)
@given(data=st.data())
def test_commit_then_next_tree_matches_prefill(targets, name, data):
    target = targets[name]
    prompts = data.draw(prompts_st)
    contexts = [list(p) for p in prompts]
    target.prefill(prompts)
    for step in range(2):
        rows = data.draw(tree_rows(len(prompts)))
        tree = make_tree(rows)
        out = target.forward_tree(tree)
        check_tree_against_prefill(
            target, rows, contexts, out, f"{name}, step {step}, contexts {contexts}, tree {rows}"
        )
        target.prefill(
            contexts
        )  # the check above replaced the cache: rebuild it, then rerun the tree
        target.forward_tree(tree)
        accepted = [
            path_to(parents, data.draw(st.integers(0, len(tokens) - 1))) for tokens, parents in rows
        ]
        path = np.full((len(rows), tree.size), -1, dtype=np.int64)
        for b, nodes in enumerate(accepted):
            path[b, : len(nodes)] = nodes
        num_accepted = np.array([len(nodes) - 1 for nodes in accepted], dtype=np.int64)
        target.commit(
            tree,
            Verdict(
                path=path, num_accepted=num_accepted, bonus_tokens=np.zeros(len(rows), np.int64)
            ),
        )
        for b, nodes in enumerate(accepted):
            contexts[b] += [rows[b][0][j] for j in nodes]
        np.testing.assert_array_equal(
            target.cache_lengths,
            [len(c) for c in contexts],
            err_msg=f"commit of paths {accepted} on {name}",
        )
    rows = data.draw(tree_rows(len(prompts)))
    tree = make_tree(rows)
    out = target.forward_tree(tree)
    check_tree_against_prefill(
        target, rows, contexts, out, f"{name}, after commits, contexts {contexts}, tree {rows}"
    )


@pytest.mark.parametrize("name", ["llama-gqa-tied", "mistral-window"])
def test_ragged_batch_rows_equal_rows_alone(targets, name):
    target = targets[name]
    rng = np.random.default_rng(0)
    prompts = [rng.integers(0, VOCAB, size=n).tolist() for n in (3, 11, 7)]
    rows = [([5, 6, 7, 8], [-1, 0, 0, 1]), ([9], [-1]), ([1, 2, 3], [-1, 0, 1])]
    together = target.prefill(prompts)
    together_tree = target.forward_tree(make_tree(rows))
    for b, (prompt, row) in enumerate(zip(prompts, rows, strict=True)):
        alone = target.prefill([prompt])
        np.testing.assert_allclose(
            together.logits[b],
            alone.logits[0],
            rtol=0,
            atol=TOL,
            err_msg=f"prefill row {b}, {name}",
        )
        alone_tree = target.forward_tree(make_tree([row]))
        n = len(row[0])
        np.testing.assert_allclose(
            together_tree.logits[b, :n],
            alone_tree.logits[0, :n],
            rtol=0,
            atol=TOL,
            err_msg=f"forward_tree row {b} of a ragged batch vs alone, {name}",
        )


def test_chunked_prefill_equals_one_chunk(targets, monkeypatch):
    target = targets["llama-gqa-tied"]
    prompt = np.random.default_rng(1).integers(0, VOCAB, size=23).tolist()
    whole = target.prefill([prompt])
    monkeypatch.setattr(model_module, "PREFILL_CHUNK", 4)
    chunked = target.prefill([prompt])
    np.testing.assert_allclose(
        chunked.logits, whole.logits, rtol=0, atol=TOL, err_msg="prefill in chunks of 4"
    )


def test_heads_biases_and_attributes(targets):
    tied, untied, qwen2 = (
        targets["llama-gqa-tied"],
        targets["llama-mha-untied"],
        targets["qwen2-bias"],
    )
    assert tied.lm_head is tied.embed_tokens and tied.config.tie_word_embeddings
    assert untied.lm_head is not untied.embed_tokens and not np.allclose(
        untied.lm_head, untied.embed_tokens
    )
    assert qwen2.config.attention_bias and not qwen2.config.attention_out_bias
    assert qwen2.layers[0].q_bias is not None and qwen2.layers[0].o_bias is None
    assert tied.layers[0].q_bias is None and tied.config.num_key_value_heads == 2
    assert qwen2.config.num_key_value_heads == 1 and qwen2.config.num_attention_heads == 4
    for target in (tied, untied, qwen2):
        assert (
            target.embed_tokens.dtype == np.float64
            and target.vocab_size == VOCAB
            and target.hidden_size == 32
        )
        assert len(target.fingerprint) == 64 and all(
            c in "0123456789abcdef" for c in target.fingerprint
        )
    assert len({tied.fingerprint, untied.fingerprint, qwen2.fingerprint}) == 3


def test_fingerprint_stable_across_loads_and_seeds(tmp_path):
    kwargs = dict(vocab_size=20, hidden_size=16, num_layers=1, num_heads=2, num_kv_heads=1)
    a = load_target(make_random_model(tmp_path / "a", seed=1, **kwargs))
    b = load_target(make_random_model(tmp_path / "b", seed=1, **kwargs))
    c = load_target(make_random_model(tmp_path / "c", seed=2, **kwargs))
    assert a.fingerprint == b.fingerprint != c.fingerprint, "fingerprint of seeds 1, 1, 2"


def write_safetensors(path, tensors: dict[str, tuple[str, bytes, tuple[int, ...]]]) -> None:
    header, offset = {}, 0
    for name, (dtype, raw, shape) in tensors.items():
        header[name] = {
            "dtype": dtype,
            "shape": list(shape),
            "data_offsets": [offset, offset + len(raw)],
        }
        offset += len(raw)
    encoded = json.dumps(header).encode()
    with open(path, "wb") as f:
        f.write(
            struct.pack("<Q", len(encoded))
            + encoded
            + b"".join(raw for _, raw, _ in tensors.values())
        )


@pytest.mark.parametrize("stored", ["BF16", "F16"])
def test_load_low_precision_weights(tmp_path, stored):
    folder = make_random_model(
        tmp_path / "m",
        vocab_size=20,
        hidden_size=16,
        num_layers=1,
        num_heads=2,
        num_kv_heads=1,
        seed=4,
        tie_word_embeddings=False,
    )
    original = read_safetensors(folder / "model.safetensors")
    expected, converted = {}, {}
    for name, value in original.items():
        value32 = value.astype(np.float32)
        if stored == "BF16":
            bits = (value32.view(np.uint32) >> 16).astype("<u2")
            expected[name] = (bits.astype(np.uint32) << 16).view(np.float32).astype(np.float64)
        else:
            bits = value32.astype("<f2")
            expected[name] = bits.astype(np.float64)
        converted[name] = (stored, bits.tobytes(), value.shape)
    write_safetensors(folder / "model.safetensors", converted)
    target = load_target(folder)
    np.testing.assert_array_equal(
        target.embed_tokens,
        expected["model.embed_tokens.weight"],
        err_msg=f"{stored} embed_tokens decoded by load_target",
    )
    np.testing.assert_array_equal(
        target.layers[0].down_proj,
        expected["model.layers.0.mlp.down_proj.weight"],
        err_msg=f"{stored} down_proj decoded by load_target",
    )
    assert np.abs(target.lm_head - original["lm_head.weight"]).max() < 0.05, (
        f"{stored} lm_head near float32"
    )


def test_load_sharded_folder(tmp_path):
    folder = make_random_model(
        tmp_path / "m",
        vocab_size=20,
        hidden_size=16,
        num_layers=2,
        num_heads=2,
        num_kv_heads=1,
        seed=5,
        with_tokenizer=True,
        eos_token_id=2,
    )
    single = load_target(folder)
    tensors = read_safetensors(folder / "model.safetensors")
    (folder / "model.safetensors").unlink()
    names = sorted(tensors)
    weight_map = {}
    for shard, part in enumerate((names[::2], names[1::2])):
        file = f"model-0000{shard + 1}-of-00002.safetensors"
        write_safetensors(
            folder / file,
            {n: ("F32", tensors[n].astype("<f4").tobytes(), tensors[n].shape) for n in part},
        )
        weight_map.update({n: file for n in part})
    (folder / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    sharded = load_target(folder)
    assert sharded.fingerprint == single.fingerprint, (
        "sharded and single-file loads of the same weights"
    )
    assert sharded.eos_token_ids == (2,) and sharded.tokenizer is not None
    assert sharded.tokenizer.decode(sharded.tokenizer.encode("beba daba").ids) == "beba daba"


def test_config_parsing():
    base = dict(
        model_type="llama",
        vocab_size=10,
        hidden_size=8,
        intermediate_size=16,
        num_hidden_layers=1,
        num_attention_heads=2,
        eos_token_id=[1, 2],
        bos_token_id=0,
    )
    config = LlamaConfig.from_hf_dict(base)
    assert (
        config.head_dim == 4 and config.num_key_value_heads == 2 and config.eos_token_ids == (1, 2)
    )
    assert (
        config.rope_scaling is None and not config.attention_bias and not config.tie_word_embeddings
    )
    assert LlamaConfig.from_hf_dict(base, {"eos_token_id": 7}).eos_token_ids == (7,)
    assert LlamaConfig.from_hf_dict({**base, "eos_token_id": None}).eos_token_ids == ()
    qwen2 = LlamaConfig.from_hf_dict({**base, "model_type": "qwen2"})
    assert qwen2.attention_bias and not qwen2.attention_out_bias
    llama_bias = LlamaConfig.from_hf_dict({**base, "attention_bias": True})
    assert llama_bias.attention_bias and llama_bias.attention_out_bias
    scaled = LlamaConfig.from_hf_dict(
        {
            **base,
            "rope_theta": 500000.0,
            "rope_scaling": {
                "rope_type": "llama3",
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 8192,
            },
        }
    )
    assert scaled.rope_theta == 500000.0 and scaled.rope_scaling.factor == 8.0
    newer = LlamaConfig.from_hf_dict(
        {**base, "rope_parameters": {"rope_type": "default", "rope_theta": 1234.0}}
    )
    assert newer.rope_theta == 1234.0 and newer.rope_scaling is None


@pytest.mark.parametrize(
    "change, message",
    [
        ({"model_type": "gpt2"}, "llama, qwen2, mistral"),
        ({"rope_scaling": {"type": "yarn", "factor": 2.0}}, "'yarn' is not supported"),
        ({"hidden_act": "gelu"}, "hidden_act"),
        ({"num_key_value_heads": 3}, "multiple of num_key_value_heads"),
    ],
)
def test_config_rejects_unsupported(change, message):
    base = dict(
        model_type="llama",
        vocab_size=10,
        hidden_size=8,
        intermediate_size=16,
        num_hidden_layers=1,
        num_attention_heads=2,
    )
    with pytest.raises(ValueError, match=message):
        LlamaConfig.from_hf_dict({**base, **change})


def test_clear_errors(tmp_path, folders):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_target(tmp_path / "nowhere")
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="config.json"):
        load_target(tmp_path / "empty")
    folder = make_random_model(
        tmp_path / "m",
        vocab_size=20,
        hidden_size=16,
        num_layers=1,
        num_heads=2,
        num_kv_heads=1,
        seed=6,
    )
    (folder / "model.safetensors").unlink()
    with pytest.raises(FileNotFoundError, match="model.safetensors"):
        load_target(folder)
    for slots, capacity, message in [
        (0, 8, "slots must be a positive integer"),
        (True, 8, "slots must be"),
        (2, 1, "capacity must be an integer >= 2"),
        (2, 8.0, "capacity must be"),
    ]:
        with pytest.raises(ValueError, match=message):
            load_target(folders["llama-gqa-tied"], slots=slots, capacity=capacity)

    target = load_target(folders["llama-gqa-tied"], slots=2, capacity=8)
    assert (target.num_slots, target.capacity) == (2, 8)
    tree = make_tree([([4, 5, 6], [-1, 0, 0])])
    verdict = Verdict(
        path=np.array([[0, 2, -1]]), num_accepted=np.array([1]), bonus_tokens=np.array([0])
    )
    with pytest.raises(ValueError, match=r"slot 0 holds no request \(admit one first\)"):
        target.forward_tree(tree, np.array([0]))
    with pytest.raises(ValueError, match=r"slot 1 holds no request \(admit one first\)"):
        target.release(1)
    target.admit(0, [1, 2, 3])
    with pytest.raises(ValueError, match=r"slot 0 already holds a request \(release it first\)"):
        target.admit(0, [1])
    for slot in (2, -1):
        with pytest.raises(ValueError, match=r"outside \[0, 2\).*slots=N"):
            target.admit(slot, [1])
        with pytest.raises(ValueError, match=r"outside \[0, 2\).*slots=N"):
            target.forward_tree(tree, np.array([slot]))
    with pytest.raises(ValueError, match="repeat a slot"):
        target.forward_tree(make_tree([([4], [-1]), ([5], [-1])]), np.array([0, 0]))
    with pytest.raises(ValueError, match="slot 1 holds no request"):
        target.forward_tree(make_tree([([4], [-1]), ([5], [-1])]), np.array([0, 1]))
    target.admit(1, [7])
    with pytest.raises(ValueError, match="tree has 1 rows but 2 slots were given"):
        target.forward_tree(tree, np.array([0, 1]))
    with pytest.raises(ValueError, match="preceding forward_tree"):
        target.commit(tree, verdict)
    target.forward_tree(tree, np.array([0]))
    with pytest.raises(ValueError, match="parent links"):
        target.commit(
            tree,
            Verdict(
                path=np.array([[0, 1, 2]]), num_accepted=np.array([2]), bonus_tokens=np.array([0])
            ),
        )
    with pytest.raises(ValueError, match="different tree"):
        target.commit(make_tree([([4, 5, 7], [-1, 0, 0])]), verdict)
    target.commit(tree, verdict)
    np.testing.assert_array_equal(
        target.cache_lengths, [5, 1], err_msg="cache after committing root + node 2 to slot 0"
    )
    with pytest.raises(ValueError, match="preceding forward_tree"):
        target.commit(tree, verdict)  # the committed tree is gone
    with pytest.raises(ValueError, match="outside"):
        target.forward_tree(make_tree([([VOCAB], [-1])]), np.array([0]))
    target.release(1)
    with pytest.raises(ValueError, match="outside"):
        target.admit(1, [VOCAB])
    with pytest.raises(ValueError, match="non-empty"):
        target.admit(1, [])
    with pytest.raises(ValueError, match="slot 1 holds no request"):
        target.forward_tree(
            make_tree([([4], [-1])]), np.array([1])
        )  # a failed admit leaves the slot free
    np.testing.assert_array_equal(
        target.cache_lengths, [5, 0], err_msg="cache lengths after a release"
    )


def test_capacity_is_preallocated_and_never_exceeded(folders):
    """A slot holds at most ``capacity`` positions: an admission or a tree beyond it is refused
    with a clear error and leaves the slot as it was (the cache never grows), and up to it the
    outputs equal a roomier target's."""
    folder = folders["llama-gqa-tied"]
    target = load_target(folder, slots=2, capacity=10)
    roomy = load_target(folder, slots=1, capacity=CAPACITY)
    with pytest.raises(
        ValueError,
        match=r"admit\(slot=1\): slot 1 holds 0 positions and 11 more do not fit its "
        r"capacity of 10; load the target with a larger capacity",
    ):
        target.admit(1, list(range(11)))
    with pytest.raises(ValueError, match="slot 1 holds no request"):
        target.release(1)  # the refused admission left the slot free
    prompt = [3, 1, 4, 1, 5]
    np.testing.assert_allclose(
        target.admit(0, prompt).logits, roomy.admit(0, prompt).logits, rtol=0, atol=TOL
    )
    chain = make_tree([([9, 2, 6], [-1, 0, 1])])
    path = Verdict(
        path=np.array([[0, 1, 2]]), num_accepted=np.array([2]), bonus_tokens=np.array([0])
    )
    for step in range(2):  # 5 -> 8 -> 11 > 10: the second chain does not fit
        if step == 1:
            with pytest.raises(
                ValueError,
                match="forward_tree: slot 0 holds 8 positions and 3 more do not fit its "
                "capacity of 10",
            ):
                target.forward_tree(chain, np.array([0]))
            break
        out = target.forward_tree(chain, np.array([0]))
        np.testing.assert_allclose(
            out.logits, roomy.forward_tree(chain, np.array([0])).logits, rtol=0, atol=TOL
        )
        target.commit(chain, path), roomy.commit(chain, path)
    np.testing.assert_array_equal(
        target.cache_lengths, [8, 0], err_msg="a refused tree must not change the cache"
    )
    assert target.capacity == 10 and target.cache.capacity == 10, "the cache must never grow"
    two = make_tree([([9, 2], [-1, 0])])  # exactly fills the slot: 8 + 2 = 10
    np.testing.assert_allclose(
        target.forward_tree(two, np.array([0])).logits,
        roomy.forward_tree(two, np.array([0])).logits,
        rtol=0,
        atol=TOL,
        err_msg="a tree that exactly fills the capacity",
    )
    verdict = Verdict(
        path=np.array([[0, 1]]), num_accepted=np.array([1]), bonus_tokens=np.array([0])
    )
    target.commit(two, verdict)
    np.testing.assert_array_equal(target.cache_lengths, [10, 0])
    with pytest.raises(ValueError, match="do not fit its capacity"):
        target.forward_tree(
            make_tree([([1], [-1])]), np.array([0])
        )  # even a root alone is refused when full


def _accept(rows, nodes):
    """Verdict accepting the path to ``nodes[b]`` in row b of ``make_tree(rows)``."""
    paths = [path_to(parents, node) for (_, parents), node in zip(rows, nodes, strict=True)]
    path = np.full((len(rows), max(len(tokens) for tokens, _ in rows)), -1, dtype=np.int64)
    for b, nodes_ in enumerate(paths):
        path[b, : len(nodes_)] = nodes_
    return Verdict(
        path=path,
        num_accepted=np.array([len(p) - 1 for p in paths], dtype=np.int64),
        bonus_tokens=np.zeros(len(rows), dtype=np.int64),
    )


SLOT_TOL = 1e-12


@pytest.mark.parametrize("name", MODEL_NAMES)
def test_a_slot_does_not_depend_on_other_slots(folders, name):
    """Prompts admitted into slots 2 and 0: slot 2's tree outputs are the same run alone ([2]) or
    with slot 0 ([0, 2], [2, 0]), and equal a one-slot target's; commits over both slots keep it
    so; after release(2) and admit(2, another prompt) slot 2 behaves like a fresh target."""
    target = load_target(folders[name], slots=3, capacity=CAPACITY)
    rng = np.random.default_rng(7)
    prompt2, prompt0, other = (rng.integers(0, VOCAB, size=n).tolist() for n in (7, 4, 10))
    row2, row0 = ([5, 6, 7, 8, 9], [-1, 0, 0, 1, 3]), ([9, 1, 2], [-1, 0, 1])

    def fresh_run(prompt, steps):
        """A one-slot target: admit ``prompt``, then per step (rows, node) forward and commit."""
        fresh = load_target(folders[name], slots=1, capacity=CAPACITY)
        outputs = [fresh.admit(0, prompt)]
        for row, node in steps:
            outputs.append(fresh.forward_tree(make_tree([row]), np.array([0])))
            if node is not None:
                fresh.commit(make_tree([row]), _accept([row], [node]))
        return outputs

    def same(a, b, what):
        np.testing.assert_allclose(a, b, rtol=0, atol=SLOT_TOL, err_msg=f"{what}, {name}")

    expected = fresh_run(prompt2, [(row2, None), (row2, 4), (row0, None)])
    admitted = target.admit(2, prompt2)
    target.admit(0, prompt0)
    same(admitted.logits, expected[0].logits, "admit into slot 2 vs a one-slot target")
    same(admitted.hidden, expected[0].hidden, "admit hidden into slot 2 vs a one-slot target")
    alone = target.forward_tree(make_tree([row2]), np.array([2]))
    together = target.forward_tree(make_tree([row0, row2]), np.array([0, 2]))
    swapped = target.forward_tree(make_tree([row2, row0]), np.array([2, 0]))
    n = len(row2[0])
    same(
        together.logits[1, :n],
        alone.logits[0],
        "slot 2's tree logits over [0, 2] vs over [2] alone",
    )
    same(
        together.hidden[1, :n],
        alone.hidden[0],
        "slot 2's tree hidden over [0, 2] vs over [2] alone",
    )
    same(swapped.logits[0], alone.logits[0], "slot 2's tree logits over [2, 0] vs over [2] alone")
    same(alone.logits[0], expected[1].logits[0], "slot 2's tree logits vs a one-slot target")
    same(
        together.logits[0, :3], swapped.logits[1, :3], "slot 0's tree logits over [0, 2] vs [2, 0]"
    )
    # Commit over both slots (the last forward_tree: rows [2, 0]), then slot 2 alone again.
    target.commit(make_tree([row2, row0]), _accept([row2, row0], [4, 2]))
    np.testing.assert_array_equal(
        target.cache_lengths, [4 + 3, 0, 7 + 4], err_msg=f"lengths after commit, {name}"
    )
    after = target.forward_tree(make_tree([row0]), np.array([2]))
    same(
        after.logits[0],
        expected[3].logits[0],
        "slot 2's next tree after a commit over [2, 0] vs a one-slot target",
    )
    # A released slot admits a new request like a fresh target; slot 0 is unaffected.
    slot0_before = target.forward_tree(make_tree([row2]), np.array([0]))
    target.release(2)
    np.testing.assert_array_equal(
        target.cache_lengths, [7, 0, 0], err_msg=f"lengths after release(2), {name}"
    )
    expected = fresh_run(other, [(row2, None), (row0, 1), (row2, None)])
    readmitted = target.admit(2, other)
    same(readmitted.logits, expected[0].logits, "admit after release vs a fresh target")
    same(readmitted.hidden, expected[0].hidden, "admit hidden after release vs a fresh target")
    out = target.forward_tree(make_tree([row2, row2]), np.array([0, 2]))
    same(out.logits[1], expected[1].logits[0], "the readmitted slot's tree vs a fresh target")
    same(
        out.logits[0],
        slot0_before.logits[0],
        "slot 0's tree before and after slot 2 was released and readmitted",
    )
    out = target.forward_tree(make_tree([row0]), np.array([2]))
    same(
        out.logits[0], expected[2].logits[0], "the readmitted slot's second tree vs a fresh target"
    )
    target.commit(make_tree([row0]), _accept([row0], [1]))
    same(
        target.forward_tree(make_tree([row2]), np.array([2])).logits[0],
        expected[3].logits[0],
        "the readmitted slot after a commit vs a fresh target",
    )
