"""TF 2.21 ``distribute/cluster_resolver/tpu/tpu_cluster_resolver_test.py``: every behaviour it
asserts, asserted against jaxcluster's ``TPUClusterResolver``. TF mocks the discovery client and
the metadata lookups; here local servers speak the Cloud TPU API's and the GCE metadata
server's JSON, and TF's device-listing mocks become a ``device_lister``."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from typing import Any

import pytest
from google.auth.credentials import AnonymousCredentials

from jaxcluster import ClusterSpec
from jaxcluster.cluster_resolver import TPUClusterResolver, tpu
from jaxcluster.devices import tpu_device_map, verify_same_core_count
from jaxcluster.errors import DeadlineExceededError
from support.cluster_defs import assert_cluster_def
from support.cluster_env import clear_cluster_env
from support.gce_metadata import FakeMetadataServer
from support.tpu_api import FakeTPUServer

PROJECT, ZONE = "test-project", "us-central1-c"
POD = [("10.2.3.4", 8470), ("10.2.3.5", 8470), ("10.2.3.6", 8470), ("10.2.3.7", 8470)]
POD_DEF = {"worker": {i: f"{ip}:{port}" for i, (ip, port) in enumerate(POD)}}


@pytest.fixture(autouse=True)
def _bare_env(monkeypatch: pytest.MonkeyPatch) -> None:
    clear_cluster_env(monkeypatch)
    monkeypatch.delenv("GCE_METADATA_TIMEOUT", raising=False)


@pytest.fixture
def api() -> Iterator[FakeTPUServer]:
    with FakeTPUServer() as server:
        yield server


@pytest.fixture
def metadata(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeMetadataServer]:
    with FakeMetadataServer(project_id=PROJECT, zone=ZONE, ip="10.128.1.2") as server:
        monkeypatch.setenv("GCE_METADATA_HOST", server.host)
        yield server


def _resolver(api: FakeTPUServer, tpu_name: Any, **kw: Any) -> TPUClusterResolver:
    kw.setdefault("project", PROJECT)
    kw.setdefault("zone", ZONE)
    return TPUClusterResolver(
        tpu=tpu_name, credentials=AnonymousCredentials(), api_endpoint=api.url, **kw
    )


def test_no_tpu_name_is_a_value_error(metadata: FakeMetadataServer) -> None:
    assert tpu.is_running_in_gce()
    with pytest.raises(ValueError, match=r"Please provide a TPU Name to connect to.*") as info:
        TPUClusterResolver(tpu="")
    assert "TPU name, grpc:// or 'local'" in str(info.value)


def test_is_running_in_gce(metadata: FakeMetadataServer, monkeypatch: pytest.MonkeyPatch) -> None:
    assert tpu.is_running_in_gce() is True
    metadata.garbage = True  # a server that is not a metadata server (no Metadata-Flavor back)
    assert tpu.is_running_in_gce() is False
    with socket.socket() as probe:  # nobody listens on this port
        probe.bind(("127.0.0.1", 0))
        monkeypatch.setenv("GCE_METADATA_HOST", f"127.0.0.1:{probe.getsockname()[1]}")
        assert tpu.is_running_in_gce(timeout=2) is False


def test_project_and_zone_from_metadata(api: FakeTPUServer, metadata: FakeMetadataServer) -> None:
    api.add_node(PROJECT, ZONE, "test-tpu-1", endpoints=[("10.1.2.3", 8470)], shape="legacy")
    resolver = TPUClusterResolver(
        project=None, zone=None, tpu=["test-tpu-1"], credentials=AnonymousCredentials(),
        api_endpoint=api.url, coordinator_name=None,
    )  # fmt: skip
    assert_cluster_def(resolver.cluster_spec(), {"worker": {0: "10.1.2.3:8470"}})
    assert resolver.master() == "grpc://10.1.2.3:8470"
    assert api.requests[0].path.endswith(f"/projects/{PROJECT}/locations/{ZONE}/nodes/test-tpu-1")


def test_a_coordinator_needs_its_address(api: FakeTPUServer, metadata: FakeMetadataServer) -> None:
    """TF starts a coordinator on this VM's IP when only coordinator_name is given; jaxcluster
    asks for the address (see docs/porting.md's differences)."""
    with pytest.raises(ValueError, match="coordinator_address"):
        _resolver(api, ["test-tpu-1"], coordinator_name="coordinator")


def test_a_node_not_ready_is_a_runtime_error(api: FakeTPUServer) -> None:
    api.add_node(PROJECT, ZONE, "test-tpu-1", endpoints=[("10.1.2.3", 8470)], state="CREATING")
    with pytest.raises(RuntimeError):
        _resolver(api, "test-tpu-1").cluster_spec()


def test_coordinator_job(api: FakeTPUServer) -> None:
    api.add_node(PROJECT, ZONE, "test-tpu-1", endpoints=[("10.1.2.3", 8470)], shape="legacy")
    resolver = _resolver(
        api, ["test-tpu-1"], coordinator_name="coordinator", coordinator_address="10.128.1.5:10203"
    )
    assert_cluster_def(
        resolver.cluster_spec(),
        {"coordinator": {0: "10.128.1.5:10203"}, "worker": {0: "10.1.2.3:8470"}},
    )
    assert resolver.master() == "grpc://10.1.2.3:8470"


def test_unknown_node_is_a_value_error(api: FakeTPUServer) -> None:
    api.add_node(PROJECT, ZONE, "test-tpu-1", endpoints=[("10.1.2.3", 8470)])
    resolver = _resolver(
        api,
        "nonexistent-tpu",
        coordinator_name="coordinator",
        coordinator_address="10.128.1.5:10203",
    )
    with pytest.raises(ValueError, match="nonexistent-tpu") as info:
        resolver.cluster_spec()
    assert "Could not lookup TPU metadata" in str(info.value)  # TF's words, as its test asserts


def test_network_endpoints(api: FakeTPUServer) -> None:
    api.add_node(PROJECT, ZONE, "test-tpu-1", endpoints=[("10.2.3.4", 8470)])
    resolver = _resolver(
        api, "test-tpu-1", coordinator_name="coordinator", coordinator_address="10.128.1.5:10203"
    )
    assert_cluster_def(
        resolver.cluster_spec(),
        {"coordinator": {0: "10.128.1.5:10203"}, "worker": {0: "10.2.3.4:8470"}},
    )
    assert resolver.master() == "grpc://10.2.3.4:8470"


def test_pod(api: FakeTPUServer, metadata: FakeMetadataServer) -> None:
    api.add_node(PROJECT, ZONE, "test-tpu-1", endpoints=POD)
    resolver = TPUClusterResolver(
        tpu="test-tpu-1", credentials=AnonymousCredentials(), api_endpoint=api.url
    )
    assert_cluster_def(resolver.cluster_spec(), POD_DEF)
    assert resolver.master() == "grpc://10.2.3.4:8470"


def test_pod_with_project_and_zone(api: FakeTPUServer) -> None:
    api.add_node(PROJECT, ZONE, "test-tpu-1", endpoints=POD)
    resolver = _resolver(api, "test-tpu-1", coordinator_name=None)
    assert_cluster_def(resolver.cluster_spec(), POD_DEF)
    assert resolver.master() == "grpc://10.2.3.4:8470"


def test_an_empty_list_is_a_value_error(api: FakeTPUServer) -> None:
    with pytest.raises(ValueError):
        _resolver(api, [], coordinator_name=None)


@pytest.mark.parametrize(
    ("name", "uses_api"),
    [("grpc://10.1.2.3:8470", False), ("mytpu", True), (["myothertpu"], True), ("grpctpu", True)],
)
def test_which_names_are_looked_up(api: FakeTPUServer, name: Any, uses_api: bool) -> None:
    resolver = _resolver(api, name, coordinator_name=None)
    if uses_api:
        with pytest.raises(ValueError):  # the API does not know the node
            resolver.cluster_spec()
    else:
        resolver.cluster_spec()
    assert bool(api.requests) is uses_api


def test_grpc_address_needs_no_metadata(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GCE_METADATA_HOST", "127.0.0.1:9")  # would fail if asked
    resolver = TPUClusterResolver(tpu="grpc://10.1.2.3:8470")
    assert resolver.master() == "grpc://10.1.2.3:8470"
    assert resolver.cluster_spec().as_dict() == ClusterSpec({"worker": ["10.1.2.3:8470"]}).as_dict()


@pytest.mark.parametrize("hosts", [1, 4])
def test_gke_endpoints(monkeypatch: pytest.MonkeyPatch, hosts: int) -> None:
    addresses = [f"10.120.27.{5 + i}:8470" for i in range(hosts)]
    monkeypatch.setenv(
        "KUBE_GOOGLE_CLOUD_TPU_ENDPOINTS", ",".join(f"grpc://{a}" for a in addresses)
    )
    resolver = TPUClusterResolver()
    assert resolver.master() == "grpc://10.120.27.5:8470"
    assert_cluster_def(resolver.cluster_spec(), {"worker": dict(enumerate(addresses))})


def test_task_override_moves_the_master(api: FakeTPUServer) -> None:
    api.add_node(PROJECT, ZONE, "test-tpu-1", endpoints=POD)
    resolver = _resolver(api, "test-tpu-1", coordinator_name=None)
    assert resolver.master() == "grpc://10.2.3.4:8470"
    resolver.task_type, resolver.task_id = "worker", 3
    assert resolver.master() == "grpc://10.2.3.7:8470"


TPU_NAMES = [
    "/job:tpu_worker/task:0/device:TPU:0",
    "/job:tpu_worker/task:1/device:TPU:1",
    "/job:tpu_worker/task:2/device:TPU:0",
    "/job:tpu_worker/task:3/device:TPU:1",
    "/job:tpu_worker/task:0/device:TPU:4",
    "/job:tpu_worker/task:1/device:TPU:5",
    "/job:tpu_worker/task:2/device:TPU:4",
    "/job:tpu_worker/task:3/device:TPU:5",
]


def test_device_map_and_cores_of_tpus() -> None:
    device_map, total = tpu_device_map(TPU_NAMES)
    assert total == 8
    assert device_map == {0: [0, 4], 1: [1, 5], 2: [0, 4], 3: [1, 5]}


def test_device_map_ignores_cpus_and_gpus() -> None:
    names = [
        f"/job:tpu_worker/task:{t}/device:{kind}" for t in range(4) for kind in ("CPU:0", "GPU:1")
    ]
    assert tpu_device_map(names) == ({}, 0)


def test_same_core_count() -> None:
    assert verify_same_core_count({0: [0, 1, 2, 3, 4, 5, 6, 7]}) == 8
    assert verify_same_core_count({0: [0, 1], 1: [2, 3]}) == 2
    with pytest.raises(RuntimeError):
        verify_same_core_count({0: [0], 1: [1, 2]})


def test_num_accelerators_is_cores_per_host(api: FakeTPUServer) -> None:
    api.add_node(PROJECT, ZONE, "test-tpu-1", endpoints=POD)
    resolver = _resolver(api, "test-tpu-1", device_lister=lambda: [(n, "TPU") for n in TPU_NAMES])
    assert resolver.num_accelerators() == {"TPU": 2}


def test_num_accelerators_when_listing_fails(api: FakeTPUServer) -> None:
    api.add_node(PROJECT, ZONE, "test-tpu-1", endpoints=POD)

    def timed_out() -> list[tuple[str, str]]:
        raise DeadlineExceededError("timeout")

    resolver = _resolver(api, "test-tpu-1", device_lister=timed_out)
    with pytest.raises(RuntimeError):
        resolver.num_accelerators()


def test_local_tpu_has_no_master_and_no_environment() -> None:
    resolver = TPUClusterResolver(tpu="local")
    assert resolver.get_master() == ""
    assert resolver.environment == ""


def test_tpu_topology() -> None:
    resolver = TPUClusterResolver(tpu="local")
    assert resolver.tpu_hardware_feature is None
    # A serialized TopologyProto with mesh_shape [1, 1, 1, 1] (field 1, packed varints).
    resolver.set_tpu_topology(serialized_tpu_topology=b"\x0a\x04\x01\x01\x01\x01")
    feature = resolver.tpu_hardware_feature
    assert isinstance(feature, tpu.TPUHardwareFeature)
    assert feature.embedding_feature == tpu.TPUHardwareFeature.EmbeddingFeature.UNSUPPORTED
    # ... and one that names an embedding accelerator V2 with 4 devices per chip (field 5).
    resolver.set_tpu_topology(b"\x0a\x04\x02\x02\x01\x02\x10\x04\x2a\x04\x08\x02\x10\x04")
    feature = resolver.tpu_hardware_feature
    assert feature == tpu.TPUHardwareFeature(tpu.TPUHardwareFeature.EmbeddingFeature.V2, 4)
    with pytest.raises(ValueError, match="TopologyProto"):
        resolver.set_tpu_topology(b"\x0a\x09\x01")


def test_coordination_service_leader_is_the_first_worker() -> None:
    resolver = TPUClusterResolver(tpu="grpc://10.1.2.3:8470,grpc://10.1.2.4:8470")
    assert resolver.get_coordination_service_leader() == "/job:worker/task:0"
