"""What a TF program ported to jaxcluster relies on (docs/porting.md), on a
real LocalCluster: OutOfRangeError from an exhausted per-worker iterator, bool and pytree
variables, ``coordinator.strategy``, TF's name for the worker-index function."""

from __future__ import annotations

import sys
from collections.abc import Iterator

import cloudpickle
import jax
import numpy as np
import pytest

from jaxcluster import coordinator as coordinator_module
from jaxcluster import errors
from jaxcluster.coordinator import ClusterCoordinator
from jaxcluster.local_cluster import LocalCluster
from jaxcluster.strategy import ParameterServerStrategy

cloudpickle.register_pickle_by_value(sys.modules[__name__])


@pytest.fixture(scope="module")
def cluster() -> Iterator[LocalCluster]:
    with LocalCluster(num_workers=2, num_ps=1) as c:
        yield c


@pytest.fixture(scope="module")
def strategy(cluster: LocalCluster) -> ParameterServerStrategy:
    return ParameterServerStrategy(cluster.resolver, auth_token=cluster.auth_token)


def take(iterator: Iterator[int]) -> int:
    return next(iterator)


def total(iterator: Iterator[int]) -> int:
    return sum(x for x in iterator)  # a for loop ends quietly at OutOfRangeError


def test_exhausted_per_worker_iterator_raises_out_of_range(cluster: LocalCluster) -> None:
    with cluster.coordinator() as coordinator:
        finite = iter(coordinator.create_per_worker_dataset(lambda: range(2)))
        with pytest.raises(errors.OutOfRangeError) as info:
            for _ in range(10):  # more than 2 workers x 2 elements, however they are spread
                coordinator.schedule(take, args=(finite,))
            coordinator.join(timeout=120)
        assert isinstance(info.value, StopIteration)
        assert "exhausted" in str(info.value)
        # The coordinator is usable again, and a for loop over an iterator ends quietly.
        dataset = coordinator.create_per_worker_dataset(lambda: range(4))
        assert coordinator.schedule(total, args=(iter(dataset),)).fetch(timeout=120) == 6


def test_per_closure_policy_keeps_out_of_range_on_its_value(cluster: LocalCluster) -> None:
    with cluster.coordinator(error_policy="per_closure") as coordinator:
        finite = iter(coordinator.create_per_worker_dataset(lambda: range(1)))
        values = [coordinator.schedule(take, args=(finite,)) for _ in range(6)]
        assert coordinator.join(timeout=120)
        outcomes = []
        for value in values:
            try:
                outcomes.append(value.fetch())
            except errors.OutOfRangeError:
                outcomes.append("end")
        # each worker that ran a closure gave its one element once, then ran out
        assert 1 <= outcomes.count(0) <= 2
        assert outcomes.count("end") == 6 - outcomes.count(0)


def test_bool_variable_assigns_and_refuses_arithmetic(strategy: ParameterServerStrategy) -> None:
    with strategy.scope():
        flag = strategy.Variable(False, name="done")
        mask = strategy.Variable(np.array([True, False, True]), name="mask")
    assert flag.dtype == np.bool_ and flag.storage_dtype == np.uint8
    assert flag.read_value().dtype == np.bool_ and not flag.read_value()
    flag.assign(True)
    assert flag.read_value() == np.True_
    mask.assign(np.array([False, True, True]))
    assert mask.read_value().tolist() == [False, True, True]
    for op in (lambda: flag.assign_add(True), lambda: flag.assign_sub(True)):
        with pytest.raises(TypeError, match="only be assigned"):
            op()
    with pytest.raises(TypeError, match="only be assigned"):
        mask.scatter_add(indices=[0], updates=[True])
    with pytest.raises(TypeError):
        flag.assign(2)  # an int is not a bool; nothing is converted silently


def test_bool_variables_survive_a_checkpoint(strategy: ParameterServerStrategy, tmp_path) -> None:
    with strategy.scope():
        flag = strategy.Variable(True, name="flag_ckpt")
    strategy.save(tmp_path / "ckpt")
    flag.assign(False)
    strategy.restore(tmp_path / "ckpt")
    assert flag.read_value() == np.True_


@pytest.mark.parametrize(
    "value",
    [
        {"w": np.zeros(2), "b": 0.0},
        [np.zeros(2), np.zeros(3)],
    ],
)
def test_a_pytree_asks_for_one_variable_per_leaf(
    strategy: ParameterServerStrategy, value: object
) -> None:
    with strategy.scope(), pytest.raises(TypeError, match="one Variable per leaf"):
        strategy.Variable(value)


def test_one_variable_per_leaf_with_tree_map(strategy: ParameterServerStrategy) -> None:
    with strategy.scope():
        params = jax.tree.map(strategy.Variable, {"w": np.ones(2, np.float32), "b": 0.5})
    values = jax.tree.map(lambda v: v.read_value(), params)
    assert values["w"].tolist() == [1.0, 1.0] and float(values["b"]) == 0.5


def test_coordinator_strategy(cluster: LocalCluster, strategy: ParameterServerStrategy) -> None:
    with ClusterCoordinator(strategy) as coordinator:
        assert coordinator.strategy is strategy
    with cluster.coordinator() as coordinator:
        assert coordinator.strategy is None


def test_tf_name_of_the_worker_index_function() -> None:
    assert (
        coordinator_module.experimental_get_current_worker_index
        is coordinator_module.get_current_worker_index
    )
    with pytest.raises(RuntimeError):
        coordinator_module.experimental_get_current_worker_index()
