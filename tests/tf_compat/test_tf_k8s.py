"""TF 2.21 ``distribute/cluster_resolver/kubernetes_cluster_resolver_test.py``: every behaviour
it asserts, asserted against jaxcluster's ``KubernetesClusterResolver``. TF hands in a mock
client; here the official client talks to a local API server. TF's tasks are the pods'
``host_ip``; jaxcluster's default is the pod IP (see docs/porting.md's differences), so these tests
pass ``use_host_ip=True`` to compare like with like."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from kubernetes import client

from jaxcluster.cluster_resolver import (
    KubernetesClusterResolver,
    KubernetesExecutableLocation,
)
from support.cluster_defs import assert_cluster_def
from support.cluster_env import clear_cluster_env
from support.k8s_api import FakeKubernetesAPI, write_kubeconfig


@pytest.fixture(autouse=True)
def _bare_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    clear_cluster_env(monkeypatch)
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "no-such-kubeconfig"))


@pytest.fixture
def api(tmp_path: Path) -> Iterator[FakeKubernetesAPI]:
    with FakeKubernetesAPI() as server:
        yield server


@pytest.fixture
def core_v1(api: FakeKubernetesAPI, tmp_path: Path) -> client.CoreV1Api:
    """A client of the local server, handed in as TF's tests hand in theirs."""
    configuration = client.Configuration()
    configuration.host = api.url
    return client.CoreV1Api(client.ApiClient(configuration))


def _pods(api: FakeKubernetesAPI, label: str, *pods: tuple[str, str, str]) -> None:
    for name, phase, host_ip in pods:
        api.add_pod(name, {"job-name": label}, phase=phase, host_ip=host_ip, pod_ip="10.9.9.9")


def test_one_pod_in_cluster(api: FakeKubernetesAPI, core_v1: client.CoreV1Api) -> None:
    _pods(api, "tensorflow", ("tensorflow-abc123", "Running", "10.1.2.3"))
    resolver = KubernetesClusterResolver(
        override_client=core_v1,
        executable_location=KubernetesExecutableLocation.WITHIN_CLUSTER,
        use_host_ip=True,
    )
    assert_cluster_def(resolver.cluster_spec(), {"worker": {0: "10.1.2.3:8470"}})


def test_executable_location_must_be_one_of_the_enum() -> None:
    with pytest.raises(ValueError):
        KubernetesClusterResolver(executable_location=None)  # type: ignore[arg-type]


def test_one_pod(api: FakeKubernetesAPI, core_v1: client.CoreV1Api) -> None:
    _pods(api, "tensorflow", ("tensorflow-abc123", "Running", "10.1.2.3"))
    resolver = KubernetesClusterResolver(override_client=core_v1, use_host_ip=True)
    assert_cluster_def(resolver.cluster_spec(), {"worker": {0: "10.1.2.3:8470"}})


def test_pods_are_sorted_by_name(api: FakeKubernetesAPI, core_v1: client.CoreV1Api) -> None:
    _pods(
        api,
        "tensorflow",
        ("tensorflow-abc123", "Running", "10.1.2.3"),
        ("tensorflow-def456", "Running", "10.1.2.4"),
        ("tensorflow-999999", "Running", "10.1.2.5"),
    )
    resolver = KubernetesClusterResolver(override_client=core_v1, use_host_ip=True)
    assert_cluster_def(
        resolver.cluster_spec(),
        {"worker": {0: "10.1.2.5:8470", 1: "10.1.2.3:8470", 2: "10.1.2.4:8470"}},
    )


def test_master_with_task_set(api: FakeKubernetesAPI, core_v1: client.CoreV1Api) -> None:
    _pods(
        api,
        "tensorflow",
        ("worker-0", "Running", "10.1.2.3"),
        ("worker-1", "Running", "10.1.2.4"),
        ("worker-2", "Running", "10.1.2.5"),
    )
    resolver = KubernetesClusterResolver(override_client=core_v1, use_host_ip=True)
    resolver.task_type, resolver.task_id = "worker", 0
    assert (resolver.task_type, resolver.task_id) == ("worker", 0)
    assert resolver.master() == "grpc://10.1.2.3:8470"
    assert resolver.master("worker", 2) == "grpc://10.1.2.5:8470"


def test_a_pod_not_running_is_a_runtime_error(
    api: FakeKubernetesAPI, core_v1: client.CoreV1Api
) -> None:
    _pods(api, "tensorflow", ("tensorflow-abc123", "Failed", "10.1.2.3"))
    resolver = KubernetesClusterResolver(override_client=core_v1, use_host_ip=True)
    # TF's test matches TF's sentence exactly; the namespace and selector follow it.
    tf_words = 'Pod "tensorflow-abc123" is not running; phase: "Failed"'
    with pytest.raises(RuntimeError, match=tf_words):
        resolver.cluster_spec()


def test_several_selectors_and_jobs(api: FakeKubernetesAPI, core_v1: client.CoreV1Api) -> None:
    _pods(
        api,
        "worker1",
        ("tensorflow-abc123", "Running", "10.1.2.3"),
        ("tensorflow-def456", "Running", "10.1.2.4"),
        ("tensorflow-999999", "Running", "10.1.2.5"),
    )
    _pods(
        api,
        "worker2",
        ("tensorflow-abc124", "Running", "10.1.2.6"),
        ("tensorflow-def457", "Running", "10.1.2.7"),
        ("tensorflow-999990", "Running", "10.1.2.8"),
    )
    _pods(
        api,
        "ps",
        ("tensorflow-ps-1", "Running", "10.1.2.1"),
        ("tensorflow-ps-2", "Running", "10.1.2.2"),
    )
    resolver = KubernetesClusterResolver(
        job_to_label_mapping={
            "worker": ["job-name=worker1", "job-name=worker2"],
            "ps": ["job-name=ps"],
        },
        override_client=core_v1,
        use_host_ip=True,
    )
    workers = ["10.1.2.5", "10.1.2.3", "10.1.2.4", "10.1.2.8", "10.1.2.6", "10.1.2.7"]
    assert_cluster_def(
        resolver.cluster_spec(),
        {
            "ps": {0: "10.1.2.1:8470", 1: "10.1.2.2:8470"},
            "worker": {i: f"{ip}:8470" for i, ip in enumerate(workers)},
        },
    )


def test_default_address_is_the_pod_ip(
    api: FakeKubernetesAPI, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The deliberate difference: without ``use_host_ip`` the task is the pod, not its node."""
    _pods(api, "tensorflow", ("tensorflow-abc123", "Running", "10.1.2.3"))
    monkeypatch.setenv("KUBECONFIG", str(write_kubeconfig(tmp_path / "kubeconfig", api)))
    spec = KubernetesClusterResolver().cluster_spec()
    assert spec.job_tasks("worker") == ["10.9.9.9:8470"]
