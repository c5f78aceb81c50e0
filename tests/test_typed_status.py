"""Typed values across the native boundary: status and metrics records (attributes,
``to_dict()`` in the old dict shape, ``record[key]``/``get``) and the enums that equal their
one spelling (rust/py/enums.rs, rust/py/status.rs, rust/py/metrics.rs)."""

from __future__ import annotations

import json
import pickle
from typing import Any

import pytest

from jaxcluster._native import core
from jaxcluster.coordinator import ClusterCoordinator

#: The keys ``WorkerClient.get_status()`` gave as a dict, in order.
REPORT_KEYS = [
    "state",
    "worker_index",
    "jaxcluster_version",
    "jax_version",
    "python_version",
    "platform",
    "device_count",
    "device_kind",
    "closure_bytes_received",
    "closure_bytes_sent",
    "functions_registered",
    "closures_run",
    "closures_failed",
    "queued",
    "inflight",
    "resources_created",
    "resources_released",
    "unauthenticated_requests",
    "rejected_requests",
    "pid",
    "uptime_seconds",
    "protocol_revision",
    "previous_exit",
    "connections_open",
    "connections_dropped",
    "incarnation",
    "last_error",
    "slice_index",
    "slice_rank",
    "slice_size",
    "preemption_source",
    "preemption_deadline",
    "preemption_detail",
    "sessions",
    "state_ttl_seconds",
    "peer_bytes_sent",
    "peer_bytes_received",
    "peer_reads_served",
    "peer_pulls",
]
#: What ``Dispatcher.worker_statuses()`` added to a worker's report, in order.
LINK_KEYS = [
    "index",
    "address",
    "state",
    "in_state_seconds",
    "last_error",
    "completed",
    "failed",
    "retried",
    "failures",
]
METRICS_KEYS = [
    "queued",
    "inflight",
    "completed",
    "failed",
    "cancelled",
    "retried",
    "worker_failures",
    "ps_failures",
    "functions_registered",
    "preemptions",
    "kept_values_fetched",
    "kept_bytes_fetched",
    "workers",
    "latency",
]
LATENCY_KEYS = ["bounds", "counts", "count", "sum", "max", "p50", "p99"]

ENUMS: list[tuple[Any, list[str]]] = [
    (core.WorkerState, ["up", "recovering", "given_up", "removed", "preempting"]),
    (core.ServingState, ["serving", "draining", "preempting", "unspecified"]),
    (core.FunctionKind, ["cloudpickle", "jax_export"]),
    (core.ErrorKind, ["user", "input", "function_load", "infrastructure", "cancelled"]),
    (core.ResourceState, ["pending", "ready", "failed", "aborted", "lost"]),
]


@pytest.mark.parametrize(("enum", "spellings"), ENUMS, ids=lambda e: getattr(e, "__name__", ""))
def test_enums_equal_and_hash_like_their_spelling(enum: Any, spellings: list[str]) -> None:
    assert [m.value for m in enum.members()] == spellings
    for member, spelling in zip(enum.members(), spellings, strict=True):
        assert member == spelling and spelling == member
        assert not member != spelling  # noqa: SIM202 - __ne__ is its own method
        assert hash(member) == hash(spelling)
        assert {spelling: 1}[member] == 1 and member in {spelling}
        assert str(member) == spelling and f"{member}" == spelling
        assert getattr(enum, member.name) == member
        assert enum(spelling) == member
        assert pickle.loads(pickle.dumps(member)) == member
        assert repr(member) == f"{enum.__name__}.{member.name}"
    first, second = enum.members()[:2]
    assert first != second and first != spellings[1]
    assert first != 0 and first != None  # noqa: E711 - compares with another type
    with pytest.raises(ValueError, match="is not a"):
        enum("no-such-spelling")


def test_closure_error_kinds_are_enums() -> None:
    error = core.ClosureError("input", type_name="KeyError", message="gone")
    assert error.kind is not None and error.kind == core.ErrorKind.INPUT == "input"
    assert core.ClosureError(core.ErrorKind.USER, type_name="E", message="m").kind == "user"
    with pytest.raises(ValueError, match="not known"):
        core.ClosureError("sideways", type_name="E", message="m")


def test_worker_report_is_typed_and_keeps_the_dict(cluster: Any) -> None:
    report = core.WorkerClient(cluster.addresses[0], auth_token=cluster.auth_token).get_status()
    assert isinstance(report, core.WorkerReport)
    assert report.state == core.ServingState.SERVING == "serving"
    assert report.worker_index == 0 and report.pid > 0 and report.platform
    plain = report.to_dict()
    assert list(plain) == REPORT_KEYS
    assert type(plain["state"]) is str and plain["state"] == "serving"
    for key in REPORT_KEYS:
        assert report[key] == plain[key] == getattr(report, key), key
    assert report.get("platform") == report.platform
    assert report.get("missing") is None and report.get("missing", 7) == 7
    with pytest.raises(KeyError, match="missing"):
        report["missing"]
    assert json.loads(json.dumps(plain)) == plain
    assert repr(report).startswith("WorkerReport(state=ServingState.SERVING, worker_index=0")


def test_coordinator_workers_are_typed_statuses(
    cluster: Any, coordinator: ClusterCoordinator
) -> None:
    coordinator.schedule(lambda: None).fetch()
    workers = coordinator.workers
    assert all(isinstance(w, core.WorkerStatus) for w in workers)
    assert [w.address for w in workers] == cluster.addresses
    assert coordinator.workers[0].state == "up"
    assert workers[1].state == core.WorkerState.UP and workers[1].index == 1
    report = workers[0].report
    assert report is not None and report.worker_index == 0
    assert workers[0].uptime_seconds is not None and workers[0].uptime_seconds >= 0
    plain = workers[0].to_dict()
    # The old shape: the worker's report (its state as serving_state), then the link's.
    assert set(plain) == {
        *REPORT_KEYS,
        *LINK_KEYS,
        "serving_state",
        "worker_last_error",
        "status_age_seconds",
    }
    assert plain["state"] == "up" and plain["serving_state"] == "serving"
    assert type(plain["state"]) is str
    assert plain["worker_last_error"] == report.last_error
    assert workers[0]["platform"] == report.platform == workers[0].get("platform")
    assert workers[0]["state"] == "up"
    assert json.loads(json.dumps(plain)) == plain


def test_dispatcher_metrics_are_typed_and_coordinator_metrics_stay_a_dict(
    coordinator: ClusterCoordinator,
) -> None:
    coordinator.schedule(lambda: None).fetch()
    metrics = coordinator._dispatcher.metrics()
    assert isinstance(metrics, core.Metrics)
    assert metrics.completed >= 1 and metrics.latency.count >= 1
    assert all(w.state == "up" for w in metrics.workers)
    assert isinstance(metrics.workers[0], core.WorkerMetrics)
    assert len(metrics.latency.counts) == len(metrics.latency.bounds) + 1
    plain = metrics.to_dict()
    assert list(plain) == METRICS_KEYS
    assert list(plain["latency"]) == LATENCY_KEYS
    assert list(plain["workers"][0]) == [
        "index",
        "address",
        "state",
        "in_state_seconds",
        "completed",
        "failed",
        "retried",
        "failures",
        "last_error",
    ]
    assert metrics["latency"] == plain["latency"] and metrics["workers"][0]["state"] == "up"
    served = coordinator.metrics()
    assert type(served) is dict and list(served) == METRICS_KEYS
    assert type(served["workers"][0]["state"]) is str
    assert json.loads(json.dumps(served)) == served


def test_a_pending_error_is_built_by_the_registered_builder(cluster: Any) -> None:
    def fails() -> None:
        raise KeyError("lost")

    with cluster.coordinator() as coordinator:
        coordinator.schedule(fails)
        with pytest.raises(KeyError, match="lost"):
            coordinator.join()
    with pytest.raises(TypeError, match="callable"):
        core.set_exception_builder(3)


def test_resource_states_are_enums(coordinator: ClusterCoordinator) -> None:
    resource = coordinator._host.create_resource(lambda: 1)
    coordinator.schedule(lambda: None).fetch()
    state = resource.state(0)
    assert isinstance(state, core.ResourceState)
    assert state in ("pending", "ready")
    resource.release()
    with pytest.raises(IndexError):
        resource.state(5)
