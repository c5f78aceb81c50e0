"""Optimizer state in checkpoints without ``optimizer.build``: the slots and step counts
the ps created at the first update are saved, and restore recreates them on fresh ps
tasks, so a restored Adam continues exactly as an unbroken run (optax's)."""

from __future__ import annotations

from typing import Any

import numpy as np
import optax
import pytest

from jaxcluster.local_cluster import LocalCluster
from jaxcluster.strategy import FixedShardsPartitioner, ParameterServerStrategy
from jaxcluster.strategy import optimizers as opt


def _strategy(cluster: LocalCluster, partitioner: Any) -> ParameterServerStrategy:
    return ParameterServerStrategy(cluster.resolver, partitioner, auth_token=cluster.auth_token)


def _variables(strategy: ParameterServerStrategy, start: dict[str, np.ndarray]) -> dict[str, Any]:
    with strategy.scope():
        return {name: strategy.Variable(value, name=name) for name, value in start.items()}


def test_unbuilt_adam_state_survives_save_and_restore_into_fresh_ps(tmp_path: Any) -> None:
    rng = np.random.default_rng(27)
    start = {
        "w": rng.normal(size=(6, 3)).astype(np.float32),  # partitioned over both ps tasks
        "b": rng.normal(size=(1, 3)).astype(np.float32),  # one row: one shard
    }
    grads = [
        {k: rng.normal(size=v.shape).astype(np.float32) for k, v in start.items()} for _ in range(6)
    ]
    reference = optax.adam(0.05, eps=1e-7)
    params = {k: v.copy() for k, v in start.items()}
    state = reference.init(params)
    for grad in grads:  # the unbroken run
        updates, state = reference.update(grad, state, params)
        params = {k: np.asarray(v) for k, v in optax.apply_updates(params, updates).items()}

    path = tmp_path / "ckpt"
    partitioner = FixedShardsPartitioner(2)
    with LocalCluster(num_workers=1, num_ps=2) as first:
        strategy = _strategy(first, partitioner)
        variables = _variables(strategy, start)
        adam = opt.Adam(0.05)
        for grad in grads[:3]:
            adam.apply_gradients(grad, variables)  # never built: the ps makes the slots
        strategy.save(path)
    saved = {v.name for v in strategy.variables}
    assert {"w/Adam/m", "w/Adam/v", "b/Adam/m", "b/Adam/v", "b/Adam/iterations"} <= saved
    assert {"w/part_0/Adam/iterations", "w/part_1/Adam/iterations"} <= saved

    with LocalCluster(num_workers=1, num_ps=2) as fresh:
        # Another partitioning cannot take per-shard step counts: refused, nothing changed.
        other = _strategy(fresh, None)
        other_vars = _variables(other, {k: np.zeros_like(v) for k, v in start.items()})
        with pytest.raises(ValueError, match=r"w/part_0/Adam/iterations"):
            other.restore(path)
        np.testing.assert_array_equal(other_vars["b"].read_value(), 0.0)

        restored = _strategy(fresh, partitioner)
        variables = _variables(restored, {k: np.zeros_like(v) for k, v in start.items()})
        restored.restore(path)  # recreates m, v and the counts on the fresh ps tasks
        adam = opt.Adam(0.05)
        assert adam.iterations(variables["w"]) == 3
        for grad in grads[3:]:
            adam.apply_gradients(grad, variables)
        for name, value in params.items():
            np.testing.assert_allclose(variables[name].read_value(), value, rtol=1e-6, atol=1e-6)
        assert adam.iterations(variables["b"]) == 6
