"""ParameterServerStrategy variables inside ``jax.jit``: reads and updates happen each time
the compiled function runs (as in a ``tf.function``), on the coordinator and on workers,
never once at trace time; a wrong shape is caught at trace time; and the faster
pattern of docs/parameter_servers.md (read outside, pass the value in) gives the same training."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from typing import Any

import cloudpickle
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxcluster.coordinator import ClusterCoordinator
from jaxcluster.local_cluster import LocalCluster
from jaxcluster.strategy import ParameterServerStrategy

# The jitted steps below are defined in this module: send them by value.
cloudpickle.register_pickle_by_value(sys.modules[__name__])


@pytest.fixture(scope="module")
def cluster() -> Iterator[LocalCluster]:
    with LocalCluster(num_workers=2, num_ps=1) as c:
        yield c


@pytest.fixture
def strategy(cluster: LocalCluster) -> ParameterServerStrategy:
    return ParameterServerStrategy(cluster.resolver, auth_token=cluster.auth_token)


def test_the_issue_example_updates_five_times_on_the_coordinator(
    strategy: ParameterServerStrategy,
) -> None:
    with strategy.scope():
        w = strategy.Variable(np.zeros(3, np.float32), name="jit_local_w")

    @jax.jit
    def step() -> Any:
        seen = w.read_value()
        w.assign_add(jnp.ones(3, jnp.float32))
        return seen

    seen = [np.asarray(step()) for _ in range(5)]
    np.testing.assert_array_equal(w.read_value(), [5, 5, 5])
    # Each call read the value of its time, not a constant baked in when it was traced.
    assert [float(s[0]) for s in seen] == [0.0, 1.0, 2.0, 3.0, 4.0]


def test_a_jitted_train_step_scheduled_on_workers_updates_once_per_closure(
    cluster: LocalCluster, strategy: ParameterServerStrategy
) -> None:
    with strategy.scope():
        w = strategy.Variable(np.zeros(3, np.float32), name="jit_remote_w")
        steps = strategy.Variable(np.int32(0), name="jit_remote_steps")

    @jax.jit
    def train_step(x: Any) -> Any:
        grad = jax.grad(lambda p: jnp.sum((p - x) ** 2))(w.read_value())
        w.assign_sub(0.25 * grad)
        steps.assign_add(jnp.int32(1))
        return jnp.sum(grad**2)

    target = np.array([1.0, 2.0, 3.0], np.float32)
    with ClusterCoordinator(strategy) as coordinator:
        # One at a time: each step reads what the one before it wrote (steps racing on the
        # same variable would be asynchronous SGD, whose result is not exact).
        values = [coordinator.schedule(train_step, args=(target,)).fetch() for _ in range(5)]
    # Each step halves the distance to the target: five steps leave 1/32 of it.
    np.testing.assert_allclose(w.read_value(), target * (1 - 0.5**5), rtol=1e-6)
    assert int(steps.read_value()) == 5
    assert len(values) == 5 and all(np.isfinite(v) for v in values)


def test_a_wrong_shape_is_an_error_at_trace_time_naming_the_variable(
    strategy: ParameterServerStrategy,
) -> None:
    with strategy.scope():
        w = strategy.Variable(np.zeros(3, np.float32), name="jit_shape_w")

    @jax.jit
    def bad(delta: Any) -> None:
        w.assign_add(delta)

    with pytest.raises(ValueError, match=r"'jit_shape_w'.*shape \(4,\); expected shape \(3,\)"):
        bad(jnp.ones(4, jnp.float32))
    np.testing.assert_array_equal(w.read_value(), [0, 0, 0])


def test_jnp_operations_and_eager_grad_read_the_current_value(
    strategy: ParameterServerStrategy,
) -> None:
    with strategy.scope():
        w = strategy.Variable(np.array([1.0, 2.0], np.float32), name="jit_ops_w")

    scaled = jax.jit(lambda s: jnp.asarray(w) * s)
    np.testing.assert_allclose(scaled(2.0), [2.0, 4.0])
    w.assign(np.array([3.0, 4.0], np.float32))
    np.testing.assert_allclose(scaled(2.0), [6.0, 8.0])  # read again, not cached
    # Eager grad stages nothing: the read is a plain RPC and a constant of the gradient.
    grad = jax.grad(lambda p: jnp.sum(p * w.read_value()))(jnp.ones(2))
    np.testing.assert_allclose(grad, [3.0, 4.0])


def test_the_readme_pattern_reads_outside_and_passes_the_value_in(
    cluster: LocalCluster, strategy: ParameterServerStrategy
) -> None:
    with strategy.scope():
        w = strategy.Variable(np.zeros(3, np.float32), name="jit_readme_w")

    @jax.jit
    def gradient(params: Any, x: Any) -> Any:
        return jax.grad(lambda p: jnp.sum((p - x) ** 2))(params)

    def train_step(x: Any) -> None:
        w.assign_sub(0.25 * gradient(w.read_value(), x))

    target = np.array([1.0, 2.0, 3.0], np.float32)
    with ClusterCoordinator(strategy) as coordinator:
        for _ in range(5):
            coordinator.schedule(train_step, args=(target,)).fetch()
    np.testing.assert_allclose(w.read_value(), target * (1 - 0.5**5), rtol=1e-6)
