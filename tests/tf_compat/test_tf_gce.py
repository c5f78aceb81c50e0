"""TF 2.21 ``distribute/cluster_resolver/gce_cluster_resolver_test.py``: every behaviour it
asserts, asserted against jaxcluster's ``GCEClusterResolver``. TF mocks the discovery client;
here a local server speaks the Compute Engine API's JSON (TF's instances are RUNNING)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from google.auth.credentials import AnonymousCredentials

from jaxcluster.cluster_resolver import GCEClusterResolver, UnionClusterResolver
from support.cluster_defs import assert_cluster_def
from support.compute_api import FakeComputeServer

PROJECT, ZONE, GROUP = "test-project", "us-east1-d", "test-instance-group"
THREE = [("instance1", "10.1.2.3"), ("instance2", "10.2.3.4"), ("instance3", "10.3.4.5")]


@pytest.fixture
def api() -> Iterator[FakeComputeServer]:
    with FakeComputeServer() as server:
        yield server


def _group(api: FakeComputeServer, instances: list[tuple[str, str]], group: str = GROUP) -> None:
    for name, ip in instances:
        api.add_instance(PROJECT, ZONE, group, name, ip)


def _resolver(api: FakeComputeServer, group: str = GROUP, **kw: Any) -> GCEClusterResolver:
    kw.setdefault("port", 8470)
    return GCEClusterResolver(
        project=PROJECT,
        zone=ZONE,
        instance_group=group,
        credentials=AnonymousCredentials(),
        api_endpoint=api.url,
        **kw,
    )


def test_one_instance(api: FakeComputeServer) -> None:
    _group(api, [("gce-instance-1", "10.123.45.67")])
    assert_cluster_def(_resolver(api).cluster_spec(), {"worker": {0: "10.123.45.67:8470"}})


def test_master(api: FakeComputeServer) -> None:
    _group(api, [("gce-instance-1", "10.123.45.67")])
    assert _resolver(api, task_id=0).master() == "grpc://10.123.45.67:8470"


def test_master_of_a_given_task(api: FakeComputeServer) -> None:
    _group(api, THREE)
    assert _resolver(api).master("worker", 2, "test") == "test://10.3.4.5:8470"


def test_task_id_and_rpc_layer_can_be_set(api: FakeComputeServer) -> None:
    _group(api, THREE)
    resolver = _resolver(api, task_type="testworker")
    resolver.task_id = 1
    resolver.rpc_layer = "test"
    assert (resolver.task_type, resolver.task_id, resolver.rpc_layer) == ("testworker", 1, "test")
    assert resolver.master() == "test://10.2.3.4:8470"


def test_empty_task_type_and_zero_task_id_are_values(api: FakeComputeServer) -> None:
    _group(api, THREE)
    resolver = _resolver(api, task_type="", task_id=1)
    assert resolver.master(task_type="", task_id=0) == "grpc://10.1.2.3:8470"


def test_task_type_names_the_job(api: FakeComputeServer) -> None:
    _group(api, [("gce-instance-1", "10.123.45.67")])
    spec = _resolver(api, task_type="custom", port=2222).cluster_spec()
    assert_cluster_def(spec, {"custom": {0: "10.123.45.67:2222"}})


def test_several_instances(api: FakeComputeServer) -> None:
    _group(api, THREE)
    assert_cluster_def(
        _resolver(api).cluster_spec(),
        {"worker": {0: "10.1.2.3:8470", 1: "10.2.3.4:8470", 2: "10.3.4.5:8470"}},
    )


def test_union_of_groups(api: FakeComputeServer) -> None:
    _group(api, THREE, "workers-a")
    _group(
        api,
        [("instance4", "10.4.5.6"), ("instance5", "10.5.6.7"), ("instance6", "10.6.7.8")],
        "workers-b",
    )
    _group(api, [("ps1", "10.100.1.2"), ("ps2", "10.100.2.3")], "ps")
    union = UnionClusterResolver(
        _resolver(api, "workers-a", task_type="worker"),
        _resolver(api, "workers-b", task_type="worker"),
        _resolver(api, "ps", task_type="ps", port=2222),
    )
    workers = ["10.1.2.3", "10.2.3.4", "10.3.4.5", "10.4.5.6", "10.5.6.7", "10.6.7.8"]
    assert_cluster_def(
        union.cluster_spec(),
        {
            "ps": {0: "10.100.1.2:2222", 1: "10.100.2.3:2222"},
            "worker": {i: f"{ip}:8470" for i, ip in enumerate(workers)},
        },
    )


def test_task_type_cannot_be_changed(api: FakeComputeServer) -> None:
    _group(api, THREE)
    resolver = _resolver(api, task_type="testworker")
    # TF's test matches TF's sentence; programs that match it keep working.
    tf_words = "You cannot reset the task_type of the GCEClusterResolver after it has been created."
    with pytest.raises(RuntimeError, match=tf_words) as info:
        resolver.task_type = "foobar"
    assert "'testworker'" in str(info.value) and "'foobar'" in str(info.value)
    assert resolver.task_type == "testworker"
