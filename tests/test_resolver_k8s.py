"""KubernetesClusterResolver against a real HTTP Kubernetes API server on 127.0.0.1, through
the official client (kubeconfig and in-cluster loaders included)."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path

import pytest
from kubernetes import client
from kubernetes.config import ConfigException

from jaxcluster import errors
from jaxcluster.cluster_resolver import (
    KubernetesClusterResolver,
    KubernetesExecutableLocation,
)
from jaxcluster.cluster_spec import ClusterSpec
from support.cluster_env import clear_cluster_env
from support.k8s_api import (
    FakeKubernetesAPI,
    incluster_env,
    selector_matches,
    write_kubeconfig,
)

TOKEN = "k8s-test-token"


@pytest.fixture(autouse=True)
def _bare_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    clear_cluster_env(monkeypatch)
    # Never fall back to the developer's own ~/.kube/config.
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "no-such-kubeconfig"))


@pytest.fixture
def api() -> Iterator[FakeKubernetesAPI]:
    with FakeKubernetesAPI(token=TOKEN) as server:
        yield server


@pytest.fixture
def kubeconfig(api: FakeKubernetesAPI, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = write_kubeconfig(tmp_path / "kubeconfig", api)
    monkeypatch.setenv("KUBECONFIG", str(path))
    return path


def test_default_mapping_sorts_pods_by_name_and_uses_pod_ip(
    api: FakeKubernetesAPI, kubeconfig: Path
) -> None:
    api.add_pod("tf-2", {"job-name": "tensorflow"}, pod_ip="10.0.0.12", host_ip="192.168.1.2")
    api.add_pod("tf-0", {"job-name": "tensorflow"}, pod_ip="10.0.0.10", host_ip="192.168.1.0")
    api.add_pod("tf-1", {"job-name": "tensorflow"}, pod_ip="10.0.0.11", host_ip="192.168.1.1")
    api.add_pod("other", {"job-name": "pytorch"}, pod_ip="10.0.0.99")

    resolver = KubernetesClusterResolver()

    assert resolver.config_source == "kubeconfig"
    assert resolver.api_server == api.url
    assert resolver.cluster_spec() == ClusterSpec(
        {"worker": ["10.0.0.10:8470", "10.0.0.11:8470", "10.0.0.12:8470"]}
    )
    (request,) = api.requests
    assert request.path == "/api/v1/pods"
    assert request.label_selector == "job-name=tensorflow"
    assert request.authorization == f"Bearer {TOKEN}"


def test_several_jobs_and_selectors_keep_selector_order(
    api: FakeKubernetesAPI, kubeconfig: Path
) -> None:
    api.add_pod("chief-0", {"app": "t", "role": "chief"}, pod_ip="10.1.0.1")
    api.add_pod("b-1", {"app": "t", "role": "worker", "pool": "b"}, pod_ip="10.2.0.2")
    api.add_pod("b-0", {"app": "t", "role": "worker", "pool": "b"}, pod_ip="10.2.0.1")
    api.add_pod("a-0", {"app": "t", "role": "worker", "pool": "a"}, pod_ip="10.3.0.1")
    api.add_pod("z-0", {"app": "t", "role": "worker", "pool": "a"}, pod_ip="10.3.0.2")
    mapping = {"chief": ["app=t,role=chief"], "worker": ["pool==b", "pool in (a),role!=chief"]}

    resolver = KubernetesClusterResolver(mapping, tf_server_port=2222, rpc_layer="grpc+tls")
    spec = resolver.cluster_spec()

    # Selector by selector (b first, as listed), then by name within one selector.
    assert spec.as_dict() == {
        "chief": ["10.1.0.1:2222"],
        "worker": ["10.2.0.1:2222", "10.2.0.2:2222", "10.3.0.1:2222", "10.3.0.2:2222"],
    }
    assert [r.label_selector for r in api.requests] == [
        "app=t,role=chief",
        "pool==b",
        "pool in (a),role!=chief",
    ]
    assert resolver.master("worker", 2) == "grpc+tls://10.3.0.1:2222"
    assert resolver.master("chief", 0, rpc_layer="http") == "http://10.1.0.1:2222"
    resolver.task_type, resolver.task_id = "worker", 1
    assert resolver.master() == "grpc+tls://10.2.0.2:2222"
    assert resolver.jax_distributed_args() == {
        "coordinator_address": "10.1.0.1:2222",
        "num_processes": 5,
        "process_id": 2,
    }


def test_namespace_narrows_the_listing(api: FakeKubernetesAPI, kubeconfig: Path) -> None:
    api.add_pod("w-0", {"job-name": "tensorflow"}, namespace="ml", pod_ip="10.0.1.1")
    api.add_pod("w-1", {"job-name": "tensorflow"}, namespace="web", pod_ip="10.0.2.1")

    everywhere = KubernetesClusterResolver().cluster_spec()
    only_ml = KubernetesClusterResolver(namespace="ml").cluster_spec()

    assert everywhere.as_dict() == {"worker": ["10.0.1.1:8470", "10.0.2.1:8470"]}
    assert only_ml.as_dict() == {"worker": ["10.0.1.1:8470"]}
    assert [r.path for r in api.requests] == ["/api/v1/pods", "/api/v1/namespaces/ml/pods"]


def test_cluster_spec_is_re_resolved_on_every_call(
    api: FakeKubernetesAPI, kubeconfig: Path
) -> None:
    resolver = KubernetesClusterResolver()
    api.add_pod("tf-0", {"job-name": "tensorflow"}, pod_ip="10.0.0.1")
    assert resolver.cluster_spec().num_tasks("worker") == 1
    api.add_pod("tf-1", {"job-name": "tensorflow"}, pod_ip="10.0.0.2")
    assert resolver.cluster_spec().num_tasks("worker") == 2


@pytest.mark.parametrize("phase", ["Pending", "Failed", "Succeeded", "Unknown"])
def test_non_running_pod_names_pod_and_phase(
    api: FakeKubernetesAPI, kubeconfig: Path, phase: str
) -> None:
    api.add_pod("tf-0", {"job-name": "tensorflow"})
    api.add_pod("tf-1", {"job-name": "tensorflow"}, phase=phase, namespace="ml")

    with pytest.raises(RuntimeError) as info:
        KubernetesClusterResolver().cluster_spec()

    message = str(info.value)
    assert "'tf-1'" in message and "'ml'" in message
    assert repr(phase) in message and "'Running'" in message


def test_running_pod_without_pod_ip_is_a_clear_error(
    api: FakeKubernetesAPI, kubeconfig: Path
) -> None:
    api.add_pod("tf-0", {"job-name": "tensorflow"}, pod_ip=None, host_ip="192.168.0.7")

    with pytest.raises(RuntimeError, match=r"'tf-0'.*no status\.pod_ip"):
        KubernetesClusterResolver().cluster_spec()
    # The node's address is there, so opting into host IPs works for the same pod.
    spec = KubernetesClusterResolver(use_host_ip=True).cluster_spec()
    assert spec.as_dict() == {"worker": ["192.168.0.7:8470"]}


def test_pod_without_phase_or_name_is_a_clear_error(
    api: FakeKubernetesAPI, kubeconfig: Path
) -> None:
    api.add_raw_pod({"metadata": {"name": "half", "labels": {"job-name": "tensorflow"}}})
    with pytest.raises(RuntimeError, match=r"'half'.*no status\.phase"):
        KubernetesClusterResolver().cluster_spec()

    api.clear_pods()
    api.add_raw_pod({"metadata": {"labels": {"job-name": "tensorflow"}}, "status": {}})
    with pytest.raises(RuntimeError, match=r"without metadata\.name.*'job-name=tensorflow'"):
        KubernetesClusterResolver().cluster_spec()


def test_use_host_ip_and_ipv6_pod_ips(api: FakeKubernetesAPI, kubeconfig: Path) -> None:
    api.add_pod("a", {"job-name": "tensorflow"}, pod_ip="fd00::5", host_ip="192.168.0.5")

    assert KubernetesClusterResolver().cluster_spec().as_dict() == {"worker": ["[fd00::5]:8470"]}
    by_host = KubernetesClusterResolver(use_host_ip=True).cluster_spec()
    assert by_host.as_dict() == {"worker": ["192.168.0.5:8470"]}


def test_selector_matching_nothing_gives_empty_job_and_master_names_it(
    api: FakeKubernetesAPI, kubeconfig: Path
) -> None:
    api.add_pod("w-0", {"role": "worker"}, pod_ip="10.0.0.1")
    resolver = KubernetesClusterResolver({"worker": ["role=worker"], "ps": ["role=ps"]})

    spec = resolver.cluster_spec()
    assert spec.as_dict() == {"worker": ["10.0.0.1:8470"], "ps": {}}
    assert spec.num_tasks("ps") == 0
    assert resolver.master() == ""  # no task set: TF returns ''
    with pytest.raises(ValueError, match=r"No task 0 in job 'ps'.*\['role=ps'\] matched no pods"):
        resolver.master("ps", 0)
    with pytest.raises(ValueError, match=r"No task 3 in job 'worker'.*0\.\.0"):
        resolver.master("worker", 3)
    with pytest.raises(ValueError, match=r"'wroker' is not a job.*did you mean 'worker'"):
        resolver.master("wroker", 0)


@pytest.mark.parametrize("namespace", [None, "ml"])
def test_forbidden_names_rbac_verbs_and_scope(
    api: FakeKubernetesAPI, kubeconfig: Path, namespace: str | None
) -> None:
    api.set_forbidden()

    with pytest.raises(PermissionError) as info:
        KubernetesClusterResolver(namespace=namespace).cluster_spec()

    message = str(info.value)
    assert "403" in message and api.url in message
    assert "'get' and 'list'" in message and "'pods'" in message
    if namespace:
        assert "namespace 'ml'" in message and "RoleBinding" in message
    else:
        assert "all namespaces" in message and "ClusterRoleBinding" in message
    # The server's own explanation is kept.
    assert "cannot list resource" in message


def test_wrong_token_is_unauthenticated(api: FakeKubernetesAPI, tmp_path: Path) -> None:
    path = write_kubeconfig(tmp_path / "kc", api, token="stale")
    with pytest.raises(errors.UnauthenticatedError, match="401"):
        KubernetesClusterResolver(kubeconfig=path).cluster_spec()
    assert api.requests[0].authorization == "Bearer stale"


def test_slow_server_times_out_naming_the_server(api: FakeKubernetesAPI, kubeconfig: Path) -> None:
    api.hold_requests()
    resolver = KubernetesClusterResolver(timeout=0.3)
    try:
        with pytest.raises(errors.DeadlineExceededError) as info:
            resolver.cluster_spec()
    finally:
        api.release()
    message = str(info.value)
    assert "0.3s" in message and api.url in message and "job-name=tensorflow" in message
    assert isinstance(info.value, TimeoutError)
    assert len(api.requests) == 1  # a read timeout is not retried behind the caller's back


def test_unreachable_server_is_unavailable(tmp_path: Path) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    with FakeKubernetesAPI() as api:
        path = write_kubeconfig(tmp_path / "kc", api)
    # The server is gone; point the kubeconfig at its (now closed) port.
    text = path.read_text().replace(f":{api.port}", f":{port}")
    path.write_text(text)
    with pytest.raises(errors.UnavailableError, match=rf"127\.0\.0\.1:{port}"):
        KubernetesClusterResolver(kubeconfig=path).cluster_spec()


def test_missing_kubeconfig_names_the_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigException, match=r"no-such-kubeconfig.*KUBECONFIG"):
        KubernetesClusterResolver()


def test_kubeconfig_context_argument(api: FakeKubernetesAPI, tmp_path: Path) -> None:
    path = write_kubeconfig(tmp_path / "kc", api, context="prod")
    api.add_pod("tf-0", {"job-name": "tensorflow"}, pod_ip="10.9.0.1")
    with pytest.raises(ConfigException, match="'staging'"):
        KubernetesClusterResolver(kubeconfig=path, context="staging")
    spec = KubernetesClusterResolver(kubeconfig=path, context="prod").cluster_spec()
    assert spec.as_dict() == {"worker": ["10.9.0.1:8470"]}


def test_inside_a_pod_the_service_account_is_used(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with FakeKubernetesAPI(token="sa-token", tls=True) as api:
        api.add_pod("tf-0", {"job-name": "tensorflow"}, pod_ip="10.0.0.3")
        for name, value in incluster_env(tmp_path / "sa", api).items():
            monkeypatch.setenv(name, value)

        resolver = KubernetesClusterResolver(service_account_dir=tmp_path / "sa")

        assert resolver.config_source == "in-cluster"
        assert resolver.api_server == f"https://127.0.0.1:{api.port}"
        assert resolver.cluster_spec().as_dict() == {"worker": ["10.0.0.3:8470"]}
        assert api.requests[0].authorization.lower() == "bearer sa-token"


def test_off_cluster_uses_kubeconfig_even_inside_a_pod(
    api: FakeKubernetesAPI, kubeconfig: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "127.0.0.1")
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", "1")
    api.add_pod("tf-0", {"job-name": "tensorflow"}, pod_ip="10.0.0.4")

    resolver = KubernetesClusterResolver(
        executable_location=KubernetesExecutableLocation.OFF_CLUSTER,
        service_account_dir=tmp_path / "unused",
    )

    assert resolver.config_source == "kubeconfig"
    assert resolver.cluster_spec().as_dict() == {"worker": ["10.0.0.4:8470"]}


def test_in_cluster_without_service_account_files_says_where_it_looked(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.96.0.1")
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", "443")
    with pytest.raises(ConfigException) as info:
        KubernetesClusterResolver(service_account_dir=tmp_path / "sa")
    message = str(info.value)
    assert "10.96.0.1:443" in message and str(tmp_path / "sa" / "token") in message
    assert "OFF_CLUSTER" in message


def test_override_client_is_used_without_loading_any_config(api: FakeKubernetesAPI) -> None:
    # KUBECONFIG points at a missing file (fixture): loading it would raise.
    configuration = client.Configuration(host=api.url)
    # Clients up to 28 read the "authorization" key, later ones "BearerToken".
    configuration.api_key = {"authorization": TOKEN, "BearerToken": TOKEN}
    configuration.api_key_prefix = {"authorization": "Bearer", "BearerToken": "Bearer"}
    api.add_pod("tf-0", {"job-name": "tensorflow"}, pod_ip="10.0.0.8")

    resolver = KubernetesClusterResolver(
        override_client=client.CoreV1Api(client.ApiClient(configuration))
    )

    assert resolver.config_source == "override"
    assert resolver.cluster_spec().as_dict() == {"worker": ["10.0.0.8:8470"]}
    assert api.requests[0].authorization == f"Bearer {TOKEN}"


def test_a_single_selector_string_is_accepted(api: FakeKubernetesAPI, kubeconfig: Path) -> None:
    api.add_pod("p", {"app": "x"}, pod_ip="10.0.0.1")
    spec = KubernetesClusterResolver({"worker": "app=x"}).cluster_spec()
    assert spec.as_dict() == {"worker": ["10.0.0.1:8470"]}


@pytest.mark.parametrize(
    ("kwargs", "error", "pattern"),
    [
        ({"tf_server_port": 0}, ValueError, r"1\.\.65535; got 0"),
        ({"tf_server_port": "8470"}, TypeError, r"must be an int; got '8470'"),
        ({"executable_location": "inside"}, ValueError, r"WITHIN_CLUSTER.*got 'inside'"),
        ({"job_to_label_mapping": [("worker", "a=b")]}, TypeError, r"dict of job name"),
        ({"job_to_label_mapping": {"worker": [""]}}, TypeError, r"\['worker'\].*got \[''\]"),
        ({"timeout": 0}, ValueError, r"positive number of seconds; got 0"),
        ({"namespace": ""}, ValueError, r"non-empty str or None; got ''"),
    ],
)
def test_bad_arguments(kwargs: dict[str, object], error: type, pattern: str) -> None:
    with pytest.raises(error, match=pattern):
        KubernetesClusterResolver(**kwargs)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("selector", "matches"),
    [
        ("", True),
        ("app=web", True),
        ("app==web", True),
        ("app=db", False),
        ("app!=db", True),
        ("tier", True),
        ("!tier", False),
        ("!missing", True),
        ("app in (web, db),tier notin (cache)", True),
        ("app notin (web)", False),
        ("app=web,tier=cache", False),
    ],
)
def test_fake_server_selector_semantics(selector: str, matches: bool) -> None:
    # The fake must filter as the real API server does, or the tests above prove nothing.
    assert selector_matches(selector, {"app": "web", "tier": "front"}) is matches


def test_fake_server_rejects_malformed_selector(api: FakeKubernetesAPI, kubeconfig: Path) -> None:
    with pytest.raises(RuntimeError, match=r"400 Bad Request.*unable to parse requirement"):
        KubernetesClusterResolver({"worker": ["app in (a"]}).cluster_spec()
