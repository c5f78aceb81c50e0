"""The abstract ClusterResolver: defaults, setters, format_master_url, the JAX bridge rules."""

from __future__ import annotations

import pytest

from jaxcluster.cluster_resolver import ClusterResolver, format_master_url
from jaxcluster.cluster_spec import ClusterSpec


class _Static(ClusterResolver):
    """A subclass that, like some user code, never calls super().__init__()."""

    def __init__(self, cluster):
        self.spec = ClusterSpec(cluster)
        self.calls = 0

    def cluster_spec(self):
        self.calls += 1
        return self.spec

    def master(self, task_type=None, task_id=None, rpc_layer=None):
        return ""


def test_abstract_methods_are_required():
    with pytest.raises(TypeError):
        ClusterResolver()  # type: ignore[abstract]

    class OnlySpec(ClusterResolver):
        def cluster_spec(self):
            return ClusterSpec({})

    with pytest.raises(TypeError, match="master"):
        OnlySpec()  # type: ignore[abstract]


def test_defaults_without_super_init_and_setters():
    resolver = _Static({"worker": ["a:1"]})
    assert (resolver.task_type, resolver.task_id, resolver.rpc_layer) == (None, None, None)
    assert resolver.environment == ""
    resolver.task_type, resolver.task_id, resolver.rpc_layer = "worker", 0, "grpc"
    assert (resolver.task_type, resolver.task_id, resolver.rpc_layer) == ("worker", 0, "grpc")
    resolver.environment = "google"
    assert resolver.environment == "google"
    # Setting on one instance leaves the class default alone.
    assert _Static({}).task_type is None
    assert _Static({}).environment == ""


def test_format_master_url():
    assert format_master_url("h:1", "grpc") == "grpc://h:1"
    assert format_master_url("h:1") == "h:1"
    assert format_master_url("h:1", "") == "h:1"


def test_num_accelerators_on_cpu_only_jax_is_empty():
    import jax

    resolver = _Static({"worker": ["a:1"]})
    counts = resolver.num_accelerators()
    non_cpu = [d for d in jax.local_devices() if d.platform != "cpu"]
    assert sum(counts.values()) == len(non_cpu)
    if not non_cpu:
        assert counts == {}
        assert counts["GPU"] == 0  # a defaultdict, as TF returns


def test_process_ids_put_chief_first_then_spec_order():
    resolver = _Static({"worker": ["w0:1", "w1:1"], "ps": ["p0:1"], "chief": ["c0:7"]})
    order = []
    for job, count in (("chief", 1), ("worker", 2), ("ps", 1)):
        for index in range(count):
            resolver.task_type, resolver.task_id = job, index
            args = resolver.jax_distributed_args()
            assert args["num_processes"] == 4
            assert args["coordinator_address"] == "c0:7"
            order.append(args["process_id"])
    assert order == [0, 1, 2, 3]


def test_sparse_job_numbers_existing_tasks_only():
    resolver = _Static({"worker": {1: "w1:5", 4: "w4:5"}})
    resolver.task_type, resolver.task_id = "worker", 4
    args = resolver.jax_distributed_args()
    assert args == {"coordinator_address": "w1:5", "num_processes": 2, "process_id": 1}


def test_cluster_spec_is_consulted_on_every_call():
    resolver = _Static({"worker": ["a:1"]})
    resolver.jax_distributed_args()
    resolver.jax_distributed_args()
    assert resolver.calls == 2


@pytest.mark.parametrize(
    ("address", "port", "expected"),
    [
        ("host:1", 9, "host:9"),
        ("host", 9, "host:9"),
        ("[::1]:1", 9, "[::1]:9"),
        ("::1", 9, "[::1]:9"),
        ("grpc://host:1", None, "host:1"),
        ("host:1", "9", "host:9"),
    ],
)
def test_coordinator_port_replaces_the_port(address, port, expected):
    resolver = _Static({"worker": [address]})
    assert resolver.jax_distributed_args(coordinator_port=port)["coordinator_address"] == expected


def test_env_coordinator_port_used_and_argument_wins(monkeypatch):
    resolver = _Static({"worker": ["host:1"]})
    monkeypatch.setenv("JAX_COORDINATOR_PORT", "4444")
    assert resolver.jax_distributed_args()["coordinator_address"] == "host:4444"
    assert resolver.jax_distributed_args(5555)["coordinator_address"] == "host:5555"
    monkeypatch.setenv("JAX_COORDINATOR_PORT", "http")
    with pytest.raises(ValueError, match="JAX_COORDINATOR_PORT is 'http'"):
        resolver.jax_distributed_args()


@pytest.mark.parametrize(
    ("cluster", "task", "fragment"),
    [
        ({}, ("worker", 0), "no tasks"),
        ({"a": []}, ("a", 0), "no tasks"),
        ({"worker": ["a:1", "b:1"]}, ("wrker", 0), "did you mean 'worker'"),
        ({"worker": ["a:1", "b:1"]}, ("worker", 2), "indices: 0, 1"),
        ({"worker": ["a:1", "b:1"]}, (None, None), "cannot tell which task"),
        ({"worker": ["a:1", "b:1"]}, ("worker", "x"), "'x' is not an integer"),
        ({"worker": ["a", "b:1"]}, ("worker", 1), "has no port"),
    ],
)
def test_bridge_errors_are_value_errors_that_say_why(cluster, task, fragment):
    resolver = _Static(cluster)
    resolver.task_type, resolver.task_id = task
    with pytest.raises(ValueError, match=fragment):
        resolver.jax_distributed_args()


def test_bad_coordinator_port_argument():
    resolver = _Static({"worker": ["a:1"]})
    for bad in (0, 70000, "x", True):
        with pytest.raises(ValueError, match="coordinator_port"):
            resolver.jax_distributed_args(coordinator_port=bad)


def test_single_task_cluster_needs_no_task():
    resolver = _Static({"worker": ["a:1"]})
    assert resolver.jax_distributed_args() == {
        "coordinator_address": "a:1",
        "num_processes": 1,
        "process_id": 0,
    }
