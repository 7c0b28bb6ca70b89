"""The torch target against the float64 reference and against transformers' own modules.

Runs when torch is importable, and must run (import failure stops the run, see tests/conftest.py)
when SPECDEC_TEST_BACKENDS names "torch". SPECDEC_TORCH_DEVICE picks the device (default cpu).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

torch = pytest.importorskip("torch")  # required when SPECDEC_TEST_BACKENDS names torch (conftest)

from specdec.errors import InvalidInputError, install_command
from specdec.reference.model import load_target
from specdec.reference.tree import build_prefix_tree
from specdec.testing import checks, make_random_model
from specdec.testing.strategies import model_shapes
from specdec.types import Verdict
from specdec_torch.backend import TorchBackend

DEVICE = os.environ.get("SPECDEC_TORCH_DEVICE", "cpu")
PROMPTS = ((1, 2, 3), (4,), (5, 6, 7, 8, 9))


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("torch_target")
    shape = dict(vocab_size=64, hidden_size=32, num_layers=2, num_heads=4, num_kv_heads=2)
    return {
        "llama": make_random_model(root / "llama", seed=0, **shape),
        "qwen2": make_random_model(root / "qwen2", seed=1, architecture="qwen2", **shape),
        "untied": make_random_model(
            root / "untied",
            seed=2,
            tie_word_embeddings=False,
            with_tokenizer=True,
            eos_token_id=7,
            **shape,
        ),
    }


def _edit_config(folder, **changes):
    path = folder / "config.json"
    config = json.loads(path.read_text())
    config.update(changes)
    path.write_text(json.dumps(config))
    return folder


@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("kind", ["llama", "qwen2", "untied"])
def test_prefill_tree_forward_and_commit_match_reference(models, kind, dtype):
    """Prefill and tree logits/hidden within 1e-9 (float64) or 2e-4 (float32) of the reference,
    over several tree steps with random accepted paths (so commit is checked by the next step)."""
    checks.check_target(
        "torch",
        models[kind],
        dtype=dtype,
        device=DEVICE,
        prompts=PROMPTS,
        steps=4,
        width=3,
        length=4,
    )


@settings(max_examples=6)
@given(
    shape=model_shapes(),
    seed=st.integers(0, 1000),
    width=st.integers(1, 4),
    length=st.integers(1, 5),
)
def test_random_architectures_match_reference_float64(tmp_path_factory, shape, seed, width, length):
    folder = make_random_model(tmp_path_factory.mktemp("arch") / "m", seed=seed, **shape)
    checks.check_target(
        "torch",
        folder,
        dtype="float64",
        device=DEVICE,
        steps=3,
        width=width,
        length=length,
        seed=seed,
    )


def test_llama3_rope_scaling_matches_reference_and_transformers(tmp_path):
    """llama3 rotary scaling: the whole model against the reference, the rotary angles against
    transformers' own rotary module."""
    folder = make_random_model(
        tmp_path / "m",
        vocab_size=48,
        hidden_size=32,
        num_layers=1,
        num_heads=2,
        num_kv_heads=1,
        seed=3,
    )
    _edit_config(
        folder,
        rope_theta=500000.0,
        rope_scaling=dict(
            rope_type="llama3",
            factor=8.0,
            low_freq_factor=1.0,
            high_freq_factor=4.0,
            original_max_position_embeddings=16,
        ),
    )
    checks.check_target(
        "torch", folder, dtype="float64", device=DEVICE, prompts=[list(range(40))], steps=2
    )
    _check_rotary_against_transformers(folder)


def test_default_rope_matches_transformers_rotary_module(models):
    _check_rotary_against_transformers(models["qwen2"])


def _check_rotary_against_transformers(folder):
    from transformers import AutoModelForCausalLM

    from specdec.models.llama import LlamaConfig
    from specdec_torch.layers import inverse_frequencies, rotary_cos_sin

    model = AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32)
    positions = torch.arange(0, 600, 7)[None]  # (1, n)
    hf_cos, hf_sin = model.model.rotary_emb(torch.zeros(1, dtype=torch.float32), positions)
    config = LlamaConfig.from_folder(folder)
    cos, sin = rotary_cos_sin(
        positions, inverse_frequencies(config, torch.device("cpu")), torch.float32
    )
    # transformers computes the angles in float32: allow its rounding (position * 6e-8 radians).
    assert torch.allclose(cos[:, 0], hf_cos, atol=1e-4), (
        f"rotary cos differs from transformers for {folder.name}"
    )
    assert torch.allclose(sin[:, 0], hf_sin, atol=1e-4), (
        f"rotary sin differs from transformers for {folder.name}"
    )


def test_mistral_sliding_window_matches_reference(tmp_path):
    folder = make_random_model(
        tmp_path / "m",
        vocab_size=48,
        hidden_size=32,
        num_layers=2,
        num_heads=4,
        num_kv_heads=2,
        seed=4,
    )
    _edit_config(
        folder, model_type="mistral", architectures=["MistralForCausalLM"], sliding_window=5
    )
    checks.check_target(
        "torch",
        folder,
        dtype="float64",
        device=DEVICE,
        prompts=[list(range(9)), [3, 4]],
        steps=4,
        width=2,
        length=4,
    )


def test_prefill_in_chunks_matches_reference(models, monkeypatch):
    """A prompt of several prefill chunks (and a partial one) beside a short one, then tree steps
    (within check_target's capacity of 64 positions per slot)."""
    import specdec_torch.target as torch_model

    monkeypatch.setattr(torch_model, "PREFILL_CHUNK", 7)
    prompts = [[t * 5 % 64 for t in range(30)], [5, 6]]
    checks.check_target(
        "torch",
        models["llama"],
        dtype="float64",
        device=DEVICE,
        prompts=prompts,
        steps=3,
        width=4,
        length=5,
    )


def _tree(beams, backend, target):
    """The prefix tree of NumPy ``beams`` (B, W, L), on the torch target's device."""
    return checks.to_backend_tree(
        build_prefix_tree(np.asarray(beams, dtype=np.int64)), backend, target
    )


def _verdict(beams, accepted, backend=None, target=None):
    """Verdict accepting the first ``accepted[b] + 1`` tokens of beam 0 of each row (root included),
    on the target's device (NumPy without a backend, for the reference)."""
    tree = build_prefix_tree(np.asarray(beams, dtype=np.int64))
    accepted = np.asarray(accepted, dtype=np.int64)
    path = np.full(tree.beam_to_node.shape[::2], -1, dtype=np.int64)  # (B, L)
    for b, count in enumerate(accepted):
        path[b, : count + 1] = tree.beam_to_node[b, 0, : count + 1]
    put = np.asarray if backend is None else (lambda a: backend.from_numpy(a, target))
    return Verdict(
        path=put(path),
        num_accepted=put(accepted),
        bonus_tokens=put(np.zeros(len(accepted), np.int64)),
    )


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_capacity_is_preallocated_and_never_exceeded(models, dtype, monkeypatch):
    """The cache is allocated once for ``capacity`` positions per slot: chunked prefill and chain
    steps up to it match the reference; an admission or a tree beyond it is refused with a clear
    error, leaves the cache as it was, and the buffer is never reallocated."""
    import specdec_torch.target as torch_model

    monkeypatch.setattr(torch_model, "PREFILL_CHUNK", 7)
    backend, tolerance = TorchBackend(), checks.FLOAT64 if dtype == "float64" else checks.FLOAT32
    target = backend.load_target(models["llama"], dtype=dtype, device=DEVICE, slots=2, capacity=40)
    reference = load_target(models["llama"], slots=1, capacity=40)
    buffer, shape = target.cache.data.data_ptr(), tuple(target.cache.data.shape)
    assert (target.num_slots, target.capacity) == (2, 40) and shape[2] == 2 and shape[4] == 40, (
        shape
    )
    with pytest.raises(
        InvalidInputError,
        match=r"admit\(slot=1\): slot 1 holds 0 positions and 41 more do not "
        r"fit its capacity of 40; load the target with a larger capacity",
    ):
        target.admit(1, [1] * 41)
    with pytest.raises(InvalidInputError, match="slot 1 holds no request"):
        target.release(1)  # the refused admission left the slot free
    prompt = [t * 3 % 64 for t in range(17)]
    np.testing.assert_allclose(
        backend.to_numpy(target.admit(1, prompt).logits),
        reference.admit(0, prompt).logits,
        **tolerance,
        err_msg=f"chunked admission ({dtype})",
    )
    chain, length = [[[9, 2, 6, 5, 3]]], 17
    while length + 5 <= 40:  # chain steps of 5 nodes, 4 accepted + root: 17 -> 22 -> ... -> 37
        got = target.forward_tree(_tree(chain, backend, target), np.array([1])).logits
        np.testing.assert_allclose(
            backend.to_numpy(got)[0],
            reference.forward_tree(build_prefix_tree(np.array(chain)), np.array([0])).logits[0],
            **tolerance,
            err_msg=f"chain step at length {length} ({dtype})",
        )
        target.commit(_tree(chain, backend, target), _verdict(chain, [4], backend, target))
        reference.commit(build_prefix_tree(np.array(chain)), _verdict(chain, [4]))
        length += 5
    np.testing.assert_array_equal(target.cache_lengths, [0, 37])
    with pytest.raises(
        InvalidInputError,
        match="forward_tree: slot 1 holds 37 positions and 5 more do not fit its capacity of 40",
    ):
        target.forward_tree(_tree(chain, backend, target), np.array([1]))
    np.testing.assert_array_equal(
        target.cache_lengths, [0, 37], err_msg="a refused tree must not change the cache"
    )
    three = [[[9, 2, 6]]]  # exactly fills the slot: 37 + 3 = 40
    np.testing.assert_allclose(
        backend.to_numpy(target.forward_tree(_tree(three, backend, target), np.array([1])).logits)[
            0
        ],
        reference.forward_tree(build_prefix_tree(np.array(three)), np.array([0])).logits[0],
        **tolerance,
        err_msg=f"a tree that exactly fills the capacity ({dtype})",
    )
    target.commit(_tree(three, backend, target), _verdict(three, [2], backend, target))
    np.testing.assert_array_equal(target.cache_lengths, [0, 40])
    with pytest.raises(InvalidInputError, match="do not fit its capacity"):
        target.forward_tree(
            _tree([[[1]]], backend, target), np.array([1])
        )  # even a root alone, when full
    assert target.cache.data.data_ptr() == buffer and tuple(target.cache.data.shape) == shape, (
        "the preallocated cache must never be reallocated or grown"
    )


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_a_slot_does_not_depend_on_other_slots(models, dtype):
    """Prompts admitted into slots 2 and 0: slot 2's tree logits are the same run alone ([2]) or
    with slot 0 ([0, 2], [2, 0]) and equal a one-slot target's, also after a commit over both;
    after release(2) and admit(2, another prompt) slot 2 behaves like a fresh target. Tolerance:
    the dtype's, as in the comparisons with the reference above."""
    backend, tolerance = TorchBackend(), checks.FLOAT64 if dtype == "float64" else checks.FLOAT32
    load = lambda slots: backend.load_target(
        models["qwen2"], dtype=dtype, device=DEVICE, slots=slots, capacity=64
    )

    def close(got, want, what):
        np.testing.assert_allclose(
            backend.to_numpy(got),
            backend.to_numpy(want),
            **tolerance,
            err_msg=f"{what} (torch {dtype})",
        )

    def fresh_run(prompt, steps):
        """A one-slot target: admit ``prompt``, then per step (beams, accepted or None) a tree and a
        commit."""
        fresh = load(1)
        outputs = [fresh.admit(0, prompt).logits]
        for beams, accepted in steps:
            outputs.append(
                fresh.forward_tree(_tree(beams, backend, fresh), np.array([0])).logits[0]
            )
            if accepted is not None:
                fresh.commit(
                    _tree(beams, backend, fresh), _verdict(beams, [accepted], backend, fresh)
                )
        return outputs

    target = load(3)
    prompt2, prompt0, other = [5, 6, 7, 8, 9, 10, 11], [1, 2, 3], [12, 13, 14, 15, 16]
    beams2 = [[[4, 7, 8, 9], [4, 7, 1, 2], [4, 3, 3, 3]]]  # 9 nodes
    beams0 = [
        [[6, 1, 2, 3], [6, 1, 2, 5], [6, 1, 2, 3]]
    ]  # 5 nodes: the row is padded beside beams2
    n, n0 = (int(build_prefix_tree(np.array(b)).num_nodes[0]) for b in (beams2, beams0))
    assert (n, n0) == (9, 5)
    expected = fresh_run(prompt2, [(beams2, None), (beams2, 3), (beams0, None)])
    close(target.admit(2, prompt2).logits, expected[0], "admit into slot 2 vs a one-slot target")
    target.admit(0, prompt0)
    alone = target.forward_tree(_tree(beams2, backend, target), np.array([2])).logits
    together = target.forward_tree(
        _tree([beams0[0], beams2[0]], backend, target), np.array([0, 2])
    ).logits
    swapped = target.forward_tree(
        _tree([beams2[0], beams0[0]], backend, target), np.array([2, 0])
    ).logits
    assert alone.shape[1] == n
    close(together[1, :n], alone[0], "slot 2's tree logits over [0, 2] vs over [2] alone")
    close(swapped[0, :n], alone[0], "slot 2's tree logits over [2, 0] vs over [2] alone")
    close(alone[0], expected[1], "slot 2's tree logits vs a one-slot target")
    close(together[0, :n0], swapped[1, :n0], "slot 0's tree logits over [0, 2] vs [2, 0]")
    target.commit(
        _tree([beams2[0], beams0[0]], backend, target),
        _verdict([beams2[0], beams0[0]], [3, 1], backend, target),
    )
    np.testing.assert_array_equal(
        target.cache_lengths, [3 + 2, 0, 7 + 4], err_msg=f"lengths after commit ({dtype})"
    )
    close(
        target.forward_tree(_tree(beams0, backend, target), np.array([2])).logits[0],
        expected[3],
        "slot 2's next tree after a commit over [2, 0] vs a one-slot target",
    )
    slot0_before = target.forward_tree(_tree(beams2, backend, target), np.array([0])).logits[0]
    target.release(2)
    np.testing.assert_array_equal(
        target.cache_lengths, [5, 0, 0], err_msg=f"lengths after release(2) ({dtype})"
    )
    expected = fresh_run(other, [(beams2, None), (beams0, 2), (beams2, None)])
    close(target.admit(2, other).logits, expected[0], "admit after release vs a fresh target")
    both = target.forward_tree(
        _tree([beams2[0], beams2[0]], backend, target), np.array([0, 2])
    ).logits
    close(both[1], expected[1], "the readmitted slot's tree vs a fresh target")
    close(
        both[0], slot0_before, "slot 0's tree before and after slot 2 was released and readmitted"
    )
    close(
        target.forward_tree(_tree(beams0, backend, target), np.array([2])).logits[0],
        expected[2],
        "the readmitted slot's second tree vs a fresh target",
    )
    target.commit(_tree(beams0, backend, target), _verdict(beams0, [2], backend, target))
    close(
        target.forward_tree(_tree(beams2, backend, target), np.array([2])).logits[0],
        expected[3],
        "the readmitted slot after a commit vs a fresh target",
    )


def test_target_attributes_and_fingerprint_match_reference(models):
    folder = models["untied"]
    reference = load_target(folder)
    target = TorchBackend().load_target(folder, dtype="bfloat16", device=DEVICE)
    assert target.fingerprint == reference.fingerprint, (
        "TorchTarget.fingerprint differs from the reference's"
    )
    assert (target.vocab_size, target.hidden_size) == (reference.vocab_size, reference.hidden_size)
    assert target.eos_token_ids == reference.eos_token_ids == (7,)
    assert target.name == reference.name == "untied"
    assert target.tokenizer is not None and target.tokenizer.encode("x").ids is not None
    assert target.embed_tokens.shape == target.lm_head.shape == (64, 32)
    assert target.dtype == torch.bfloat16 and target.embed_tokens.dtype == torch.bfloat16


def test_model_object_source_gives_same_outputs_and_fingerprint(models):
    from transformers import AutoModelForCausalLM

    folder = models["llama"]
    model = AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float64)
    from_object = TorchBackend().load_target(model)
    from_folder = TorchBackend().load_target(folder, dtype="float64", device="cpu")
    assert from_object.fingerprint == from_folder.fingerprint == load_target(folder).fingerprint
    a, b = from_object.admit(0, [1, 2, 3]), from_folder.admit(0, [1, 2, 3])
    assert torch.equal(a.logits, b.logits), (
        "a model object and its folder give different prefill logits"
    )


def test_errors_name_the_problem(models):
    backend = TorchBackend()
    target = backend.load_target(
        models["llama"], dtype="float32", device=DEVICE, slots=2, capacity=16
    )
    assert (target.num_slots, target.capacity) == (2, 16)
    tree = checks.to_backend_tree(build_prefix_tree(np.array([[[1, 2]]])), backend, target)
    pair = checks.to_backend_tree(
        build_prefix_tree(np.array([[[1, 2]], [[3, 4]]])), backend, target
    )
    with pytest.raises(InvalidInputError, match=r"slot 0 holds no request \(admit one first\)"):
        target.forward_tree(tree, np.array([0]))
    with pytest.raises(InvalidInputError, match=r"slot 1 holds no request \(admit one first\)"):
        target.release(1)
    target.admit(0, [1, 2])
    with pytest.raises(
        InvalidInputError, match=r"slot 0 already holds a request \(release it first\)"
    ):
        target.admit(0, [3])
    for slot in (2, -1):
        with pytest.raises(InvalidInputError, match=r"outside \[0, 2\).*slots=N"):
            target.admit(slot, [3])
        with pytest.raises(InvalidInputError, match=r"outside \[0, 2\).*slots=N"):
            target.forward_tree(tree, np.array([slot]))
    with pytest.raises(InvalidInputError, match="repeat a slot"):
        target.forward_tree(pair, np.array([0, 0]))
    with pytest.raises(InvalidInputError, match="slot 1 holds no request"):
        target.forward_tree(pair, np.array([0, 1]))
    target.admit(1, [5])
    with pytest.raises(InvalidInputError, match="tree has 1 rows but 2 slots were given"):
        target.forward_tree(tree, np.array([0, 1]))
    with pytest.raises(InvalidInputError, match="tree has 2 rows but 1 slots were given"):
        target.forward_tree(pair, np.array([1]))
    verdict = Verdict(
        path=backend.from_numpy(np.array([[0, 1]]), target),
        num_accepted=backend.from_numpy(np.array([1]), target),
        bonus_tokens=backend.from_numpy(np.array([3]), target),
    )
    with pytest.raises(
        InvalidInputError, match="needs a preceding forward_tree.*no tree is staged"
    ):
        target.commit(tree, verdict)
    target.forward_tree(tree, np.array([1]))
    target.commit(tree, verdict)
    np.testing.assert_array_equal(
        target.cache_lengths, [2, 3], err_msg="lengths after committing 2 nodes to slot 1"
    )
    with pytest.raises(InvalidInputError, match="needs a preceding forward_tree"):
        target.commit(tree, verdict)  # the committed tree is gone
    with pytest.raises(InvalidInputError, match="do not fit its capacity of 16"):
        target.forward_tree(
            checks.to_backend_tree(
                build_prefix_tree(np.ones((1, 1, 15), np.int64)), backend, target
            ),
            np.array([0]),
        )
    target.release(1)
    with pytest.raises(InvalidInputError, match="outside"):
        target.admit(1, [1, 64])
    with pytest.raises(InvalidInputError, match="non-empty"):
        target.admit(1, [])
    with pytest.raises(InvalidInputError, match=r"admit\(slot=1\).*do not fit its capacity of 16"):
        target.admit(1, [1] * 17)
    with pytest.raises(InvalidInputError, match="slot 1 holds no request"):
        target.forward_tree(tree, np.array([1]))  # failed admissions leave the slot free
    with pytest.raises(InvalidInputError, match="layers"):
        target.admit(1, [1], layers=[2])
    with pytest.raises(InvalidInputError, match="slots must be a positive integer"):
        backend.load_target(models["llama"], dtype="float32", device=DEVICE, slots=0)
    with pytest.raises(InvalidInputError, match="capacity must be an integer"):
        backend.load_target(models["llama"], dtype="float32", device=DEVICE, capacity=1)
    with pytest.raises(InvalidInputError, match="unknown dtype"):
        backend.load_target(models["llama"], dtype="int8")
    with pytest.raises(InvalidInputError, match="Llama-family"):
        backend.load_target(torch.nn.Linear(2, 2))


def test_backend_moves_arrays_both_ways(models):
    backend = TorchBackend()
    target = backend.load_target(models["llama"], dtype="bfloat16", device=DEVICE)
    array = np.arange(6, dtype=np.int64).reshape(2, 3)
    tensor = backend.from_numpy(array, target)
    assert tensor.device.type == torch.device(DEVICE).type and tensor.dtype == torch.int64
    assert np.array_equal(backend.to_numpy(tensor), array)
    half = torch.tensor([1.5, -2.25], dtype=torch.bfloat16)
    assert backend.to_numpy(half).dtype == np.float32 and backend.to_numpy(half).tolist() == [
        1.5,
        -2.25,
    ]


def test_plugin_module_does_not_import_torch():
    code = (
        "import sys, specdec_torch.plugin, specdec; specdec.default_registry(); "
        "print('torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False", (
        f"importing specdec_torch.plugin loaded torch: {out.stdout} {out.stderr}"
    )


def test_missing_torch_names_the_extra():
    code = (
        "import sys; sys.modules['torch'] = None\n"
        "import specdec\n"
        "try:\n    specdec.load('x', backend='torch')\n"
        "except specdec.MissingDependencyError as exc:\n    print(exc)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert install_command("torch") in out.stdout, f"no install hint: {out.stdout} {out.stderr}"
