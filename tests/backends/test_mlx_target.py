"""The mlx backend's target: plugin wiring, loading, and conformance with the float64 reference.

Tolerances: float32 against float64 on random models whose logits have standard deviation ~4,
``specdec.testing.checks.FLOAT32`` (rtol = atol = 2e-4) for logits and hidden states.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip(
    "mlx_lm", reason="mlx is not installed"
)  # required when SPECDEC_TEST_BACKENDS names mlx (conftest)

import mlx.core as mx  # noqa: E402

from specdec.errors import InvalidInputError, MissingDependencyError, install_command  # noqa: E402
from specdec.reference.model import load_target as load_reference  # noqa: E402
from specdec.reference.tree import build_prefix_tree  # noqa: E402
from specdec.testing import checks, make_random_model  # noqa: E402
from specdec.testing.batch import Batch  # noqa: E402
from specdec.types import DraftTree, Verdict  # noqa: E402
from specdec_mlx.backend import MlxBackend  # noqa: E402


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """A tied llama with a tokenizer and an eos id, an untied qwen2 (biases on q, k, v)."""
    root = tmp_path_factory.mktemp("mlx_models")
    shape = dict(vocab_size=64, hidden_size=32, num_layers=2, num_heads=4, num_kv_heads=2)
    return {
        "llama": make_random_model(
            root / "llama", **shape, seed=1, eos_token_id=3, with_tokenizer=True
        ),
        "qwen2": make_random_model(
            root / "qwen2", **shape, seed=2, architecture="qwen2", tie_word_embeddings=False
        ),
    }


def test_plugin_import_loads_no_framework():
    code = (
        "import sys, specdec, specdec_mlx.plugin; "
        "from specdec.plugins.registry import default_registry; "
        "assert 'mlx' in default_registry().names('backend'); "
        "print(sorted(m for m in ('mlx', 'mlx.core', 'mlx_lm') if m in sys.modules))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout
    assert out.strip() == "[]", f"import specdec_mlx.plugin loaded {out.strip()}"


def test_missing_mlx_names_the_extra():
    code = (
        "import sys; sys.modules['mlx'] = None; sys.modules['mlx.core'] = None\n"
        "from specdec.plugins.registry import default_registry\n"
        "from specdec.errors import MissingDependencyError\n"
        "try:\n    default_registry().get('backend', 'mlx').factory()\n"
        "except MissingDependencyError as exc:\n    print(exc)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout
    assert install_command("mlx") in out, f"mlx backend factory without mlx said: {out!r}"
    assert issubclass(MissingDependencyError, ImportError)


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_prefill_tree_forward_and_commit_match_reference(models, arch, monkeypatch):
    """Ragged prompts (one of several prefill chunks and a partial one), three trees, random
    accepted paths (within check_target's capacity of 64 positions per slot)."""
    from specdec_mlx import target as mlx_target

    monkeypatch.setattr(mlx_target, "PREFILL_CHUNK", 16)
    checks.check_target(
        "mlx",
        models[arch],
        dtype="float32",
        prompts=((1, 2, 3), (4,), tuple(range(5, 40))),
        steps=3,
        width=3,
        length=4,
    )
    checks.check_target(
        "mlx", models[arch], dtype="float32", prompts=((9, 8, 7),), steps=2, width=1, length=3
    )


def _tree(beams, backend, target):
    """The prefix tree of NumPy ``beams`` (B, W, L) as mlx arrays."""
    return checks.to_backend_tree(
        build_prefix_tree(np.asarray(beams, dtype=np.int64)), backend, target
    )


def _verdict(beams, accepted, backend=None, target=None):
    """Verdict accepting the first ``accepted[b] + 1`` tokens of beam 0 of each row (root included),
    as mlx arrays (NumPy without a backend, for the reference)."""
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


def test_capacity_is_preallocated_and_never_exceeded(models, monkeypatch):
    """The cache is allocated once for ``capacity`` positions per slot: chunked prefill and chain
    steps up to it match the reference; an admission or a tree beyond it is refused with a clear
    error, leaves the cache as it was, and the buffers never grow."""
    from specdec_mlx import target as mlx_target

    monkeypatch.setattr(mlx_target, "PREFILL_CHUNK", 7)
    backend, tolerance = MlxBackend(), checks.FLOAT32
    target = backend.load_target(models["llama"], dtype="float32", slots=2, capacity=40)
    reference = load_reference(models["llama"], slots=1, capacity=40)
    shapes = [tuple(a.shape) for a in target.cache.keys + target.cache.values]
    assert (
        (target.num_slots, target.capacity) == (2, 40) and shapes[0][0] == 2 and shapes[0][2] == 40
    ), shapes
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
        err_msg="chunked admission (mlx)",
    )
    chain, length = [[[9, 2, 6, 5, 3]]], 17
    while length + 5 <= 40:  # chain steps of 5 nodes, 4 accepted + root: 17 -> 22 -> ... -> 37
        got = target.forward_tree(_tree(chain, backend, target), np.array([1])).logits
        np.testing.assert_allclose(
            backend.to_numpy(got)[0],
            reference.forward_tree(build_prefix_tree(np.array(chain)), np.array([0])).logits[0],
            **tolerance,
            err_msg=f"chain step at length {length} (mlx)",
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
        err_msg="a tree that exactly fills the capacity (mlx)",
    )
    target.commit(_tree(three, backend, target), _verdict(three, [2], backend, target))
    np.testing.assert_array_equal(target.cache_lengths, [0, 40])
    with pytest.raises(InvalidInputError, match="do not fit its capacity"):
        target.forward_tree(
            _tree([[[1]]], backend, target), np.array([1])
        )  # even a root alone, when full
    assert [tuple(a.shape) for a in target.cache.keys + target.cache.values] == shapes, (
        "the preallocated cache must never grow"
    )


def test_a_slot_does_not_depend_on_other_slots(models):
    """Prompts admitted into slots 2 and 0: slot 2's tree logits are the same run alone ([2]) or
    with slot 0 ([0, 2], [2, 0]) and equal a one-slot target's, also after a commit over both;
    after release(2) and admit(2, another prompt) slot 2 behaves like a fresh target. Tolerance:
    float32's, as in the comparisons with the reference above."""
    backend, tolerance = MlxBackend(), checks.FLOAT32
    load = lambda slots: backend.load_target(
        models["qwen2"], dtype="float32", slots=slots, capacity=64
    )

    def close(got, want, what):
        np.testing.assert_allclose(
            backend.to_numpy(got),
            backend.to_numpy(want),
            **tolerance,
            err_msg=f"{what} (mlx float32)",
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
        return [backend.to_numpy(output) for output in outputs]

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
    alone = backend.to_numpy(
        target.forward_tree(_tree(beams2, backend, target), np.array([2])).logits
    )
    together = backend.to_numpy(
        target.forward_tree(_tree([beams0[0], beams2[0]], backend, target), np.array([0, 2])).logits
    )
    swapped = backend.to_numpy(
        target.forward_tree(_tree([beams2[0], beams0[0]], backend, target), np.array([2, 0])).logits
    )
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
        target.cache_lengths, [3 + 2, 0, 7 + 4], err_msg="lengths after commit (mlx)"
    )
    close(
        target.forward_tree(_tree(beams0, backend, target), np.array([2])).logits[0],
        expected[3],
        "slot 2's next tree after a commit over [2, 0] vs a one-slot target",
    )
    slot0_before = backend.to_numpy(
        target.forward_tree(_tree(beams2, backend, target), np.array([0])).logits[0]
    )
    target.release(2)
    np.testing.assert_array_equal(
        target.cache_lengths, [5, 0, 0], err_msg="lengths after release(2) (mlx)"
    )
    expected = fresh_run(other, [(beams2, None), (beams0, 2), (beams2, None)])
    close(target.admit(2, other).logits, expected[0], "admit after release vs a fresh target")
    both = backend.to_numpy(
        target.forward_tree(_tree([beams2[0], beams2[0]], backend, target), np.array([0, 2])).logits
    )
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


@pytest.mark.parametrize(
    "change",
    [
        dict(model_type="mistral", architectures=["MistralForCausalLM"], sliding_window=3),
        dict(
            rope_theta=500000.0,
            rope_scaling=dict(
                rope_type="llama3",
                factor=8.0,
                low_freq_factor=1.0,
                high_freq_factor=4.0,
                original_max_position_embeddings=16,
            ),
        ),
    ],
    ids=["mistral-sliding-window", "llama3-rope-scaling"],
)
def test_config_variants_match_reference(tmp_path, change):
    folder = make_random_model(
        tmp_path / "m",
        vocab_size=64,
        hidden_size=32,
        num_layers=2,
        num_heads=4,
        num_kv_heads=2,
        seed=4,
    )
    config = json.loads((folder / "config.json").read_text())
    config.update(change)
    (folder / "config.json").write_text(json.dumps(config))
    checks.check_target(
        "mlx", folder, dtype="float32", prompts=(tuple(range(1, 40)), (7,), (8, 9, 10)), steps=4
    )


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_attributes_match_reference(models, arch):
    reference = load_reference(models[arch])
    target = MlxBackend().load_target(models[arch])
    where = f"MlxTarget attributes ({arch})"
    assert (target.vocab_size, target.hidden_size) == (
        reference.vocab_size,
        reference.hidden_size,
    ), where
    assert target.eos_token_ids == reference.eos_token_ids, where
    assert target.name == reference.name == Path(models[arch]).name, where
    assert target.fingerprint == reference.fingerprint, (
        f"{where}: fingerprint differs from the reference's"
    )
    assert (target.tokenizer is None) == (reference.tokenizer is None), where
    for name in ("embed_tokens", "lm_head"):
        np.testing.assert_array_equal(
            np.array(getattr(target, name)),
            getattr(reference, name).astype(np.float32),
            err_msg=f"{where}: {name}",
        )
    assert target.dtype == mx.float32, where


def test_model_object_and_pair_load_like_the_folder(models):
    from mlx_lm.utils import load_model

    folder = models["qwen2"]
    model, _ = load_model(Path(folder))
    backend = MlxBackend()
    prompts = [[1, 2, 3], [4]]
    from_folder = backend.load_target(folder, slots=len(prompts))
    expected = Batch(from_folder, backend).prefill(prompts).logits
    for source in (model, (model, None)):
        target = backend.load_target(source, slots=len(prompts))
        assert target.fingerprint == from_folder.fingerprint, (
            "fingerprint of an mlx-lm model object"
        )
        assert (target.num_slots, target.capacity) == (from_folder.num_slots, from_folder.capacity)
        np.testing.assert_array_equal(
            Batch(target, backend).prefill(prompts).logits,
            expected,
            err_msg=f"prefill logits of {type(source).__name__} vs folder",
        )
    assert backend.load_target(from_folder) is from_folder, (
        "an MlxTarget passes through load_target"
    )


def test_errors_name_the_problem(models):
    backend = MlxBackend()
    with pytest.raises(InvalidInputError, match="float64 is the numpy backend's"):
        backend.load_target(models["llama"], dtype="float64")
    with pytest.raises(InvalidInputError, match="runs on"):
        backend.load_target(models["llama"], device="tpu")
    with pytest.raises(InvalidInputError, match="slots must be a positive integer"):
        backend.load_target(models["llama"], slots=0)
    with pytest.raises(InvalidInputError, match="capacity must be an integer"):
        backend.load_target(models["llama"], capacity=1)
    target = backend.load_target(models["llama"], slots=2, capacity=16)
    assert (target.num_slots, target.capacity) == (2, 16)
    tree = DraftTree(
        tokens=mx.zeros((1, 1), dtype=mx.int32),
        parents=mx.full((1, 1), -1),
        depth=mx.zeros((1, 1)),
        ancestor_mask=mx.ones((1, 1, 1), dtype=mx.bool_),
        num_nodes=mx.ones((1,)),
    )
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
        path=mx.zeros((1, 1)), num_accepted=mx.zeros((1,)), bonus_tokens=mx.zeros((1,))
    )
    with pytest.raises(InvalidInputError, match="needs a preceding forward_tree"):
        target.commit(tree, verdict)
    target.forward_tree(tree, np.array([1]))
    target.commit(tree, verdict)
    np.testing.assert_array_equal(
        target.cache_lengths, [2, 2], err_msg="lengths after committing a root to slot 1"
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
    with pytest.raises(InvalidInputError, match=r"outside \[0, 64\)"):
        target.admit(1, [1, 64])
    with pytest.raises(InvalidInputError, match="non-empty"):
        target.admit(1, [])
    with pytest.raises(InvalidInputError, match=r"admit\(slot=1\).*do not fit its capacity of 16"):
        target.admit(1, [1] * 17)
    with pytest.raises(InvalidInputError, match="slot 1 holds no request"):
        target.forward_tree(tree, np.array([1]))  # failed admissions leave the slot free
    with pytest.raises(InvalidInputError, match="layers"):
        target.admit(1, [1], layers=[2])


def test_bfloat16_runs_and_agrees_where_the_margin_is_wide(models):
    """bf16 keeps ~3 significant digits: compare argmaxes only where float32's top two logits
    differ by more than 0.5 (several times bf16's error on logits of size ~10)."""
    backend = MlxBackend()
    prompts = [[1, 2, 3, 4], [5, 6]]
    exact = (
        Batch(backend.load_target(models["llama"], slots=len(prompts)), backend)
        .prefill(prompts)
        .logits[:, 0]
    )
    low = backend.load_target(models["llama"], dtype="bfloat16", slots=len(prompts))
    assert low.dtype == mx.bfloat16 and low.embed_tokens.dtype == mx.bfloat16
    rough = Batch(low, backend).prefill(prompts).logits[:, 0]
    top2 = np.sort(exact, axis=-1)[:, -2:]
    wide = top2[:, 1] - top2[:, 0] > 0.5
    assert wide.any(), "test precondition: some row has a wide top-2 margin"
    assert np.all(np.isfinite(rough)), "bfloat16 prefill logits must be finite"
    np.testing.assert_array_equal(
        np.argmax(rough, -1)[wide],
        np.argmax(exact, -1)[wide],
        err_msg="bfloat16 vs float32 argmax where the margin is wide",
    )


def test_quantized_mlx_lm_model_decodes_like_mlx_lm(models):
    """Quantized layers are reused as modules: greedy tokens equal mlx-lm's on the same model."""
    import mlx.nn as nn
    from mlx_lm.generate import generate_step
    from mlx_lm.utils import load_model

    import specdec

    model, _ = load_model(Path(models["qwen2"]))
    nn.quantize(model, group_size=32, bits=8)
    prompt = [1, 2, 3, 4]
    steps = list(
        generate_step(
            mx.array(prompt), model, max_tokens=8, sampler=lambda x: mx.argmax(x, axis=-1)
        )
    )
    for _, log_probs in steps:
        top2 = np.sort(np.array(log_probs).ravel())[-2:]
        assert top2[1] - top2[0] > 1e-3, "test precondition: no near-tie in mlx-lm's greedy choice"
    target = MlxBackend().load_target((model, None))
    assert target.embed_tokens.shape == (64, 32), (
        "embed_tokens of a quantized model is dequantized (V, H)"
    )
    tokens = specdec.generate(
        target, prompt, drafter="none", backend="mlx", max_new_tokens=8, stop_at_eos=False
    ).tokens
    assert tokens == [int(t) for t, _ in steps], f"quantized qwen2: mlx backend {tokens} vs mlx-lm"
