"""resolve()/explain(): each simulated environment is picked with the right values and says
where they came from; overrides win; a bare machine lists what was tried without touching
the network."""

from __future__ import annotations

import json
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from jaxcluster.cluster_resolver import (
    KubernetesClusterResolver,
    SageMakerClusterResolver,
    SimpleClusterResolver,
    SlurmClusterResolver,
    TFConfigClusterResolver,
    explain,
    resolve,
)
from jaxcluster.cluster_resolver._cloud_environments import GceTpuVmEnvironment
from jaxcluster.cluster_resolver.detect import ENVIRONMENTS, NoClusterEnvironmentError
from support.cluster_env import clear_cluster_env
from support.gce_metadata import FakeMetadataServer, tpu_vm_attributes
from support.k8s_api import FakeKubernetesAPI, incluster_env

TF_CONFIG = {
    "cluster": {"chief": ["c0:2222"], "worker": ["w0:2222", "w1:2222"]},
    "task": {"type": "worker", "index": 1},
}


@pytest.fixture(autouse=True)
def _bare_env(monkeypatch: pytest.MonkeyPatch) -> None:
    clear_cluster_env(monkeypatch)


def _slurm(monkeypatch: pytest.MonkeyPatch, rank: int = 3) -> None:
    monkeypatch.setenv("SLURM_JOB_ID", "77")
    monkeypatch.setenv("SLURM_PROCID", str(rank))
    monkeypatch.setenv("SLURM_STEP_NUM_TASKS", "4")
    monkeypatch.setenv("SLURM_STEP_NODELIST", "n[1-2]")
    monkeypatch.setenv("SLURM_STEP_TASKS_PER_NODE", "2(x2)")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")  # no GPUs, and no nvidia-smi probe


# Network activity seen by the audit hook while _watch is on. Audit hooks cannot be removed,
# so one hook is installed for the session and gated by this flag.
_NETWORK_EVENTS: list[tuple[str, object]] = []
_WATCH = threading.Event()


def _audit(event: str, args: tuple[object, ...]) -> None:
    if _WATCH.is_set() and event in ("socket.connect", "socket.getaddrinfo", "socket.bind"):
        _NETWORK_EVENTS.append((event, args))


sys.addaudithook(_audit)


@pytest.fixture
def no_network() -> Iterator[list[tuple[str, object]]]:
    _NETWORK_EVENTS.clear()
    _WATCH.set()
    try:
        yield _NETWORK_EVENTS
    finally:
        _WATCH.clear()


def test_environment_order_is_the_documented_one() -> None:
    assert [env.name for env in ENVIRONMENTS] == [
        "tf_config",
        "slurm",
        "kubernetes",
        "gke_tpu",
        "gce_tpu_vm",
        "sagemaker",
        "ompi",
        "explicit",
    ]


def test_bare_machine_lists_every_environment_tried_without_network(
    no_network: list[tuple[str, object]],
) -> None:
    started = time.monotonic()
    with pytest.raises(NoClusterEnvironmentError) as info:
        resolve()
    report = explain()
    elapsed = time.monotonic() - started

    assert not no_network, f"detection touched the network: {no_network}"
    assert elapsed < 5.0  # sanity bound: no DNS or metadata timeouts hide in detection
    assert isinstance(info.value, RuntimeError)
    message = str(info.value)
    for env in ENVIRONMENTS:
        assert f"- {env.name} ({env.title}): " in message
    assert "TF_CONFIG is not set" in message and "JAXCLUSTER_WORKERS is not set" in message
    assert [c.name for c in info.value.checks] == [e.name for e in ENVIRONMENTS]
    assert report.environment is None and report.resolver is None
    assert report.error is not None and "no cluster environment detected" in report.error
    assert not any(c.detected for c in report.checks)


def test_tf_config_is_picked_with_provenance(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TF_CONFIG", json.dumps(TF_CONFIG))

    resolver = resolve()
    report = explain()

    assert isinstance(resolver, TFConfigClusterResolver)
    assert (resolver.task_type, resolver.task_id) == ("worker", 1)
    assert report.environment == "tf_config" and report.checks[0].chosen
    assert str(report.value("task_id")) == "task_id=1 from TF_CONFIG task.index"
    assert report.value("cluster_spec").value == TF_CONFIG["cluster"]
    assert report.value("master").value == "w1:2222"
    assert report.value("jax_distributed_args").value == {
        "coordinator_address": "c0:2222",
        "num_processes": 3,
        "process_id": 2,
    }
    assert "task_id=1 from TF_CONFIG task.index" in str(report)


def test_overrides_win_and_are_credited(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TF_CONFIG", json.dumps(TF_CONFIG))

    resolver = resolve(task_type="chief", task_id=0, rpc_layer="grpc")
    report = explain(task_type="chief", task_id=0, rpc_layer="grpc")

    assert (resolver.task_type, resolver.task_id, resolver.rpc_layer) == ("chief", 0, "grpc")
    assert str(report.value("task_type")) == "task_type='chief' from override task_type='chief'"
    assert report.value("master").value == "grpc://c0:2222"
    assert report.value("jax_distributed_args").value["process_id"] == 0


def test_unknown_override_names_resolver_and_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TF_CONFIG", json.dumps(TF_CONFIG))
    with pytest.raises(TypeError, match=r"'port_base'.*TFConfigClusterResolver.*'tf_config'"):
        resolve(port_base=9000)


def test_tf_config_without_cluster_is_not_a_cluster(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TF_CONFIG", json.dumps({"task": {"type": "worker", "index": 0}}))
    report = explain()
    assert report.environment is None
    assert "has no 'cluster'" in report.checks[0].reason


def test_malformed_tf_config_is_detected_and_reported(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TF_CONFIG", '{"cluster": ')
    with pytest.raises(ValueError, match="TF_CONFIG is not valid JSON"):
        resolve()
    report = explain()
    assert report.environment == "tf_config"
    assert report.error is not None and "TF_CONFIG is not valid JSON" in report.error


def test_slurm_step_is_picked_with_provenance(monkeypatch: pytest.MonkeyPatch) -> None:
    _slurm(monkeypatch, rank=3)

    resolver = resolve()
    report = explain()

    assert isinstance(resolver, SlurmClusterResolver)
    assert resolver.cluster_spec().as_dict() == {
        "worker": ["n1:8888", "n1:8889", "n2:8888", "n2:8889"]
    }
    assert (resolver.task_type, resolver.task_id) == ("worker", 3)
    assert str(report.value("task_id")) == "task_id=3 from SLURM_PROCID=3"
    assert "SLURM_STEP_NODELIST='n[1-2]'" in report.value("cluster_spec").source
    assert report.value("master").value == "grpc://n2:8889"


def test_constructor_override_reaches_the_resolver(monkeypatch: pytest.MonkeyPatch) -> None:
    _slurm(monkeypatch, rank=0)
    report = explain(port_base=9000, jobs={"ps": 1, "worker": 3})
    assert report.value("cluster_spec").value == {
        "ps": ["n1:9000"],
        "worker": ["n1:9001", "n2:9000", "n2:9001"],
    }
    assert "with override port_base=9000" in report.value("cluster_spec").source
    assert report.value("task_type").value == "ps"


def test_slurm_job_without_a_step_says_to_use_srun(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SLURM_JOB_ID", "77")
    report = explain()
    slurm = next(c for c in report.checks if c.name == "slurm")
    assert not slurm.detected and "job 77" in slurm.reason and "srun" in slurm.reason


def test_earlier_environment_wins_and_environment_selects(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TF_CONFIG", json.dumps(TF_CONFIG))
    _slurm(monkeypatch)

    assert isinstance(resolve(), TFConfigClusterResolver)
    assert isinstance(resolve(environment="slurm"), SlurmClusterResolver)
    report = explain(environment="slurm")
    assert report.why == "chosen by environment="
    assert [c.name for c in report.checks if c.detected] == ["tf_config", "slurm"]
    assert [c.name for c in report.checks if c.chosen] == ["slurm"]

    monkeypatch.setenv("JAXCLUSTER_ENVIRONMENT", "slurm")
    assert isinstance(resolve(), SlurmClusterResolver)
    assert explain().why == "chosen by JAXCLUSTER_ENVIRONMENT"


def test_unknown_environment_name_suggests_one() -> None:
    with pytest.raises(ValueError, match=r"'slrum' is not a known.*did you mean 'slurm'"):
        resolve(environment="slrum")


def test_sagemaker(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SM_HOSTS", json.dumps(["algo-2", "algo-1"]))
    monkeypatch.setenv("SM_CURRENT_HOST", "algo-2")

    resolver = resolve()
    report = explain()

    assert isinstance(resolver, SageMakerClusterResolver)
    assert resolver.cluster_spec().as_dict() == {"worker": ["algo-1:2223", "algo-2:2223"]}
    assert report.value("task_id").value == 1
    assert "SM_CURRENT_HOST='algo-2'" in report.value("task_id").source


def test_explicit_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("JAXCLUSTER_WORKERS", "10.0.0.1:2222, 10.0.0.2:2222")
    monkeypatch.setenv("JAXCLUSTER_PS", "10.0.0.9:2300")
    monkeypatch.setenv("JAXCLUSTER_TASK_ID", "1")

    resolver = resolve()
    report = explain()

    assert isinstance(resolver, SimpleClusterResolver)
    assert resolver.cluster_spec().as_dict() == {
        "worker": ["10.0.0.1:2222", "10.0.0.2:2222"],
        "ps": ["10.0.0.9:2300"],
    }
    assert (resolver.task_type, resolver.task_id, resolver.rpc_layer) == ("worker", 1, "grpc")
    assert str(report.value("task_id")) == "task_id=1 from JAXCLUSTER_TASK_ID"
    assert "default 'worker'" in report.value("task_type").source
    assert report.value("master").value == "grpc://10.0.0.2:2222"

    monkeypatch.setenv("JAXCLUSTER_TASK_TYPE", "ps")
    monkeypatch.setenv("JAXCLUSTER_TASK_ID", "0")
    assert resolve().master("ps", 0) == "grpc://10.0.0.9:2300"


@pytest.mark.parametrize(
    ("name", "value", "pattern"),
    [
        ("JAXCLUSTER_WORKERS", "10.0.0.1", r"JAXCLUSTER_WORKERS entry '10\.0\.0\.1'"),
        ("JAXCLUSTER_WORKERS", "a:1,,b:2", r"comma-separated list of host:port"),
        ("JAXCLUSTER_WORKERS", "a:99999", r"port from 1 to 65535"),
        ("JAXCLUSTER_TASK_ID", "one", r"JAXCLUSTER_TASK_ID is 'one'"),
        ("JAXCLUSTER_TASK_TYPE", "chief", r"JAXCLUSTER_TASK_TYPE is 'chief'.*worker"),
    ],
)
def test_explicit_variables_bad_values(
    monkeypatch: pytest.MonkeyPatch, name: str, value: str, pattern: str
) -> None:
    monkeypatch.setenv("JAXCLUSTER_WORKERS", "a:1,b:2")
    monkeypatch.setenv(name, value)
    with pytest.raises(ValueError, match=pattern):
        resolve()


def test_open_mpi_with_worker_list(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OMPI_COMM_WORLD_SIZE", "2")
    monkeypatch.setenv("OMPI_COMM_WORLD_RANK", "1")
    monkeypatch.setenv("JAXCLUSTER_WORKERS", "h0:5000,h1:5000")

    report = explain()

    assert report.environment == "ompi"  # before the explicit environment in the order
    assert str(report.value("task_id")) == "task_id=1 from OMPI_COMM_WORLD_RANK"
    assert report.value("jax_distributed_args").value == {
        "coordinator_address": "h0:5000",
        "num_processes": 2,
        "process_id": 1,
    }


def test_open_mpi_coordinator_from_mpirun_launcher(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OMPI_COMM_WORLD_SIZE", "4")
    monkeypatch.setenv("OMPI_COMM_WORLD_RANK", "2")
    monkeypatch.setenv("OMPI_MCA_orte_hnp_uri", "1531576320.0;tcp://10.96.0.1,10.148.0.1:34911")

    resolver = resolve()

    # Job id 1531576320 = 373920 * 2**12; 373920 % 4096 = 1184; 61440 + 1184 = 62624.
    # Only rank 0's address is known; the spec says so rather than inventing the others.
    assert resolver.cluster_spec().as_dict() == {"worker": ["10.96.0.1:62624"]}
    assert resolver.jax_distributed_args() == {
        "coordinator_address": "10.96.0.1:62624",
        "num_processes": 4,
        "process_id": 2,
    }
    assert "other ranks' addresses are unknown" in explain().value("cluster_spec").source

    monkeypatch.setenv("JAX_COORDINATOR_ADDRESS", "head:7000")
    assert resolve().jax_distributed_args()["coordinator_address"] == "head:7000"


def test_open_mpi_without_coordinator_says_what_to_set(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OMPI_COMM_WORLD_SIZE", "4")
    monkeypatch.setenv("OMPI_COMM_WORLD_RANK", "2")
    with pytest.raises(ValueError, match=r"rank 2 of 4.*JAXCLUSTER_WORKERS.*mpirun"):
        resolve()


def test_gke_tpu_hosts_in_order(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TPU_WORKER_HOSTNAMES", "tpu-w-0.svc,tpu-w-1.svc,tpu-w-2.svc")
    monkeypatch.setenv("TPU_WORKER_ID", "2")
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.96.0.1")  # GKE pods are pods too

    resolver = resolve()
    report = explain()

    assert report.environment == "gke_tpu"
    assert resolver.cluster_spec().as_dict() == {
        "worker": ["tpu-w-0.svc:8470", "tpu-w-1.svc:8470", "tpu-w-2.svc:8470"]
    }
    assert (resolver.task_type, resolver.task_id, resolver.environment) == ("worker", 2, "google")
    assert str(report.value("task_id")) == "task_id=2 from TPU_WORKER_ID"
    assert resolver.jax_distributed_args() == {
        "coordinator_address": "tpu-w-0.svc:8470",
        "num_processes": 3,
        "process_id": 2,
    }
    custom = resolve(port=8482)
    assert custom.cluster_spec().task_address("worker", 0) == "tpu-w-0.svc:8482"


def test_gke_tpu_process_addresses_and_missing_worker_id(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TPU_PROCESS_ADDRESSES", "10.1.0.1:8476,10.1.0.2:8476")
    with pytest.raises(ValueError, match="TPU_WORKER_ID is not set"):
        resolve()
    assert resolve(task_id=1).cluster_spec().as_dict() == {
        "worker": ["10.1.0.1:8476", "10.1.0.2:8476"]
    }
    monkeypatch.setenv("TPU_WORKER_ID", "5")
    with pytest.raises(ValueError, match=r"TPU_WORKER_ID is 5.*2 hosts"):
        resolve()


def _fake_vm(root: Path, product: str = "Google Compute Engine", accel: bool = True) -> Path:
    (root / "sys/class/dmi/id").mkdir(parents=True)
    (root / "sys/class/dmi/id/product_name").write_text(product + "\n")
    (root / "dev").mkdir()
    if accel:
        (root / "dev/accel0").write_text("")
    return root


def test_gce_tpu_vm_detection_is_local(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, no_network: list[tuple[str, object]]
) -> None:
    assert "unreadable" in GceTpuVmEnvironment(tmp_path / "none").detect().reason
    other = GceTpuVmEnvironment(_fake_vm(tmp_path / "aws", product="HVM domU")).detect()
    assert not other.present and "'HVM domU'" in other.reason
    plain = GceTpuVmEnvironment(_fake_vm(tmp_path / "gce", accel=False))
    assert not plain.detect().present and "without TPU devices" in plain.detect().reason
    monkeypatch.setenv("TPU_ACCELERATOR_TYPE", "v5litepod-8")
    assert plain.detect().present
    tpu = GceTpuVmEnvironment(_fake_vm(tmp_path / "tpu"))
    assert tpu.detect().present and "accel0" in tpu.detect().reason
    monkeypatch.setenv("TPU_SKIP_MDS_QUERY", "1")
    assert not tpu.detect().present
    assert not no_network


def test_gce_tpu_vm_builds_from_the_metadata_server(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    env = GceTpuVmEnvironment(_fake_vm(tmp_path))
    attributes = tpu_vm_attributes(["10.0.0.2", "10.0.0.3"], 1)
    with FakeMetadataServer(attributes=attributes) as md:
        monkeypatch.setenv("GCE_METADATA_HOST", md.host)
        report = explain(environments=(env,))
    assert report.environment == "gce_tpu_vm", report
    assert report.value("cluster_spec").value == {"worker": ["10.0.0.2:8470", "10.0.0.3:8470"]}
    assert str(report.value("task_id")) == "task_id=1 from GCE metadata agent-worker-number"


def test_kubernetes_needs_an_opt_in(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.96.0.1")
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", "443")
    report = explain()
    k8s = next(c for c in report.checks if c.name == "kubernetes")
    assert not k8s.detected and "JAXCLUSTER_K8S_SELECTOR" in k8s.reason
    assert report.environment is None


def test_kubernetes_pod_finds_its_own_task(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with FakeKubernetesAPI(token="sa", tls=True) as api:
        api.add_pod("trainer-1", {"app": "trainer"}, pod_ip="10.4.0.2")
        api.add_pod("trainer-0", {"app": "trainer"}, pod_ip="10.4.0.1")
        api.add_pod("trainer-x", {"app": "trainer"}, namespace="other", pod_ip="10.9.9.9")
        for name, value in incluster_env(tmp_path / "sa", api).items():
            monkeypatch.setenv(name, value)
        monkeypatch.setenv("JAXCLUSTER_K8S_SELECTOR", "app=trainer")
        monkeypatch.setenv("HOSTNAME", "trainer-1")

        resolver = resolve(service_account_dir=tmp_path / "sa", tf_server_port=2222)
        report = explain(service_account_dir=tmp_path / "sa", tf_server_port=2222)

        assert isinstance(resolver, KubernetesClusterResolver)
        assert resolver.config_source == "in-cluster"
        assert resolver.namespace == "default"  # the pod's own, from the service account
        assert resolver.cluster_spec().as_dict() == {"worker": ["10.4.0.1:2222", "10.4.0.2:2222"]}
        assert (resolver.task_type, resolver.task_id) == ("worker", 1)
        assert "'trainer-1'" in report.value("task_id").source
        assert report.value("master").value == "grpc://10.4.0.2:2222"
        assert {r.path for r in api.requests} == {"/api/v1/namespaces/default/pods"}
