"""TPUClusterResolver against local fakes of the Cloud TPU API and the GCE metadata server."""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Iterator
from typing import Any

import pytest
from google.auth.credentials import AnonymousCredentials
from google.oauth2.credentials import Credentials

from jaxcluster._native import core
from jaxcluster.cluster_resolver import TPUClusterResolver
from jaxcluster.cluster_spec import ClusterSpec
from jaxcluster.errors import DeadlineExceededError, UnavailableError
from support.cluster_env import clear_cluster_env
from support.discovery import TpuClient
from support.gce_metadata import FakeMetadataServer
from support.tpu_api import API_VERSIONS, FakeTPUServer, make_node

PROJECT, ZONE = "test-project", "us-central2-b"  # what FakeMetadataServer reports
POD = [("10.130.0.2", 8470), ("10.130.0.3", 8470), ("10.130.0.4", 8470), ("10.130.0.5", 8470)]
SANITY_BOUND = 4.0  # timeouts: only check that the bound was honoured at all


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    clear_cluster_env(monkeypatch)
    for name in ("GCE_METADATA_TIMEOUT", "GOOGLE_APPLICATION_CREDENTIALS", "GCE_METADATA_ROOT"):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def api() -> Iterator[FakeTPUServer]:
    with FakeTPUServer() as server:
        server.add_node(PROJECT, ZONE, "pod", endpoints=POD, accelerator_type="v4-32")
        server.add_node(PROJECT, ZONE, "single", endpoints=[("10.0.0.2", 8470)])
        yield server


@pytest.fixture
def metadata(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeMetadataServer]:
    with FakeMetadataServer(project_id=PROJECT, zone=ZONE) as server:
        monkeypatch.setenv("GCE_METADATA_HOST", server.host)
        yield server


def _tpu(api: FakeTPUServer, tpu: Any = "pod", **kw: Any) -> TPUClusterResolver:
    kw.setdefault("credentials", AnonymousCredentials())
    kw.setdefault("project", PROJECT)
    kw.setdefault("zone", ZONE)
    return TPUClusterResolver(tpu, api_endpoint=api.url, **kw)


def _addresses(endpoints: list[tuple[str, int]]) -> list[str]:
    return [f"{ip}:{port}" for ip, port in endpoints]


# -- which TPU ----------------------------------------------------------------------------------


def test_grpc_list_needs_no_api_and_defaults_the_port(api: FakeTPUServer) -> None:
    resolver = TPUClusterResolver("grpc://10.0.0.1,grpc://10.0.0.2:8471, 10.0.0.3")
    assert resolver.cluster_spec() == ClusterSpec(
        {"worker": ["10.0.0.1:8470", "10.0.0.2:8471", "10.0.0.3:8470"]}
    )
    assert resolver.master() == "grpc://10.0.0.1:8470"
    assert api.requests == []


def test_name_from_kube_endpoints(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KUBE_GOOGLE_CLOUD_TPU_ENDPOINTS", "grpc://10.4.0.5:8470,grpc://10.4.0.6")
    monkeypatch.setenv("TPU_NAME", "ignored-because-kube-wins")
    spec = TPUClusterResolver().cluster_spec()
    assert spec.job_tasks("worker") == ["10.4.0.5:8470", "10.4.0.6:8470"]


def test_name_from_tpu_name(api: FakeTPUServer, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TPU_NAME", "single")
    assert _tpu(api, None).master() == "grpc://10.0.0.2:8470"
    assert api.paths()[-1] == f"/v2/projects/{PROJECT}/locations/{ZONE}/nodes/single"


def test_tpu_argument_wins_over_environment(
    api: FakeTPUServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TPU_NAME", "pod")
    assert _tpu(api, "single").cluster_spec().num_tasks("worker") == 1


def test_name_project_zone_from_tpu_config(
    api: FakeTPUServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    api.add_node("cfg-proj", "europe-west4-a", "cfg-tpu", endpoints=[("10.9.0.2", 8470)])
    config = {"tpu_node_name": "cfg-tpu", "project": "cfg-proj", "zone": "europe-west4-a"}
    monkeypatch.setenv("TPU_CONFIG", json.dumps(config))
    # No metadata server is configured: project and zone must come from TPU_CONFIG.
    resolver = TPUClusterResolver(credentials=AnonymousCredentials(), api_endpoint=api.url)
    assert resolver.cluster_spec().job_tasks("worker") == ["10.9.0.2:8470"]
    assert api.paths() == ["/v2/projects/cfg-proj/locations/europe-west4-a/nodes/cfg-tpu"]


def test_malformed_tpu_config_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TPU_CONFIG", "{tpu_node_name: oops")
    with pytest.raises(ValueError, match="TPU_CONFIG is not valid JSON"):
        TPUClusterResolver()


def test_no_tpu_anywhere_lists_what_was_tried() -> None:
    with pytest.raises(ValueError, match="KUBE_GOOGLE_CLOUD_TPU_ENDPOINTS, TPU_NAME, TPU_CONFIG"):
        TPUClusterResolver()


def test_address_without_grpc_prefix_gets_a_hint() -> None:
    with pytest.raises(ValueError, match=r"grpc://10\.0\.0\.1:8470"):
        TPUClusterResolver("10.0.0.1:8470")


def test_tpu_lists() -> None:
    assert TPUClusterResolver(["grpc://10.0.0.1"]).master() == "grpc://10.0.0.1:8470"
    with pytest.raises(NotImplementedError, match="2 TPUs"):
        TPUClusterResolver(["a", "b"])
    with pytest.raises(ValueError, match="empty list"):
        TPUClusterResolver([])


def test_bad_grpc_port_is_named() -> None:
    with pytest.raises(ValueError, match=r"'grpc://10\.0\.0\.1:http'"):
        TPUClusterResolver("grpc://10.0.0.1:http")


# -- the Cloud TPU API --------------------------------------------------------------------------


def test_project_and_zone_from_metadata(api: FakeTPUServer, metadata: FakeMetadataServer) -> None:
    resolver = TPUClusterResolver(
        "single", credentials=AnonymousCredentials(), api_endpoint=api.url
    )
    assert resolver.master() == "grpc://10.0.0.2:8470"
    assert api.paths() == [f"/v2/projects/{PROJECT}/locations/{ZONE}/nodes/single"]
    assert sorted(metadata.paths()) == [
        "/computeMetadata/v1/instance/zone",
        "/computeMetadata/v1/project/project-id",
    ]


def test_explicit_project_skips_metadata_for_it(
    api: FakeTPUServer, metadata: FakeMetadataServer
) -> None:
    api.add_node("other", ZONE, "single", endpoints=[("10.7.0.2", 8470)])
    resolver = TPUClusterResolver(
        "single", project="other", credentials=AnonymousCredentials(), api_endpoint=api.url
    )
    assert resolver.master() == "grpc://10.7.0.2:8470"
    assert metadata.paths() == ["/computeMetadata/v1/instance/zone"]


@pytest.mark.parametrize("version", API_VERSIONS)
def test_api_versions(api: FakeTPUServer, version: str) -> None:
    assert _tpu(api, "single", api_version=version).master() == "grpc://10.0.0.2:8470"
    assert api.paths() == [f"/{version}/projects/{PROJECT}/locations/{ZONE}/nodes/single"]


def test_v2_is_the_default(api: FakeTPUServer) -> None:
    _tpu(api).cluster_spec()
    assert api.paths()[0].startswith("/v2/projects/")


def test_versioned_endpoint_is_accepted(api: FakeTPUServer) -> None:
    resolver = TPUClusterResolver(
        "single", ZONE, PROJECT, credentials=AnonymousCredentials(), api_endpoint=f"{api.url}/v2/"
    )
    assert resolver.master() == "grpc://10.0.0.2:8470"
    assert api.paths() == [f"/v2/projects/{PROJECT}/locations/{ZONE}/nodes/single"]


def test_unknown_api_version() -> None:
    with pytest.raises(ValueError, match="'v3'"):
        TPUClusterResolver("grpc://10.0.0.1", api_version="v3")


def test_pod_slice_endpoints_in_api_order(api: FakeTPUServer) -> None:
    resolver = _tpu(api)
    assert resolver.cluster_spec() == ClusterSpec({"worker": _addresses(POD)})
    assert resolver.master() == "grpc://10.130.0.2:8470"
    assert resolver.get_master() == resolver.master()
    assert resolver.get_job_name() == "worker"


def test_legacy_node_shape(api: FakeTPUServer) -> None:
    node = api.add_node(PROJECT, ZONE, "old", endpoints=[("10.240.1.2", 8470)], shape="legacy")
    assert "networkEndpoints" not in node and node["port"] == "8470"
    assert _tpu(api, "old", api_version="v1").cluster_spec().job_tasks("worker") == [
        "10.240.1.2:8470"
    ]


@pytest.mark.parametrize("state", ["CREATING", "STOPPED", "PREEMPTED", "REPAIRING"])
def test_node_not_ready(api: FakeTPUServer, state: str) -> None:
    api.add_node(PROJECT, ZONE, "busy", endpoints=[("10.0.0.9", 8470)], state=state)
    with pytest.raises(RuntimeError, match=f"'busy' is not ready: its state is '{state}'"):
        _tpu(api, "busy").cluster_spec()


def test_unknown_node_is_a_value_error_naming_it(api: FakeTPUServer) -> None:
    with pytest.raises(ValueError, match="TPU node 'ghost'") as info:
        _tpu(api, "ghost").cluster_spec()
    assert "404" in str(info.value) and "was not found" in str(info.value)


def test_forbidden_node_names_the_permission(api: FakeTPUServer) -> None:
    api.forbidden.add((PROJECT, ZONE, "pod"))
    with pytest.raises(ValueError, match=r"'tpu\.nodes\.get'"):
        _tpu(api).master()


def test_500_is_retried(api: FakeTPUServer) -> None:
    api.fail_next(500)
    assert _tpu(api, "single").master() == "grpc://10.0.0.2:8470"
    assert len(api.requests) == 2


def test_every_call_asks_the_api_again(api: FakeTPUServer) -> None:
    resolver = _tpu(api, "single")
    resolver.cluster_spec()
    api.add_node(PROJECT, ZONE, "single", endpoints=[("10.0.0.77", 8470)])
    assert resolver.master() == "grpc://10.0.0.77:8470"
    assert len(api.requests) == 2


def test_bearer_token_is_sent(api: FakeTPUServer) -> None:
    _tpu(api, credentials=Credentials(token="tpu-secret")).cluster_spec()
    assert [r.authorization for r in api.requests] == ["Bearer tpu-secret"]


def test_anonymous_sends_no_authorization(api: FakeTPUServer) -> None:
    _tpu(api).cluster_spec()
    assert [r.authorization for r in api.requests] == [None]


def test_discovery_url_env_points_at_the_server(
    api: FakeTPUServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TPU_API_DISCOVERY_URL", f"{api.url}/$discovery/rest?version=v1")
    resolver = TPUClusterResolver(
        "single",
        project=PROJECT,
        zone=ZONE,
        credentials=AnonymousCredentials(),
        discovery_url="http://127.0.0.1:9/never-used",
    )
    assert resolver.master() == "grpc://10.0.0.2:8470"


def test_discovery_url_argument(api: FakeTPUServer) -> None:
    resolver = TPUClusterResolver(
        "single",
        project=PROJECT,
        zone=ZONE,
        credentials=AnonymousCredentials(),
        discovery_url=f"{api.url}/discovery/v1/apis/tpu/v1/rest",
    )
    assert resolver.master() == "grpc://10.0.0.2:8470"


def test_discovery_service_object_is_rejected(api: FakeTPUServer) -> None:
    with pytest.raises(TypeError, match="discovery clients"):
        _tpu(api, service=object())


# -- metadata server trouble ----------------------------------------------------------------------


def test_metadata_down(monkeypatch: pytest.MonkeyPatch) -> None:
    server = FakeMetadataServer().start()
    dead = server.host
    server.stop()
    monkeypatch.setenv("GCE_METADATA_HOST", dead)
    with pytest.raises(UnavailableError, match="pass project= and zone=") as info:
        TPUClusterResolver("pod", credentials=AnonymousCredentials())
    assert dead in str(info.value)


def test_metadata_slow_is_bounded(
    metadata: FakeMetadataServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GCE_METADATA_TIMEOUT", "0.3")
    metadata.delay = 30
    start = time.monotonic()
    with pytest.raises(DeadlineExceededError, match=r"within 0\.3s"):
        TPUClusterResolver("pod", credentials=AnonymousCredentials())
    assert time.monotonic() - start < SANITY_BOUND


def test_api_timeout_is_bounded(api: FakeTPUServer) -> None:
    api.delay = 30
    start = time.monotonic()
    with pytest.raises(ValueError, match=r"no answer within 0\.3s") as info:
        _tpu(api, timeout=0.3).cluster_spec()
    assert time.monotonic() - start < SANITY_BOUND
    assert isinstance(info.value.__cause__, DeadlineExceededError)


# -- coordinator and tasks -----------------------------------------------------------------------


def test_coordinator_job(api: FakeTPUServer) -> None:
    resolver = _tpu(api, coordinator_name="coordinator", coordinator_address="10.1.1.1:8470")
    assert resolver.cluster_spec() == ClusterSpec(
        {"worker": _addresses(POD), "coordinator": ["10.1.1.1:8470"]}
    )
    assert resolver.master(task_type="coordinator", task_id=0) == "grpc://10.1.1.1:8470"
    # The TF coordinator is a client, not a JAX process.
    resolver.task_id = 1
    assert resolver.jax_distributed_args()["num_processes"] == len(POD)


@pytest.mark.parametrize(
    ("kw", "given"),
    [
        ({"coordinator_name": "coordinator"}, "coordinator_name"),
        ({"coordinator_address": "10.1.1.1:8470"}, "coordinator_address"),
    ],
)
def test_half_given_coordinator(kw: dict[str, str], given: str) -> None:
    with pytest.raises(ValueError, match=f"{given} is set"):
        TPUClusterResolver("grpc://10.0.0.1", **kw)


def test_task_overrides(api: FakeTPUServer) -> None:
    resolver = _tpu(api, job_name="tpu_worker")
    assert resolver.cluster_spec().jobs == ["tpu_worker"]
    assert (resolver.task_type, resolver.task_id, resolver.rpc_layer) == ("tpu_worker", 0, "grpc")
    resolver.task_id = 2
    assert resolver.master() == "grpc://10.130.0.4:8470"
    assert resolver.master(task_id=3, rpc_layer="http") == "http://10.130.0.5:8470"
    resolver.task_type = "worker"
    assert resolver.get_job_name() == "worker"
    assert resolver.cluster_spec().jobs == ["worker"]
    with pytest.raises(ValueError):
        resolver.master(task_id=9)
    args = resolver.jax_distributed_args(coordinator_port=8476)
    assert args == {"coordinator_address": "10.130.0.2:8476", "num_processes": 4, "process_id": 2}


def test_multi_host_process_id_from_own_ip(
    api: FakeTPUServer, metadata: FakeMetadataServer
) -> None:
    metadata.ip = "10.130.0.4"
    assert _tpu(api).jax_distributed_args()["process_id"] == 2


def test_multi_host_process_id_unknown_is_an_error(api: FakeTPUServer) -> None:
    with pytest.raises(ValueError, match=r"set resolver\.task_id"):
        _tpu(api).jax_distributed_args()


# -- devices ---------------------------------------------------------------------------------------


def _pod_devices(cores: list[int]) -> list[tuple[str, str]]:
    devices = []
    for host, count in enumerate(cores):
        devices.append((f"/job:worker/replica:0/task:{host}/device:CPU:0", "CPU"))
        devices.append((f"/job:worker/replica:0/task:{host}/device:TPU_SYSTEM:0", "TPU_SYSTEM"))
        devices.extend(
            (f"/job:worker/replica:0/task:{host}/device:TPU:{core}", "TPU") for core in range(count)
        )
    return devices


def test_core_counting_with_device_lister(api: FakeTPUServer) -> None:
    api.add_node(PROJECT, ZONE, "pod", endpoints=POD[:2], topology="2x2x2")
    resolver = _tpu(api, device_lister=lambda: _pod_devices([4, 4]))
    assert resolver.num_accelerators() == {"TPU": 4}
    meta = resolver.get_tpu_system_metadata()
    assert (meta.num_cores, meta.num_hosts, meta.num_of_cores_per_host) == (8, 2, 4)
    assert meta.topology == "2x2x2"
    assert len(meta.devices) == 12
    assert meta.devices[2].name == "/job:worker/replica:0/task:0/device:TPU:0"
    assert meta.devices[2].device_type == "TPU"


def test_uneven_core_counts_are_an_error(api: FakeTPUServer) -> None:
    resolver = _tpu(api, device_lister=lambda: _pod_devices([4, 2]))
    with pytest.raises(RuntimeError):
        resolver.num_accelerators()


def test_no_tpu_cores(api: FakeTPUServer) -> None:
    resolver = _tpu(api, device_lister=lambda: _pod_devices([0, 0]))
    assert resolver.num_accelerators() == {"TPU": 0}
    with pytest.raises(RuntimeError, match="no TPU cores"):
        resolver.get_tpu_system_metadata()


def test_device_lister_must_return_pairs(api: FakeTPUServer) -> None:
    with pytest.raises(TypeError, match="device_lister"):
        TPUClusterResolver("grpc://10.0.0.1", device_lister="TPU:0")  # type: ignore[arg-type]
    resolver = TPUClusterResolver("grpc://10.0.0.1", device_lister=lambda: ["TPU:0"])  # type: ignore[list-item]
    with pytest.raises(TypeError, match="'TPU:0'"):
        resolver.num_accelerators()


def test_remote_devices_come_from_the_workers_list_devices_rpc(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from jaxcluster import LocalCluster

    with LocalCluster(1) as cluster:
        address = cluster.addresses[0]
        monkeypatch.setenv("JAXCLUSTER_AUTH_TOKEN", cluster.auth_token)
        resolver = TPUClusterResolver(f"grpc://{address}")
        expected = core.WorkerClient(address, cluster.auth_token).list_devices()
        assert expected and all(d["device_type"] == "CPU" for d in expected)
        # A CPU-only worker has no TPU cores; the error lists what the RPC returned.
        assert resolver.num_accelerators() == {"TPU": 0}
        with pytest.raises(RuntimeError, match="no TPU cores") as info:
            resolver.get_tpu_system_metadata()
        for device in expected:
            assert f"{device['name']} ({device['device_type']})" in str(info.value)

        monkeypatch.setenv("JAXCLUSTER_AUTH_TOKEN", "not-the-token")
        with pytest.raises(RuntimeError, match="JAXCLUSTER_AUTH_TOKEN") as info:
            TPUClusterResolver(f"grpc://{address}").num_accelerators()
        assert address in str(info.value)


def test_unreachable_remote_worker_names_the_address() -> None:
    with socket.socket() as probe:  # a port nobody listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    resolver = TPUClusterResolver(f"grpc://127.0.0.1:{port}", timeout=5.0)
    with pytest.raises(RuntimeError, match="ListDevices") as info:
        resolver.num_accelerators()
    assert f"127.0.0.1:{port}" in str(info.value)


def test_a_discovery_client_as_service_is_called_as_tf_calls_it() -> None:
    # TF's service=: googleapiclient.discovery.build("tpu", "v2"). The client makes the calls:
    # no credentials and no API endpoint.
    full = f"projects/{PROJECT}/locations/{ZONE}/nodes/pod"
    client = TpuClient({full: make_node(PROJECT, ZONE, "pod", endpoints=POD)})
    resolver = TPUClusterResolver("pod", project=PROJECT, zone=ZONE, service=client)
    assert resolver.cluster_spec() == ClusterSpec({"worker": _addresses(POD)})
    assert resolver.master() == "grpc://10.130.0.2:8470"
    assert client.calls[0] == ("get", {"name": full})


def test_a_discovery_client_lookup_failure_is_a_value_error_naming_the_node() -> None:
    resolver = TPUClusterResolver("ghost", project=PROJECT, zone=ZONE, service=TpuClient({}))
    with pytest.raises(ValueError, match=r"TPU node 'ghost'.*the service= client"):
        resolver.cluster_spec()
