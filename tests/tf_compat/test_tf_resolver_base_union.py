"""TF 2.21 ``distribute/cluster_resolver/cluster_resolver_test.py``: the base class's
``num_accelerators``, ``SimpleClusterResolver`` and ``UnionClusterResolver``, asserted against
jaxcluster. TF's device-listing mocks become fake JAX devices, or a replaced
``jaxcluster.devices.list_logical_devices`` (TF's ``tf.config.list_logical_devices``)."""

from __future__ import annotations

import json
from dataclasses import dataclass

import jax
import pytest

from jaxcluster import ClusterSpec, devices
from jaxcluster.cluster_resolver import (
    ClusterResolver,
    SimpleClusterResolver,
    TFConfigClusterResolver,
    UnionClusterResolver,
)
from support.cluster_defs import assert_cluster_def

PS_WORKER = {
    "ps": ["ps0:2222", "ps1:2222"],
    "worker": ["worker0:2222", "worker1:2222", "worker2:2222"],
}
PS_WORKER_DEF = {
    "ps": {0: "ps0:2222", 1: "ps1:2222"},
    "worker": {0: "worker0:2222", 1: "worker1:2222", 2: "worker2:2222"},
}


@dataclass(frozen=True)
class FakeDevice:
    """What jaxcluster reads from a ``jax.Device``."""

    platform: str
    id: int
    process_index: int = 0


class SpecOnly(ClusterResolver):
    """A subclass implementing only the two abstract methods, as TF's test does."""

    def __init__(self, spec: dict | None = None, task: tuple[str, int] | None = None) -> None:
        self._spec = ClusterSpec(spec or {})
        if task is not None:
            self.task_type, self.task_id = task

    def cluster_spec(self) -> ClusterSpec:
        return self._spec

    def master(self, task_type=None, task_id=None, rpc_layer=None) -> str:
        return ""


def _fake_jax(monkeypatch: pytest.MonkeyPatch, devices: list[FakeDevice], processes: int) -> None:
    monkeypatch.setattr(jax, "devices", lambda *a: list(devices))
    monkeypatch.setattr(
        jax, "local_devices", lambda *a, **k: [d for d in devices if d.process_index == 0]
    )
    monkeypatch.setattr(jax, "process_count", lambda: processes)


def test_num_accelerators_counts_by_type(monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_jax(monkeypatch, [FakeDevice("gpu", i) for i in range(4)], 1)
    assert SpecOnly().num_accelerators() == {"GPU": 4}


def test_num_accelerators_counts_several_types(monkeypatch: pytest.MonkeyPatch) -> None:
    devices = [FakeDevice("tpu", i) for i in range(4)] + [FakeDevice("gpu", i) for i in range(4)]
    devices.append(FakeDevice("cpu", 0))  # CPUs are not accelerators
    _fake_jax(monkeypatch, devices, 1)
    assert SpecOnly().num_accelerators() == {"TPU": 4, "GPU": 4}


def test_num_accelerators_filters_by_task(monkeypatch: pytest.MonkeyPatch) -> None:
    # Processes in cluster-spec order: worker1/0 is process 0, worker2/0..4 are processes 1..5.
    spec = {"worker1": ["a:1"], "worker2": ["b:1", "c:1", "d:1", "e:1", "f:1"]}
    devices = [
        FakeDevice("tpu", 0, 0),
        FakeDevice("tpu", 1, 0),
        FakeDevice("gpu", 0, 0),
        FakeDevice("gpu", 1, 0),
        FakeDevice("tpu", 2, 2),  # worker2 task 1
        FakeDevice("tpu", 3, 3),  # worker2 task 2
        FakeDevice("gpu", 2, 4),  # worker2 task 3
        FakeDevice("gpu", 3, 5),  # worker2 task 4
    ]
    _fake_jax(monkeypatch, devices, 6)
    resolver = SpecOnly(spec)
    assert resolver.num_accelerators(task_type="worker1", task_id=0) == {"TPU": 2, "GPU": 2}
    assert resolver.num_accelerators(task_type="worker2", task_id=3) == {"GPU": 1}
    assert resolver.num_accelerators(task_type="worker2", task_id=4) == {"GPU": 1}
    assert resolver.num_accelerators(task_type="worker2", task_id=0) == {}
    # Beyond TF (which would count nothing): a task the cluster does not have is an error.
    with pytest.raises(ValueError, match="not in the cluster spec"):
        resolver.num_accelerators(task_type="worker3", task_id=0)


def test_num_accelerators_for_a_task_before_jax_distributed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """One process: its devices are its own task's; another task's are not visible (TF too)."""
    _fake_jax(monkeypatch, [FakeDevice("gpu", i) for i in range(2)], 1)
    resolver = SpecOnly({"worker": ["a:1", "b:1"]}, task=("worker", 1))
    assert resolver.num_accelerators("worker", 1) == {"GPU": 2}
    assert resolver.num_accelerators("worker", 0) == {}


# TF's test of the count replaces tf.config.list_logical_devices with a list of named
# devices; jaxcluster's twin is jaxcluster.devices.list_logical_devices, which resolvers count.
TF_DEVICE_LIST = [
    ("/job:worker1/task:0/device:TPU:0", "TPU"),
    ("/job:worker1/task:0/device:TPU:1", "TPU"),
    ("/job:worker1/task:0/device:GPU:0", "GPU"),
    ("/job:worker1/task:0/device:GPU:1", "GPU"),
    ("/job:worker2/task:1/device:TPU:2", "TPU"),
    ("/job:worker2/task:2/device:TPU:3", "TPU"),
    ("/job:worker2/task:3/device:GPU:2", "GPU"),
    ("/job:worker2/task:4/device:GPU:3", "GPU"),
]


def _listed(monkeypatch: pytest.MonkeyPatch, pairs: list[tuple[str, str]]) -> None:
    listed = [devices.LogicalDevice(name, kind) for name, kind in pairs]
    monkeypatch.setattr(devices, "list_logical_devices", lambda device_type=None: listed)


def test_list_logical_devices_names_this_process_localhost(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _fake_jax(monkeypatch, [FakeDevice("gpu", 0), FakeDevice("gpu", 1), FakeDevice("cpu", 0)], 1)
    assert devices.list_logical_devices() == [
        ("/job:localhost/replica:0/task:0/device:GPU:0", "GPU"),
        ("/job:localhost/replica:0/task:0/device:GPU:1", "GPU"),
        ("/job:localhost/replica:0/task:0/device:CPU:0", "CPU"),
    ]
    assert [d.name for d in devices.list_logical_devices("CPU")] == [
        "/job:localhost/replica:0/task:0/device:CPU:0"
    ]


def test_num_accelerators_counts_the_listed_devices_as_tf(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _listed(monkeypatch, [(f"/job:worker/task:0/device:GPU:{i}", "GPU") for i in range(4)])
    assert SpecOnly().num_accelerators() == {"GPU": 4}
    _listed(monkeypatch, TF_DEVICE_LIST)
    resolver = SpecOnly()
    assert resolver.num_accelerators() == {"TPU": 4, "GPU": 4}
    assert resolver.num_accelerators(task_type="worker1", task_id=0) == {"TPU": 2, "GPU": 2}
    assert resolver.num_accelerators(task_type="worker2", task_id=3) == {"GPU": 1}
    assert resolver.num_accelerators(task_type="worker2", task_id=4) == {"GPU": 1}
    assert resolver.num_accelerators(task_type="worker2", task_id=0) == {}


def test_num_accelerators_of_a_tf_config_task_from_the_listed_devices(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    cluster = {"worker1": ["w10:2222"], "worker2": ["w21:2222", "w22:2222"]}
    tf_config = {"cluster": cluster, "task": {"type": "worker1", "index": "0"}}
    monkeypatch.setenv("TF_CONFIG", json.dumps(tf_config))
    _listed(monkeypatch, TF_DEVICE_LIST)
    resolver = TFConfigClusterResolver()
    assert resolver.num_accelerators() == {"TPU": 2, "GPU": 2}  # TF_CONFIG's task by default
    assert resolver.num_accelerators(task_type="worker2", task_id=3) == {"GPU": 1}


def test_simple_resolver_keeps_what_it_was_given() -> None:
    resolver = SimpleClusterResolver(
        ClusterSpec(PS_WORKER),
        task_type="ps",
        task_id=1,
        environment="cloud",
        num_accelerators={"GPU": 8},
        rpc_layer="grpc",
    )
    assert (resolver.task_type, resolver.task_id, resolver.environment) == ("ps", 1, "cloud")
    assert resolver.num_accelerators() == {"GPU": 8}
    assert resolver.rpc_layer == "grpc"

    resolver.task_type, resolver.task_id, resolver.rpc_layer = "worker", 2, "http"
    assert (resolver.task_type, resolver.task_id, resolver.rpc_layer) == ("worker", 2, "http")


def test_simple_resolver_master() -> None:
    resolver = SimpleClusterResolver(ClusterSpec(PS_WORKER))
    assert resolver.master("worker", 0, rpc_layer="grpc") == "grpc://worker0:2222"
    assert resolver.master("worker", 2, rpc_layer="grpc") == "grpc://worker2:2222"
    assert resolver.master("worker", 2) == "worker2:2222"


def test_union_of_one() -> None:
    union = UnionClusterResolver(SimpleClusterResolver(ClusterSpec(PS_WORKER)))
    assert_cluster_def(union.cluster_spec(), PS_WORKER_DEF)


def test_union_takes_its_properties_from_the_first_resolver() -> None:
    first = SimpleClusterResolver(
        ClusterSpec(PS_WORKER),
        task_type="ps",
        task_id=1,
        environment="cloud",
        num_accelerators={"GPU": 8},
        rpc_layer="grpc",
    )
    second = SimpleClusterResolver(
        ClusterSpec({"ps": ["ps2:2222", "ps3:2222"], "worker": ["w3:2222", "w4:2222"]}),
        task_type="worker",
        task_id=2,
        environment="local",
        num_accelerators={"GPU": 16},
        rpc_layer="http",
    )
    union = UnionClusterResolver(first, second)
    assert (union.task_type, union.task_id, union.environment, union.rpc_layer) == (
        "ps",
        1,
        "cloud",
        "grpc",
    )
    assert union.num_accelerators() == {"GPU": 8}
    union.task_type, union.task_id, union.rpc_layer = "worker", 2, "http"
    assert (union.task_type, union.task_id, union.rpc_layer) == ("worker", 2, "http")


def _union(*specs: dict) -> UnionClusterResolver:
    return UnionClusterResolver(*(SimpleClusterResolver(ClusterSpec(s)) for s in specs))


def test_union_of_disjoint_jobs() -> None:
    union = _union({"ps": ["ps0:2222", "ps1:2222"]}, {"worker": PS_WORKER["worker"]})
    assert_cluster_def(union.cluster_spec(), PS_WORKER_DEF)


def test_union_master() -> None:
    union = _union({"ps": ["ps0:2222", "ps1:2222"]}, {"worker": PS_WORKER["worker"]})
    assert union.master() == ""
    assert union.master("worker", 1) == "worker1:2222"
    assert union.master("worker", 1, rpc_layer="grpc") == "grpc://worker1:2222"


def test_union_appends_a_job_listed_twice() -> None:
    union = _union({"worker": ["worker4:2222", "worker5:2222"]}, {"worker": PS_WORKER["worker"]})
    expected = ["worker4:2222", "worker5:2222", "worker0:2222", "worker1:2222", "worker2:2222"]
    assert_cluster_def(union.cluster_spec(), {"worker": dict(enumerate(expected))})


def test_union_of_sparse_jobs_with_a_common_index_is_a_key_error() -> None:
    union = _union(
        {"worker": {7: "worker4:2222", 9: "worker5:2222"}},
        {"worker": {3: "worker0:2222", 6: "worker1:2222", 7: "worker2:2222"}},
    )
    with pytest.raises(KeyError):
        union.cluster_spec()


def test_union_of_a_list_and_a_dict_with_a_common_index_is_a_key_error() -> None:
    union = _union(
        {"worker": ["worker4:2222", "worker5:2222"]},
        {"worker": {1: "worker0:2222", 2: "worker1:2222", 3: "worker2:2222"}},
    )
    with pytest.raises(KeyError):
        union.cluster_spec()


def test_union_merges_sparse_jobs() -> None:
    union = _union(
        {"worker": {5: "worker4:2222", 9: "worker5:2222"}},
        {"worker": {3: "worker0:2222", 6: "worker1:2222", 7: "worker2:2222"}},
    )
    expected = {
        3: "worker0:2222",
        5: "worker4:2222",
        6: "worker1:2222",
        7: "worker2:2222",
        9: "worker5:2222",
    }
    assert_cluster_def(union.cluster_spec(), {"worker": expected})


def test_union_merges_a_list_into_a_sparse_job() -> None:
    union = _union(
        {"worker": ["worker4:2222", "worker5:2222"]},
        {"worker": {3: "worker0:2222", 6: "worker1:2222", 7: "worker2:2222"}},
    )
    expected = {
        0: "worker4:2222",
        1: "worker5:2222",
        3: "worker0:2222",
        6: "worker1:2222",
        7: "worker2:2222",
    }
    assert_cluster_def(union.cluster_spec(), {"worker": expected})


def test_union_keeps_a_sparse_job_sparse() -> None:
    union = _union({"worker": {1: "worker0:2222", 3: "worker1:2222", 5: "worker2:2222"}})
    assert_cluster_def(
        union.cluster_spec(), {"worker": {1: "worker0:2222", 3: "worker1:2222", 5: "worker2:2222"}}
    )
