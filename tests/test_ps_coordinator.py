"""Parameter-server failures through the coordinator, with real worker and ps processes:
a SIGKILLed ps surfaces as PSUnavailableError from join() within a deadline; failures
below TF's threshold are retried and the closure ends with its value; a killed worker is
still a worker failure; a worker holding only a token file reaches the ps."""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import cloudpickle
import numpy as np
import pytest

from jaxcluster import ClusterSpec, errors
from jaxcluster._native import core
from jaxcluster.cluster_resolver import SimpleClusterResolver
from jaxcluster.coordinator import ClusterCoordinator
from jaxcluster.coordinator._errors import build_exception
from jaxcluster.local_cluster import LocalCluster
from jaxcluster.strategy import ParameterServerStrategy, ParameterServerVariable
from jaxcluster.strategy.failures import ps_unavailable
from support.workers import running_worker, wait_until

cloudpickle.register_pickle_by_value(sys.modules[__name__])

DEADLINE = 60.0
THRESHOLD_VARS = (
    "TF_COORDINATOR_IGNORE_TRANSIENT_PS_FAILURES",
    "JAXCLUSTER_COORDINATOR_IGNORE_TRANSIENT_PS_FAILURES",
)


@pytest.fixture(autouse=True)
def default_threshold(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in THRESHOLD_VARS:
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def cluster() -> Iterator[LocalCluster]:
    with LocalCluster(num_workers=2, num_ps=2) as c:
        yield c


def make_strategy(cluster: LocalCluster) -> tuple[ParameterServerStrategy, Any, Any]:
    strategy = ParameterServerStrategy(cluster.resolver, auth_token=cluster.auth_token)
    with strategy.scope():
        weights = strategy.Variable(np.zeros(4, np.float32), name="weights")  # ps 0
        steps = strategy.Variable(0, name="steps", dtype=np.int64)  # ps 1
    assert [v.shards[0].task for v in (weights, steps)] == [0, 1]
    return strategy, weights, steps


def train_step(weights: ParameterServerVariable, steps: ParameterServerVariable) -> int:
    weights.assign_sub(np.full(4, 0.01, np.float32), read_value=False)
    steps.assign_add(1, read_value=False)
    return 1


def test_a_killed_ps_surfaces_from_join_as_ps_unavailable_error(cluster: LocalCluster) -> None:
    strategy, weights, steps = make_strategy(cluster)
    with ClusterCoordinator(strategy) as coordinator:
        values = [coordinator.schedule(train_step, args=(weights, steps)) for _ in range(2000)]
        wait_until(lambda: coordinator.metrics()["completed"] >= 10, DEADLINE, "10 steps ran")
        cluster.kill_ps(1)
        start = time.monotonic()
        with pytest.raises(errors.PSUnavailableError) as info:
            coordinator.join(timeout=DEADLINE)
        assert time.monotonic() - start < DEADLINE
        error = info.value
        assert isinstance(error, errors.UnavailableError)
        assert (error.task_type, error.task_id) == ("ps", 1)
        assert error.address == cluster.ps_addresses[1]

        metrics = coordinator.metrics()
        # TF's default: two reports about ps 1 were retried, the third was raised.
        assert metrics["ps_failures"] >= 3 and metrics["failed"] >= 1
        assert metrics["worker_failures"] == 0
        assert [w["state"] for w in metrics["workers"]] == ["up", "up"]
        assert (metrics["queued"], metrics["inflight"]) == (0, 0)
        outcomes = {"value": 0, "ps": 0, "cancelled": 0}
        for value in values:
            try:
                value.fetch()
                outcomes["value"] += 1
            except errors.PSUnavailableError:
                outcomes["ps"] += 1
            except errors.CancelledError:
                outcomes["cancelled"] += 1
        assert outcomes["value"] >= 10 and outcomes["ps"] >= 1 and outcomes["cancelled"] >= 1
        assert sum(outcomes.values()) == len(values)
        # The coordinator is usable again: a closure that needs only ps 0 runs.
        assert (
            coordinator.schedule(lambda w: float(w.read_value()[0]), args=(weights,)).fetch(
                timeout=DEADLINE
            )
            < 0
        )


def flaky(counter: str, task: int, failures: int) -> int:
    """Fails with a ps failure naming ``task`` on its first ``failures`` runs (counted in
    the file ``counter``), then returns how many runs came before."""
    path = Path(counter)
    runs = int(path.read_text()) if path.exists() else 0
    path.write_text(str(runs + 1))
    if runs < failures:
        raise ps_unavailable(task, "127.0.0.1:9", f"outage {runs + 1} of {failures}", None)
    return runs


def test_failures_below_the_threshold_are_retried_and_the_threshold_th_is_raised(
    tmp_path: Path,
) -> None:
    with LocalCluster(num_workers=1) as cluster, cluster.coordinator() as coordinator:
        below = coordinator.schedule(flaky, args=(str(tmp_path / "a"), 0, 2))
        assert below.fetch(timeout=DEADLINE) == 2
        metrics = coordinator.metrics()
        assert (metrics["ps_failures"], metrics["retried"], metrics["failed"]) == (2, 2, 0)

        at = coordinator.schedule(flaky, args=(str(tmp_path / "b"), 1, 5))
        with pytest.raises(errors.PSUnavailableError, match="outage 3 of 5") as info:
            coordinator.join(timeout=DEADLINE)
        assert info.value.task_id == 1
        assert (tmp_path / "b").read_text() == "3"  # two transient reports, then raised
        with pytest.raises(errors.PSUnavailableError):
            at.fetch()
        metrics = coordinator.metrics()
        assert (metrics["ps_failures"], metrics["worker_failures"]) == (5, 0)


def test_a_ps_outage_shorter_than_the_retries_is_transparent(
    cluster: LocalCluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Enough budget to outlast a ps restart however slow this machine is.
    monkeypatch.setenv("TF_COORDINATOR_IGNORE_TRANSIENT_PS_FAILURES", str(10**9))
    strategy, weights, steps = make_strategy(cluster)
    strategy.save(tmp_path / "ckpt")
    with ClusterCoordinator(strategy) as coordinator:
        cluster.kill_ps(1)
        value = coordinator.schedule(train_step, args=(weights, steps))
        wait_until(lambda: coordinator.metrics()["ps_failures"] >= 1, DEADLINE, "a ps failure")
        cluster.restart_ps(1)
        strategy.restore(tmp_path / "ckpt")
        assert value.fetch(timeout=DEADLINE) == 1
        assert coordinator.join(timeout=DEADLINE)
        metrics = coordinator.metrics()
        assert metrics["worker_failures"] == 0 and metrics["failed"] == 0
    assert int(steps.read_value()) == 1


def test_a_killed_worker_is_still_a_worker_failure(cluster: LocalCluster) -> None:
    strategy, weights, steps = make_strategy(cluster)
    with ClusterCoordinator(strategy) as coordinator:
        values = [coordinator.schedule(train_step, args=(weights, steps)) for _ in range(300)]
        wait_until(lambda: coordinator.metrics()["completed"] >= 10, DEADLINE, "10 steps ran")
        cluster.kill_worker(1)
        assert coordinator.join(timeout=DEADLINE)
        assert coordinator.fetch(values) == [1] * len(values)
        metrics = coordinator.metrics()
        assert metrics["worker_failures"] >= 1 and metrics["ps_failures"] == 0
    # At least once: every step landed on the ps, a retried one possibly twice.
    assert int(steps.read_value()) >= len(values)


def add_ones(total: ParameterServerVariable) -> Any:
    total.assign_add(np.ones(3, np.float32))
    return total.read_value()


def test_a_worker_with_only_a_token_file_reaches_the_ps(tmp_path: Path) -> None:
    with LocalCluster(num_workers=1, num_ps=1) as cluster:
        token_file = tmp_path / "token"
        token_file.write_text(f"  {cluster.auth_token}\n")
        with running_worker(["--auth-token-file", str(token_file)], token=None) as worker:
            spec = ClusterSpec({"worker": [worker.address], "ps": cluster.ps_addresses})
            strategy = ParameterServerStrategy(
                SimpleClusterResolver(spec), auth_token=cluster.auth_token
            )
            with strategy.scope():
                total = strategy.Variable(np.zeros(3, np.float32), name="total")
            with ClusterCoordinator(strategy) as coordinator:
                added = coordinator.schedule(add_ones, args=(total,))
                np.testing.assert_array_equal(added.fetch(timeout=DEADLINE), np.ones(3))
                assert coordinator.workers[0]["address"] == worker.address
        np.testing.assert_array_equal(total.read_value(), np.ones(3, np.float32))


def test_a_ps_failure_that_lost_its_pickle_is_still_raised_as_one() -> None:
    def reported(kind: str, type_name: str, module: str, message: str, **kw: Any) -> Any:
        return core.ClosureError(kind, type_name=type_name, module=module, message=message, **kw)

    result = reported(
        "user", "PSUnavailableError", "x.y", "ps gone", traceback="tb", worker="w:1", ps_task=1
    )
    error = build_exception(result)
    assert isinstance(error, errors.PSUnavailableError) and error.task_id == 1
    assert "parameter server task 1" in str(error) and "w:1" in str(error)
    wrapped = build_exception(reported("input", "KeyError", "builtins", "k", worker="w", ps_task=0))
    assert isinstance(wrapped, errors.ClosureInputError)
    assert isinstance(wrapped.original_exception, errors.PSUnavailableError)
    plain = build_exception(reported("user", "KeyError", "builtins", "k", worker="w"))
    assert isinstance(plain, errors.RemoteError)
