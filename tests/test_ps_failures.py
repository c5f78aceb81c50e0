"""PS failures: a SIGKILLed or restarted ps task surfaces as PSUnavailableError naming the
task (on the coordinator and from closures on real workers), within a deadline; the
transient-failure rule TF's coordinator applies; kill_ps/restart_ps."""

from __future__ import annotations

import pickle
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any

import cloudpickle
import numpy as np
import pytest

from jaxcluster import errors, wire
from jaxcluster._native import core
from jaxcluster.coordinator import functions
from jaxcluster.coordinator._errors import rebuild_exception
from jaxcluster.local_cluster import LocalCluster
from jaxcluster.strategy import ParameterServerStrategy, TransientPSFailures, is_ps_failure
from jaxcluster.strategy.failures import failed_ps_task, ps_unavailable

cloudpickle.register_pickle_by_value(sys.modules[__name__])

DEADLINE = 30.0


@pytest.fixture
def cluster() -> Iterator[LocalCluster]:
    with LocalCluster(num_workers=1, num_ps=2) as c:
        yield c


def run_on_worker(cluster: LocalCluster, fn: Callable[..., Any]) -> Any:
    client = core.WorkerClient(cluster.addresses[0], auth_token=cluster.auth_token)
    payload = functions.pickle_function(fn)
    client.register_function(payload.function_hash, payload.kind, payload.payload)
    reply = client.run_closure(payload.function_hash, timeout=120)
    if reply["error"] is not None:
        raise rebuild_exception(reply["error"])
    return wire.decode(reply["value"], reply["buffers"])


def test_a_killed_ps_is_reported_by_task_on_the_coordinator_and_in_closures(
    cluster: LocalCluster,
) -> None:
    strategy = ParameterServerStrategy(cluster.resolver, auth_token=cluster.auth_token)
    with strategy.scope():
        on_ps0 = strategy.Variable(np.zeros(3, np.float32), name="a")
        on_ps1 = strategy.Variable(np.zeros(3, np.float32), name="b")

    def train_step() -> Any:
        on_ps0.assign_add(np.ones(3, np.float32))
        on_ps1.assign_add(np.ones(3, np.float32))
        return on_ps1.read_value()

    np.testing.assert_array_equal(run_on_worker(cluster, train_step), np.ones(3))
    address = cluster.ps_addresses[1]
    cluster.kill_ps(1)
    assert cluster.ps_pid(1) is None

    start = time.monotonic()
    with pytest.raises(errors.PSUnavailableError) as info:
        run_on_worker(cluster, train_step)
    assert time.monotonic() - start < DEADLINE
    error = info.value
    assert isinstance(error, errors.UnavailableError)
    assert (error.task_type, error.task_id, error.address) == ("ps", 1, address)
    assert isinstance(error.original_exception, errors.UnavailableError)
    assert f"parameter server task 1 ({address})" in str(error)

    start = time.monotonic()
    with pytest.raises(errors.PSUnavailableError) as info:
        on_ps1.read_value()
    assert time.monotonic() - start < DEADLINE and info.value.task_id == 1
    # The other ps task is unaffected (the worker's update to it landed twice).
    np.testing.assert_array_equal(on_ps0.read_value(), np.full(3, 2.0))


def test_a_restarted_ps_is_empty_and_reported_until_restored(
    cluster: LocalCluster, tmp_path: Any
) -> None:
    strategy = ParameterServerStrategy(cluster.resolver, auth_token=cluster.auth_token)
    with strategy.scope():
        strategy.Variable(1.0, name="x")
        y = strategy.Variable(2.0, name="y")
    strategy.save(tmp_path / "ckpt")
    old_pid = cluster.ps_pid(1)
    cluster.restart_ps(1)
    assert cluster.ps_pid(1) not in (None, old_pid)
    status = core.PsClient(cluster.ps_addresses[1], auth_token=cluster.auth_token).get_status()
    assert status["ps_index"] == 1 and status["variables"] == 0

    def read_y() -> Any:
        return y.read_value()

    with pytest.raises(errors.PSUnavailableError, match="lost its variables") as info:
        run_on_worker(cluster, read_y)
    assert info.value.task_id == 1 and isinstance(info.value.original_exception, LookupError)
    strategy.restore(tmp_path / "ckpt")
    assert run_on_worker(cluster, read_y) == np.float32(2.0)


def test_kill_and_restart_of_ps_tasks_validate_the_index(cluster: LocalCluster) -> None:
    with pytest.raises(ValueError, match=r"ps index 2 is out of range.*0\.\.1"):
        cluster.kill_ps(2)
    with pytest.raises(ValueError, match="num_ps=-1"):
        LocalCluster(num_workers=1, num_ps=-1)
    spec = cluster.resolver.cluster_spec()
    assert spec.job_tasks("ps") == cluster.ps_addresses
    assert spec.job_tasks("worker") == cluster.addresses


def ps_error(task: int) -> errors.PSUnavailableError:
    return ps_unavailable(task, f"10.0.0.{task}:2222", "connection refused", None)


def test_transient_failures_follow_tfs_threshold(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TF_COORDINATOR_IGNORE_TRANSIENT_PS_FAILURES", raising=False)
    tracker = TransientPSFailures(num_ps=2)
    assert tracker.threshold == 3
    # Reports about ps 0 below the threshold are transient (retry); the 3rd is reported.
    assert [tracker.record_and_ignore(ps_error(0)) for _ in range(3)] == [True, True, False]
    # Counted per task: ps 1 has its own budget.
    assert tracker.record_and_ignore(ps_error(1)) is True
    assert tracker.counts == [3, 1]
    # Wrapped errors count; errors that are not ps failures never do.
    assert tracker.record_and_ignore(errors.ClosureInputError(ps_error(1))) is True
    assert tracker.record_and_ignore(errors.UnavailableError("worker down")) is False
    assert tracker.record_and_ignore(ValueError("user bug")) is False
    assert tracker.counts == [3, 2]

    monkeypatch.setenv("TF_COORDINATOR_IGNORE_TRANSIENT_PS_FAILURES", "1")
    assert TransientPSFailures(num_ps=1).record_and_ignore(ps_error(0)) is False
    monkeypatch.setenv("TF_COORDINATOR_IGNORE_TRANSIENT_PS_FAILURES", "0")
    assert TransientPSFailures(num_ps=1).record_and_ignore(ps_error(0)) is False
    monkeypatch.setenv("TF_COORDINATOR_IGNORE_TRANSIENT_PS_FAILURES", "many")
    with pytest.raises(ValueError, match="TF_COORDINATOR_IGNORE_TRANSIENT_PS_FAILURES='many'"):
        TransientPSFailures(num_ps=1)


def test_ps_failures_keep_their_fields_through_pickling() -> None:
    original = errors.UnavailableError("connect error")
    error = ps_unavailable(1, "ps-1:2222", "connect error", original)
    copy = pickle.loads(pickle.dumps(error))
    assert type(copy) is errors.PSUnavailableError
    assert (copy.task_type, copy.task_id, copy.address) == ("ps", 1, "ps-1:2222")
    assert str(copy) == str(error)
    assert isinstance(copy.original_exception, errors.UnavailableError)
    assert is_ps_failure(errors.ClosureAbortedError(copy)) and failed_ps_task(copy) == 1
    assert not is_ps_failure(original) and failed_ps_task(original) is None
