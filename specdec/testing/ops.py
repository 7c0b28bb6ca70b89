"""The array operations a framework backend offers drafters, and their conformance check.

A drafter written for a framework backend imports that backend's public ``ops`` module
(``<backend package>.ops``) and no other module of the backend (docs/writing-a-drafter.md,
"Backend array operations"). ``OPS`` names the functions every such module lists in its
``__all__``; ``check_ops`` compares them with NumPy (``specdec.reference.sampling`` and a stable
argsort) on logits full of exact ties, which must all go to the lowest index.
"""

from __future__ import annotations

from types import ModuleType

import numpy as np

from specdec.plugins.registry import PluginRegistry, default_registry
from specdec.reference.sampling import sample_from, softmax, target_probs
from specdec.types import SamplingConfig

__all__ = ["OPS", "check_ops"]

OPS = (
    "as_array",
    "categorical",
    "compute_dtype",
    "draft_weight",
    "first_argmax",
    "head_product",
    "log_softmax",
    "placed",
    "sample_from",
    "softmax",
    "stable_descending_order",
    "target_probs",
    "top_indices",
    "top_k_lowest_index",
    "top_k_mask",
)
SAMPLINGS = (
    SamplingConfig(temperature=0.0),
    SamplingConfig(temperature=1.0),
    SamplingConfig(temperature=0.7, top_k=3),
    SamplingConfig(temperature=1.3, top_p=0.6),
    SamplingConfig(temperature=0.9, top_k=5, top_p=0.8),
)
TOLERANCE = dict(rtol=2e-4, atol=2e-5)  # float32 probabilities against the float64 reference


def check_ops(
    ops: ModuleType,
    backend_name: str,
    *,
    seed: int = 0,
    rows: int = 3,
    vocab: int = 8,
    registry: PluginRegistry | None = None,
) -> None:
    """Raise AssertionError, naming the operation and its input, where a backend's ``ops`` module
    lacks a name of ``OPS`` or a docstring, or differs from NumPy on random integer logits
    (2, rows, vocab) in float32: rankings and masks must be identical (ties to the lowest index),
    probabilities within float32 rounding, samples identical for uniforms away from a cdf step;
    ``placed`` must keep a drafter's weights in the target array's dtype and ids as integers.
    ``backend_name``'s ``to_numpy`` reads the results."""
    exported = set(getattr(ops, "__all__", ()))
    missing = [name for name in OPS if name not in exported]
    assert not missing, f"{ops.__name__}.__all__ lacks {missing}"
    undocumented = [
        name for name in sorted(exported) if not (getattr(ops, name).__doc__ or "").strip()
    ]
    assert not undocumented, f"{ops.__name__}: no docstring for {undocumented}"
    to_numpy = (registry or default_registry()).get("backend", backend_name).factory().to_numpy
    rng = np.random.default_rng(seed)
    logits = rng.integers(-3, 3, size=(2, rows, vocab)).astype(np.float32)  # many exact ties
    x = ops.as_array(logits)
    order = np.argsort(-logits, axis=-1, kind="stable")
    rank = np.argsort(order, axis=-1)
    where = f"on logits {logits.tolist()}"

    def same(name: str, got, expected: np.ndarray) -> None:
        got = np.asarray(to_numpy(got))
        assert got.shape == expected.shape and np.array_equal(got, expected), (
            f"{ops.__name__}.{name} {where}: got {got.tolist()}, expected {expected.tolist()}"
        )
        if expected.dtype.kind == "i":
            assert got.dtype.kind in "iu", (
                f"{ops.__name__}.{name}: indices of dtype {got.dtype}, expected integers"
            )

    def close(name: str, got, expected: np.ndarray) -> None:
        got = np.asarray(to_numpy(got), dtype=np.float64)
        assert got.shape == expected.shape, (
            f"{ops.__name__}.{name}: shape {got.shape}, expected {expected.shape}"
        )
        np.testing.assert_allclose(
            got, expected, **TOLERANCE, err_msg=f"{ops.__name__}.{name} {where}"
        )

    same("first_argmax", ops.first_argmax(x), np.argmax(logits, axis=-1))
    same("stable_descending_order", ops.stable_descending_order(x), order)
    for k in range(1, vocab + 1):
        same(f"top_indices(k={k})", ops.top_indices(x, k), order[..., :k])
        values, indices = ops.top_k_lowest_index(x, k)
        same(f"top_k_lowest_index(k={k})[1]", indices, order[..., :k])
        same(
            f"top_k_lowest_index(k={k})[0]",
            values,
            np.take_along_axis(logits, order[..., :k], axis=-1),
        )
        same(f"top_k_mask(k={k})", ops.top_k_mask(x, k), rank < k)
    # -inf logits get no mass
    masked = np.where(rank < vocab // 2, logits, -np.inf).astype(np.float32)
    close("softmax", ops.softmax(ops.as_array(masked)), softmax(masked))
    with np.errstate(divide="ignore"):
        expected_log = np.log(softmax(masked))
    got_log = np.asarray(to_numpy(ops.log_softmax(ops.as_array(masked))), dtype=np.float64)
    assert np.array_equal(np.isinf(got_log), np.isinf(expected_log)), (
        f"{ops.__name__}.log_softmax: -inf moved"
    )
    close(
        "log_softmax",
        np.where(np.isinf(got_log), 0.0, got_log),
        np.where(np.isinf(expected_log), 0.0, expected_log),
    )
    for sampling in SAMPLINGS:
        close(
            f"target_probs({sampling})",
            ops.target_probs(x, sampling),
            target_probs(logits, sampling),
        )
    # (2, rows, V), zeros included
    probs = target_probs(logits, SamplingConfig(temperature=1.0, top_k=5))
    tokens = sample_from(probs, rng.random(probs.shape[:-1]))
    cdf = np.cumsum(probs, axis=-1)
    low = np.take_along_axis(cdf - probs, tokens[..., None], axis=-1)[..., 0]
    # mid-step
    uniforms = (low + np.take_along_axis(probs, tokens[..., None], axis=-1)[..., 0] / 2) / cdf[
        ..., -1
    ]
    on_device = ops.as_array(probs.astype(np.float32))
    same("sample_from", ops.sample_from(on_device, ops.as_array(uniforms)), tokens)
    same("categorical", ops.categorical(on_device, ops.as_array(uniforms)), tokens)
    same("categorical(uniforms=None)", ops.categorical(on_device, None), np.argmax(probs, axis=-1))
    assert ops.compute_dtype(x.dtype) is not None, (
        f"{ops.__name__}.compute_dtype({x.dtype}) returned None"
    )
    # small integers: exact in float32
    weight = rng.integers(-3, 3, size=(vocab * 4, rows)).astype(np.float32)
    # one row and several (the torch backend measures a formulation for each)
    for count in (
        1,
        2,
        5,
    ):
        inputs = rng.integers(-3, 3, size=(count, 2, rows)).astype(np.float32)
        same(
            f"head_product({count} x 2 rows)",
            ops.head_product(ops.as_array(inputs), ops.as_array(weight)),
            (inputs @ weight.T).astype(np.float32),
        )
        bias = rng.integers(-3, 3, size=vocab * 4).astype(np.float32)
        product = ops.draft_weight(ops.as_array(weight), ops.as_array(bias), int8=False)
        same(
            f"draft_weight(int8=False)({count} x 2 rows)",
            product(ops.as_array(inputs)),
            (inputs @ weight.T + bias).astype(np.float32),
        )
    # a drafter's weights as the backend keeps them: in the target array's dtype, ids as integers
    for like in (x, ops.as_array(logits.astype(np.float64))):
        host = rng.integers(-3, 3, size=(rows, vocab)).astype(np.float64)  # exact in any dtype
        placed = ops.placed(host, like)
        assert placed.dtype == like.dtype, (
            f"{ops.__name__}.placed: dtype {placed.dtype}, expected the target array's {like.dtype}"
        )
        same(f"placed(dtype {like.dtype})", placed, host.astype(np.asarray(to_numpy(like)).dtype))
        ids = np.arange(vocab, dtype=np.float32)  # ids a checkpoint stored as floats
        same("placed(index=True)", ops.placed(ids, like, index=True), np.arange(vocab))
