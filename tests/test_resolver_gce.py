"""GCEClusterResolver against a local fake of the Compute Engine API."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from google.auth.credentials import AnonymousCredentials
from google.oauth2.credentials import Credentials

from jaxcluster.cluster_resolver import GCEClusterResolver
from jaxcluster.cluster_resolver._google import GoogleAPIError
from jaxcluster.cluster_spec import ClusterSpec
from support.compute_api import FakeComputeServer
from support.discovery import ComputeClient

PROJECT, ZONE, GROUP = "proj", "us-east1-b", "trainers"
LIST_PATH = f"/compute/v1/projects/{PROJECT}/zones/{ZONE}/instanceGroups/{GROUP}/listInstances"


@pytest.fixture
def api() -> Iterator[FakeComputeServer]:
    with FakeComputeServer() as server:
        yield server


def _resolver(api: FakeComputeServer, **kw: Any) -> GCEClusterResolver:
    kw.setdefault("credentials", AnonymousCredentials())
    port = kw.pop("port", 8470)
    return GCEClusterResolver(PROJECT, ZONE, GROUP, port, api_endpoint=api.url, **kw)


def _fill(api: FakeComputeServer, ips: list[str], group: str = GROUP) -> None:
    for i, ip in enumerate(ips):
        api.add_instance(PROJECT, ZONE, group, f"vm-{i}", ip)


def test_addresses_are_string_sorted_ip_port(api: FakeComputeServer) -> None:
    _fill(api, ["10.0.0.9", "10.0.0.10", "10.0.0.2"])
    spec = _resolver(api, port=2222).cluster_spec()
    # String order, as TF: '10.0.0.10' sorts before '10.0.0.2'.
    assert spec == ClusterSpec({"worker": ["10.0.0.10:2222", "10.0.0.2:2222", "10.0.0.9:2222"]})


def test_every_page_is_read(api: FakeComputeServer) -> None:
    api.page_size = 2
    ips = [f"10.1.0.{i}" for i in range(1, 6)]
    _fill(api, ips)
    spec = _resolver(api).cluster_spec()
    assert spec.job_tasks("worker") == sorted(f"{ip}:8470" for ip in ips)
    lists = [r for r in api.requests if r.path == LIST_PATH]
    assert len(lists) == 3
    assert "pageToken" not in lists[0].query
    tokens = [r.query["pageToken"] for r in lists[1:]]
    assert all(tokens) and tokens[0] != tokens[1]


def test_only_running_instances(api: FakeComputeServer) -> None:
    api.add_instance(PROJECT, ZONE, GROUP, "up", "10.0.0.1")
    api.add_instance(PROJECT, ZONE, GROUP, "down", "10.0.0.2", status="TERMINATED")
    api.add_instance(PROJECT, ZONE, GROUP, "going", "10.0.0.3", status="STOPPING")
    assert _resolver(api).cluster_spec().job_tasks("worker") == ["10.0.0.1:8470"]
    lists = [r for r in api.requests if r.path == LIST_PATH]
    assert lists[0].json() == {"instanceState": "RUNNING"}
    # Only the running instance was looked up.
    assert [r.path.rsplit("/", 1)[-1] for r in api.requests if r.method == "GET"] == ["up"]


def test_master_and_overrides(api: FakeComputeServer) -> None:
    _fill(api, ["10.0.0.1", "10.0.0.2", "10.0.0.3"])
    resolver = _resolver(api, task_type="ps", task_id=1)
    assert resolver.cluster_spec().jobs == ["ps"]
    assert resolver.master() == "grpc://10.0.0.2:8470"
    assert resolver.master(task_id=2, rpc_layer="http") == "http://10.0.0.3:8470"
    resolver.task_id = 0
    resolver.rpc_layer = None
    assert resolver.master() == "10.0.0.1:8470"
    with pytest.raises(RuntimeError, match="cannot be changed"):
        resolver.task_type = "worker"
    assert resolver.cluster_spec().jobs == ["ps"]
    assert (resolver.task_type, resolver.task_id, resolver.rpc_layer) == ("ps", 0, None)


def test_no_task_type_has_no_master_unless_one_is_named(api: FakeComputeServer) -> None:
    # TF: without a task_type the resolver names no task of its own, so master() is ''.
    _fill(api, ["10.0.0.1", "10.0.0.2"])
    resolver = _resolver(api, task_type=None, task_id=1)
    assert resolver.task_type is None
    assert resolver.master() == ""
    assert resolver.cluster_spec().jobs == ["worker"]
    assert resolver.master(task_type="worker") == "grpc://10.0.0.2:8470"
    assert resolver.master(task_type="worker", task_id=0) == "grpc://10.0.0.1:8470"


def test_versioned_endpoint_is_accepted(api: FakeComputeServer) -> None:
    _fill(api, ["10.0.0.1"])
    resolver = GCEClusterResolver(
        PROJECT,
        ZONE,
        GROUP,
        8470,
        credentials=AnonymousCredentials(),
        api_endpoint=f"{api.url}/compute/v1/",
    )
    assert resolver.master() == "grpc://10.0.0.1:8470"
    assert api.paths()[0] == LIST_PATH


def test_every_call_resolves_again(api: FakeComputeServer) -> None:
    _fill(api, ["10.0.0.1"])
    resolver = _resolver(api)
    assert resolver.cluster_spec().num_tasks("worker") == 1
    api.add_instance(PROJECT, ZONE, GROUP, "late", "10.0.0.0")
    assert resolver.master() == "grpc://10.0.0.0:8470"


def test_empty_group(api: FakeComputeServer) -> None:
    api.add_group(PROJECT, ZONE, GROUP)
    api.add_instance(PROJECT, ZONE, GROUP, "stopped", "10.0.0.1", status="TERMINATED")
    resolver = _resolver(api)
    spec = resolver.cluster_spec()
    assert spec.jobs == ["worker"] and spec.job_tasks("worker") == []
    with pytest.raises(ValueError, match=f"'{GROUP}'.*no RUNNING instances"):
        resolver.master()


def test_task_id_out_of_range(api: FakeComputeServer) -> None:
    _fill(api, ["10.0.0.1", "10.0.0.2"])
    with pytest.raises(ValueError, match=r"task_id 5 is out of range.*0\.\.1"):
        _resolver(api, task_id=5).master()
    with pytest.raises(ValueError, match="'chief' is not a job"):
        _resolver(api).master(task_type="chief")


def test_unknown_group_is_a_404_naming_it(api: FakeComputeServer) -> None:
    with pytest.raises(GoogleAPIError, match=f"instance group '{GROUP}'") as info:
        _resolver(api).cluster_spec()
    assert info.value.status == 404


def test_403_names_the_missing_permission(api: FakeComputeServer) -> None:
    api.forbidden.add((PROJECT, ZONE, GROUP))
    with pytest.raises(GoogleAPIError, match=r"'compute\.instanceGroups\.list'") as info:
        _resolver(api).cluster_spec()
    assert info.value.status == 403 and isinstance(info.value, RuntimeError)


def test_403_on_instance_lookup_names_its_permission(api: FakeComputeServer) -> None:
    _fill(api, ["10.0.0.1"])
    api.fail_next(403, path_contains="/instances/")
    with pytest.raises(GoogleAPIError, match=r"'compute\.instances\.get'"):
        _resolver(api).cluster_spec()


def test_500_is_retried(api: FakeComputeServer) -> None:
    _fill(api, ["10.0.0.1", "10.0.0.2"])
    api.fail_next(500, path_contains="listInstances")
    api.fail_next(503, path_contains="/instances/vm-1")
    spec = _resolver(api).cluster_spec()
    assert spec.job_tasks("worker") == ["10.0.0.1:8470", "10.0.0.2:8470"]
    assert [r.path for r in api.requests].count(LIST_PATH) == 2


def test_credentials_are_sent_on_every_call(api: FakeComputeServer) -> None:
    _fill(api, ["10.0.0.1", "10.0.0.2"])
    _resolver(api, credentials=Credentials(token="gce-token")).cluster_spec()
    assert len(api.requests) == 3
    assert {r.authorization for r in api.requests} == {"Bearer gce-token"}
    api.requests.clear()
    _resolver(api).cluster_spec()
    assert {r.authorization for r in api.requests} == {None}


def test_instance_without_network_interface(api: FakeComputeServer) -> None:
    api.add_instance(PROJECT, ZONE, GROUP, "no-nic", None)
    with pytest.raises(RuntimeError, match=r"'no-nic'.*networkIP"):
        _resolver(api).cluster_spec()


@pytest.mark.parametrize("port", [0, 70000, "http", True])
def test_bad_port(port: object) -> None:
    with pytest.raises(ValueError, match="port"):
        GCEClusterResolver(PROJECT, ZONE, GROUP, port, credentials=AnonymousCredentials())  # type: ignore[arg-type]


def test_bad_group_name() -> None:
    with pytest.raises(ValueError, match="instance_group"):
        GCEClusterResolver(PROJECT, ZONE, "a/b", 8470, credentials=AnonymousCredentials())


def test_discovery_service_is_rejected() -> None:
    with pytest.raises(TypeError, match=r"requests\.Session"):
        GCEClusterResolver(PROJECT, ZONE, GROUP, 8470, service=object())


def test_construction_needs_no_credentials_or_network(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", "/nonexistent/adc.json")
    resolver = GCEClusterResolver(PROJECT, ZONE, GROUP, 8470)
    assert (resolver.task_type, resolver.task_id, resolver.rpc_layer) == ("worker", 0, "grpc")
    with pytest.raises(ValueError, match="Application Default Credentials"):
        resolver.cluster_spec()


def test_a_discovery_client_as_service_is_called_as_tf_calls_it() -> None:
    # TF's service=: googleapiclient.discovery.build("compute", "v1"). No credentials and no
    # API endpoint are needed: the client makes the calls.
    client = ComputeClient(
        {
            "vm-a": ("10.0.0.9", "RUNNING"),
            "vm-b": ("10.0.0.10", "RUNNING"),
            "vm-c": ("10.0.0.2", "RUNNING"),
            "vm-d": ("10.0.0.3", "TERMINATED"),
        },
        page_size=2,
    )
    resolver = GCEClusterResolver(PROJECT, ZONE, GROUP, 2222, task_id=1, service=client)
    spec = resolver.cluster_spec()
    assert spec == ClusterSpec({"worker": ["10.0.0.10:2222", "10.0.0.2:2222", "10.0.0.9:2222"]})
    lists = [kw for method, kw in client.calls if method == "listInstances"]
    assert [kw.get("pageToken") for kw in lists[:2]] == [None, "2"]
    assert lists[0]["body"] == {"instanceState": "RUNNING"}
    assert (lists[0]["project"], lists[0]["zone"], lists[0]["instanceGroup"]) == (
        PROJECT,
        ZONE,
        GROUP,
    )
    gets = sorted(kw["instance"] for method, kw in client.calls if method == "get")
    assert gets == ["vm-a", "vm-b", "vm-c"]  # the TERMINATED one is never looked up
    assert resolver.master() == "grpc://10.0.0.2:2222"


def test_a_discovery_client_answering_no_object_is_named() -> None:
    class Odd(ComputeClient):
        def _list_instances(self, **kwargs: Any) -> Any:
            return ["not", "an", "object"]

    resolver = GCEClusterResolver(PROJECT, ZONE, GROUP, 8470, service=Odd({}))
    with pytest.raises(TypeError, match=r"listing the instances of instance group 'trainers'"):
        resolver.cluster_spec()
