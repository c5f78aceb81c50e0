"""ClusterCoordinator against real worker processes: scheduling, fetching, joining."""

from __future__ import annotations

import collections
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from jaxcluster.coordinator import (
    ClusterCoordinator,
    RemoteValue,
    RemoteValueStatus,
    get_current_worker_index,
)
from support.closures import barrier

NUM_WORKERS = 2


def _nested(x: int) -> dict[str, Any]:
    return {"array": np.arange(x), "pair": (x, [x + 1, None]), "text": f"n{x}"}


def test_nested_return_structures_come_back_as_numpy(coordinator: ClusterCoordinator) -> None:
    rv = coordinator.schedule(_nested, args=(4,))
    value = rv.fetch()
    np.testing.assert_array_equal(value["array"], np.arange(4))
    assert value["pair"] == (4, [5, None]) and value["text"] == "n4"
    assert rv.status is RemoteValueStatus.READY and rv.done()


def test_fetch_maps_a_structure_of_remote_values_and_other_leaves(
    coordinator: ClusterCoordinator,
) -> None:
    Point = collections.namedtuple("Point", "x y")
    square = lambda v: v * v  # noqa: E731 - a lambda is pickled by value
    rvs = [coordinator.schedule(square, args=(i,)) for i in range(3)]
    structure = {"list": rvs, "point": Point(rvs[0], "plain"), "none": None, "n": 7}
    fetched = coordinator.fetch(structure)
    assert fetched == {"list": [0, 1, 4], "point": Point(0, "plain"), "none": None, "n": 7}
    assert type(fetched["point"]) is Point
    assert coordinator.fetch(rvs[2]) == 4
    assert coordinator.fetch("no remote values") == "no remote values"


def test_join_with_nothing_scheduled_returns_true(coordinator: ClusterCoordinator) -> None:
    assert coordinator.join() is True
    assert coordinator.join(timeout=0.0) is True
    assert coordinator.done() is True


def test_many_async_schedules_then_join(coordinator: ClusterCoordinator) -> None:
    before = coordinator.metrics()["completed"]
    rvs = [
        coordinator.schedule(lambda a, b=0: a * 3 + b, args=(i,), kwargs={"b": 1})
        for i in range(500)
    ]
    assert coordinator.join() is True
    assert coordinator.done() is True
    assert all(rv.done() for rv in rvs)
    assert [rv.fetch() for rv in rvs] == [i * 3 + 1 for i in range(500)]
    assert coordinator.metrics()["completed"] - before >= 500


def test_a_remote_value_as_input_is_its_result(coordinator: ClusterCoordinator) -> None:
    # Dataflow (issue 26): where TF raises ValueError, the consumer receives the result.
    rv = coordinator.schedule(lambda: 1)
    consumer = coordinator.schedule(lambda x: x["nested"][0] + 1, args=({"nested": [rv]},))
    assert consumer.fetch() == 2
    assert rv.fetch() == 1

    class Box:
        def __init__(self, value: object) -> None:
            self.value = value

    # Inside an object dataflow does not look into, it is still refused, saying why.
    with pytest.raises(ValueError, match="not a tuple, list, dict or registered JAX pytree node"):
        coordinator.schedule(lambda x: x, args=(Box(rv),))


def test_bad_schedule_arguments_are_rejected(coordinator: ClusterCoordinator) -> None:
    with pytest.raises(TypeError, match="callable fn"):
        coordinator.schedule("not a function")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="must be a tuple or list, got int"):
        coordinator.schedule(lambda x: x, args=3)
    with pytest.raises(TypeError, match="must be a mapping, got list"):
        coordinator.schedule(lambda x: x, kwargs=[1])  # type: ignore[arg-type]


def test_worker_index_covers_every_worker_and_closures_run_in_parallel(
    coordinator: ClusterCoordinator, tmp_path: Path
) -> None:
    # Each closure waits at a barrier for all NUM_WORKERS of them: since a worker runs one
    # closure at a time, they can only pass if they run at once, one on each worker.
    rvs = [coordinator.schedule(barrier, args=(str(tmp_path), NUM_WORKERS)) for _ in range(2)]
    assert sorted(coordinator.fetch(rvs)) == list(range(NUM_WORKERS))


def test_get_current_worker_index_outside_a_closure_raises() -> None:
    with pytest.raises(RuntimeError, match="outside a closure running on a worker"):
        get_current_worker_index()


def test_fetch_with_a_timeout_raises_deadline_exceeded_while_running(
    coordinator: ClusterCoordinator, tmp_path: Path
) -> None:
    from jaxcluster import errors
    from support.closures import gated_square

    gate = tmp_path / "gate"
    rv = coordinator.schedule(gated_square, args=(str(tmp_path), 3, str(gate)))
    with pytest.raises(errors.DeadlineExceededError, match="not ready within"):
        rv.fetch(timeout=0.05)
    assert coordinator.join(timeout=0.05) is False
    gate.touch()
    assert rv.fetch() == 9
    assert coordinator.join() is True


def test_metrics_and_workers_describe_the_cluster(
    cluster: Any, coordinator: ClusterCoordinator
) -> None:
    coordinator.schedule(lambda: None).fetch()
    metrics = coordinator.metrics()
    for key in ("queued", "inflight", "completed", "failed", "retried", "worker_failures"):
        assert isinstance(metrics[key], int), key
    assert metrics["functions_registered"] >= 1
    assert [w["address"] for w in metrics["workers"]] == cluster.addresses
    assert [w["address"] for w in coordinator.workers] == cluster.addresses
    assert {w["state"] for w in coordinator.workers} == {"up"}
    assert metrics["latency"]["count"] >= 1


def test_a_shut_down_coordinator_refuses_work(cluster: Any) -> None:
    coordinator = cluster.coordinator()
    assert coordinator.schedule(lambda: 5).fetch() == 5
    coordinator.shutdown()
    coordinator.shutdown()  # idempotent
    with pytest.raises(RuntimeError, match="shut down"):
        coordinator.schedule(lambda: 5)


def test_constructor_checks(cluster: Any) -> None:
    from jaxcluster.cluster_resolver import SimpleClusterResolver
    from jaxcluster.cluster_spec import ClusterSpec

    with pytest.raises(ValueError, match=r"no 'worker' job \(jobs: chief\)"):
        ClusterCoordinator(SimpleClusterResolver(ClusterSpec({"chief": ["h:1"]})))
    with pytest.raises(ValueError, match="error_policy='sometimes'"):
        ClusterCoordinator(cluster.resolver, error_policy="sometimes")
    with pytest.raises(ValueError, match="closure_timeout=-1"):
        ClusterCoordinator(cluster.resolver, closure_timeout=-1)
    with pytest.raises(TypeError, match="needs a cluster resolver"):
        ClusterCoordinator(object())


def test_a_strategy_like_object_supplies_resolver_and_token(cluster: Any) -> None:
    class Strategy:
        def __init__(self) -> None:
            self._cluster_resolver = cluster.resolver
            self.auth_token = cluster.auth_token

    with ClusterCoordinator(Strategy()) as coordinator:
        assert coordinator.schedule(lambda: "via strategy").fetch() == "via strategy"
    with ClusterCoordinator(strategy=Strategy()) as coordinator:
        assert isinstance(coordinator.schedule(lambda: 0), RemoteValue)
