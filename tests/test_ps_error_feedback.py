"""Error feedback for compressed updates (``apply_gradients(..., error_feedback=...)``) on
a real LocalCluster: the residual stays on the caller, so the updates the ps applied add up
to the gradients given; without it, what quantisation rounds away is lost for good."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest

from jaxcluster.local_cluster import LocalCluster
from jaxcluster.strategy import FixedShardsPartitioner, ParameterServerStrategy
from jaxcluster.strategy import optimizers as opt


@pytest.fixture(scope="module")
def strategy() -> Iterator[ParameterServerStrategy]:
    with LocalCluster(num_workers=1, num_ps=2) as c:
        yield ParameterServerStrategy(
            c.resolver, FixedShardsPartitioner(2), auth_token=c.auth_token
        )


def _gradients(steps: int, size: int, base: float) -> list[np.ndarray]:
    """One large entry (it sets int8's step) and many small ones, most below half a step,
    with a bias: rounding drops them every time unless the residual carries them. With
    ``base=1`` every entry is just above 1, where bfloat16 rounds the excess away."""
    rng = np.random.default_rng(3)
    grads = []
    for _ in range(steps):
        g = (base + 0.002 + 0.002 * rng.normal(size=size)).astype(np.float32)
        g[0] = 1.0
        grads.append(g)
    return grads


@pytest.mark.parametrize("compression", ["int8", "bf16"])
def test_with_feedback_the_applied_sum_tracks_the_true_sum(
    strategy: ParameterServerStrategy, compression: str
) -> None:
    steps, size = 60, 512
    with strategy.scope():
        plain = strategy.Variable(np.zeros(size, np.float32), name=f"ef_off_{compression}")
        fed = strategy.Variable(np.zeros(size, np.float32), name=f"ef_on_{compression}")
    sgd = opt.SGD(1.0, name="ef_sgd")
    residual: object = True
    grads = _gradients(steps, size, base=1.0 if compression == "bf16" else 0.0)
    for g in grads:
        sgd.apply_gradients([(g, plain)], compression=compression)
        residual = sgd.apply_gradients([(g, fed)], compression=compression, error_feedback=residual)
    true = np.sum(np.asarray(grads, np.float64), axis=0)
    assert isinstance(residual, list) and len(residual) == 1
    # SGD(1.0) from zero: -w is the sum of the applied updates; with feedback it is the true
    # sum less what is still held back, and that is under one quantisation step.
    applied_fed, applied_plain = -fed.read_value(), -plain.read_value()
    np.testing.assert_allclose(applied_fed + residual[0], true, rtol=1e-5, atol=1e-4)
    step = 1.0 / 127 if compression == "int8" else 2.0**-7  # int8's step; bf16's ulp at 1
    fed_error = np.abs(applied_fed - true).max()
    plain_error = np.abs(applied_plain - true).max()
    assert fed_error <= step, (fed_error, step)
    assert plain_error > 10 * fed_error, (plain_error, fed_error)  # drifts without it


def test_pytrees_return_a_residual_shaped_like_the_variables(
    strategy: ParameterServerStrategy,
) -> None:
    with strategy.scope():
        params = {
            "kernel": strategy.Variable(np.zeros((8, 3), np.float32), name="ef_kernel"),
            "bias": strategy.Variable(np.zeros(3, np.float32), name="ef_bias"),
        }
    assert len(params["kernel"].shards) == 2  # one int8 scale per shard
    adam = opt.Adam(0.01, name="ef_adam")
    rng = np.random.default_rng(0)
    residual: object = True
    for _ in range(3):
        grads = {
            "kernel": rng.normal(size=(8, 3)).astype(np.float32),
            "bias": rng.normal(size=3).astype(np.float32),
        }
        residual = adam.apply_gradients(grads, params, compression="int8", error_feedback=residual)
        assert isinstance(residual, dict) and set(residual) == {"kernel", "bias"}
        assert residual["kernel"].shape == (8, 3) and residual["bias"].shape == (3,)
        kernel = grads["kernel"]
        # Each shard's residual is under half of that shard's own step (its own scale).
        for rows in (slice(0, 4), slice(4, 8)):
            half_step = np.abs(kernel[rows] + 0).max() / 127
            assert np.abs(residual["kernel"][rows]).max() <= half_step * 1.5
    assert adam.iterations(params["bias"]) == 3
    assert (
        adam.apply_gradients(grads, params, compression="int8") is None
    )  # no feedback asked: nothing returned


def test_feedback_needs_a_compression_and_a_matching_residual(
    strategy: ParameterServerStrategy,
) -> None:
    with strategy.scope():
        w = strategy.Variable(np.zeros(4, np.float32), name="ef_checks")
    sgd = opt.SGD(0.1, name="ef_checks")
    g = np.ones(4, np.float32)
    with pytest.raises(ValueError, match="compression"):
        sgd.apply_gradients([(g, w)], error_feedback=True)
    with pytest.raises(ValueError, match="2 residuals for 1 gradients"):
        sgd.apply_gradients([(g, w)], compression="int8", error_feedback=[g, g])
    with pytest.raises(ValueError, match="shape"):
        sgd.apply_gradients([(g, w)], compression="int8", error_feedback=[np.ones(3)])
    np.testing.assert_array_equal(w.read_value(), np.zeros(4, np.float32))  # nothing sent
