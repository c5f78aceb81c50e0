"""TPUClusterResolver(tpu='local') on and off a simulated TPU VM, and connect()."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from collections.abc import Iterator

import pytest

from jaxcluster.cluster_resolver import TPUClusterResolver
from jaxcluster.cluster_spec import ClusterSpec
from jaxcluster.errors import UnavailableError
from support.cluster_env import bare_env, clear_cluster_env
from support.gce_metadata import FakeMetadataServer, tpu_vm_attributes


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    clear_cluster_env(monkeypatch)
    monkeypatch.delenv("GCE_METADATA_TIMEOUT", raising=False)


@pytest.fixture
def metadata(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeMetadataServer]:
    with FakeMetadataServer() as server:
        monkeypatch.setenv("GCE_METADATA_HOST", server.host)
        yield server


# -- tpu='local' ----------------------------------------------------------------------------------


def test_local_off_a_tpu_vm() -> None:
    resolver = TPUClusterResolver(tpu="local")
    assert resolver.cluster_spec() == ClusterSpec({})
    assert resolver.master() == ""
    assert resolver.task_id == 0


def test_local_on_a_gce_vm_without_tpu(metadata: FakeMetadataServer) -> None:
    resolver = TPUClusterResolver(tpu="local")
    assert not resolver.cluster_spec()
    assert resolver.master() == ""
    assert "/computeMetadata/v1/instance/attributes/accelerator-type" in metadata.paths()


@pytest.mark.parametrize("fmt", ["triples", "ips"])
def test_local_on_a_multi_host_tpu_vm(metadata: FakeMetadataServer, fmt: str) -> None:
    hosts = ["10.164.0.7", "10.164.0.3", "10.164.0.5"]
    metadata.attributes.update(tpu_vm_attributes(hosts, 2, fmt=fmt, topology="2x2x3"))
    resolver = TPUClusterResolver(tpu="local")
    assert resolver.cluster_spec() == ClusterSpec({"worker": [f"{h}:8470" for h in hosts]})
    assert resolver.task_id == 2
    assert resolver.master() == "grpc://10.164.0.5:8470"
    assert resolver.jax_distributed_args() == {
        "coordinator_address": "10.164.0.7:8470",
        "num_processes": 3,
        "process_id": 2,
    }
    resolver.task_id = 0  # an explicit override wins over agent-worker-number
    assert resolver.jax_distributed_args()["process_id"] == 0


def test_local_on_a_single_host_tpu_vm(metadata: FakeMetadataServer) -> None:
    metadata.attributes.update(tpu_vm_attributes(["10.164.0.7"], 0, accelerator_type="v5e-8"))
    resolver = TPUClusterResolver(tpu="local")
    assert resolver.cluster_spec() == ClusterSpec({})
    assert resolver.master() == ""


def test_local_with_bad_worker_endpoints(metadata: FakeMetadataServer) -> None:
    metadata.attributes.update(tpu_vm_attributes(["10.0.0.1", "10.0.0.2"], 0))
    metadata.attributes["worker-network-endpoints"] = "junk:10.0.0.1"
    with pytest.raises(ValueError, match=r"'junk:10\.0\.0\.1'"):
        TPUClusterResolver(tpu="local").cluster_spec()


def test_local_with_garbage_metadata(metadata: FakeMetadataServer) -> None:
    metadata.garbage = True
    with pytest.raises(UnavailableError, match="Metadata-Flavor"):
        TPUClusterResolver(tpu="local").cluster_spec()


def test_local_counts_jax_devices() -> None:
    import jax

    resolver = TPUClusterResolver(tpu="local")
    tpus = sum(1 for d in jax.devices() if d.platform == "tpu")
    assert resolver.num_accelerators() == {"TPU": tpus}


# -- context manager and connect -----------------------------------------------------------------


def test_with_statement_gives_the_resolver() -> None:
    with TPUClusterResolver("grpc://10.0.0.1") as resolver:
        assert isinstance(resolver, TPUClusterResolver)
        assert resolver.master() == "grpc://10.0.0.1:8470"


def test_connect_single_host_does_not_start_jax_distributed() -> None:
    import jax

    resolver = TPUClusterResolver("grpc://10.0.0.1")
    assert resolver.connect() is resolver
    assert not jax.distributed.is_initialized()
    static = TPUClusterResolver.connect("grpc://10.0.0.3:8471")
    assert isinstance(static, TPUClusterResolver)
    assert static.master() == "grpc://10.0.0.3:8471"


_CONNECT_SCRIPT = """
import json, jax
from jaxcluster.cluster_resolver import TPUClusterResolver
with TPUClusterResolver(tpu="local").connect() as resolver:
    state = {"task_id": resolver.task_id, "count": jax.process_count(),
             "index": jax.process_index(), "up": jax.distributed.is_initialized()}
state["up_after_exit"] = jax.distributed.is_initialized()
print(json.dumps(state))
"""


def test_connect_initialises_jax_distributed_on_a_multi_host_tpu_vm() -> None:
    """Two processes, each on its own simulated TPU VM host (its own metadata server), connect
    to each other through jax.distributed with the first host as coordinator."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    hosts = ["127.0.0.1", "127.0.0.1"]
    servers = [
        FakeMetadataServer(attributes=tpu_vm_attributes(hosts, worker)).start() for worker in (0, 1)
    ]
    try:
        procs = []
        for server in servers:
            env = bare_env()
            env.update(
                GCE_METADATA_HOST=server.host, JAX_COORDINATOR_PORT=str(port), JAX_PLATFORMS="cpu"
            )
            procs.append(
                subprocess.Popen(
                    [sys.executable, "-c", _CONNECT_SCRIPT],
                    env=env,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    text=True,
                )
            )
        results = []
        for proc in procs:
            try:
                out, err = proc.communicate(timeout=180)
            except subprocess.TimeoutExpired:
                for p in procs:
                    p.kill()
                raise
            assert proc.returncode == 0, err[-2000:]
            results.append(json.loads(out.strip().splitlines()[-1]))
    finally:
        for server in servers:
            server.stop()
    for worker, state in enumerate(results):
        assert state == {
            "task_id": worker,
            "count": 2,
            "index": worker,
            "up": True,
            "up_after_exit": False,
        }


def test_tpu_name_local_means_this_vm(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TPU_NAME", "local")
    resolver = TPUClusterResolver()
    assert resolver.cluster_spec() == ClusterSpec({})
    assert resolver.master() == ""
