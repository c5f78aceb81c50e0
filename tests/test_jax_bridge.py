"""jax_distributed_args for each env resolver, and real two-process jax.distributed start-ups."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap

import pytest

from jaxcluster.cluster_resolver import (
    SageMakerClusterResolver,
    SimpleClusterResolver,
    SlurmClusterResolver,
    TFConfigClusterResolver,
    UnionClusterResolver,
)
from jaxcluster.distributed import initialize

_DEADLINE_S = 180
_CLUSTER_VARS = ("TF_CONFIG", "SLURM_", "SM_", "TPU_", "KUBERNETES_", "OMPI_", "JAX", "CUDA_")


def test_args_simple_and_union():
    simple = SimpleClusterResolver(
        {"worker": ["w0:1", "w1:1"], "chief": ["c:9"]}, task_type="worker", task_id=1
    )
    assert simple.jax_distributed_args() == {
        "coordinator_address": "c:9",
        "num_processes": 3,
        "process_id": 2,
    }
    extra = SimpleClusterResolver({"worker": ["w2:1"]})
    union = UnionClusterResolver(simple, extra, task_id=2)
    assert union.jax_distributed_args(coordinator_port=77) == {
        "coordinator_address": "c:77",
        "num_processes": 4,
        "process_id": 3,
    }


def test_args_tfconfig(monkeypatch):
    monkeypatch.setenv(
        "TF_CONFIG",
        json.dumps(
            {"cluster": {"ps": ["p:1"], "worker": ["w:1"]}, "task": {"type": "worker", "index": 0}}
        ),
    )
    assert TFConfigClusterResolver().jax_distributed_args() == {
        "coordinator_address": "p:1",
        "num_processes": 2,
        "process_id": 1,
    }


def test_args_sagemaker(monkeypatch):
    monkeypatch.setenv("SM_HOSTS", '["algo-2", "algo-1"]')
    monkeypatch.setenv("SM_CURRENT_HOST", "algo-2")
    monkeypatch.setenv("JAX_COORDINATOR_PORT", "4000")
    assert SageMakerClusterResolver().jax_distributed_args() == {
        "coordinator_address": "algo-1:4000",
        "num_processes": 2,
        "process_id": 1,
    }


def test_args_slurm(monkeypatch):
    for name, value in {
        "SLURM_PROCID": "2",
        "SLURM_STEP_NUM_TASKS": "3",
        "SLURM_STEP_NODELIST": "n[9-10]",
        "SLURM_STEP_TASKS_PER_NODE": "2,1",
        "CUDA_VISIBLE_DEVICES": "",
    }.items():
        monkeypatch.setenv(name, value)
    assert SlurmClusterResolver(port_base=5000).jax_distributed_args() == {
        "coordinator_address": "n9:5000",
        "num_processes": 3,
        "process_id": 2,
    }


def test_initialize_rejects_resolver_arguments_with_an_explicit_resolver():
    resolver = SimpleClusterResolver({"worker": ["a:1"]})
    with pytest.raises(TypeError, match="unexpected arguments \\['task_type'\\]"):
        initialize(resolver, task_type="worker")


def _free_ports(count):
    sockets = [socket.socket() for _ in range(count)]
    try:
        for sock in sockets:
            sock.bind(("127.0.0.1", 0))
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


# Each process starts jax.distributed through jaxcluster, then proves the link is real by
# gathering every process's index.
_CHILD = textwrap.dedent(
    """
    import json, sys
    import jax
    import numpy as np
    from jax.experimental import multihost_utils
    from jaxcluster.cluster_resolver import SlurmClusterResolver, TFConfigClusterResolver
    from jaxcluster.distributed import initialize

    kind, extra = sys.argv[1], json.loads(sys.argv[2])
    if kind == "tfconfig":
        resolver = TFConfigClusterResolver()
    elif kind == "slurm":
        resolver = SlurmClusterResolver(port_base=extra.pop("port_base"))
    elif kind == "detect":  # resolver=None: jaxcluster.cluster_resolver.resolve() finds TF_CONFIG
        resolver = None
    else:  # everything explicit: nothing to resolve
        resolver = None
        extra["process_id"] = int(sys.argv[3])
    args = initialize(resolver, initialization_timeout=120, **extra)
    assert jax.process_count() == 2, jax.process_count()
    gathered = multihost_utils.process_allgather(np.array([jax.process_index()]))
    print(json.dumps({"args": args, "process_count": jax.process_count(),
                      "process_index": jax.process_index(),
                      "gathered": np.asarray(gathered).ravel().tolist()}))
    jax.distributed.shutdown()
    """
)


def _run_pair(kind, envs, extra, tmp_path):
    # Output goes to files, not pipes: a child blocked on a full pipe would stall its peer.
    processes = []
    for rank, env in enumerate(envs):
        # Only the variables this test sets may describe a cluster to the child.
        inherited = {k: v for k, v in os.environ.items() if not k.startswith(_CLUSTER_VARS)}
        full_env = {**inherited, "JAX_PLATFORMS": "cpu", **env}
        out = open(tmp_path / f"out{rank}", "w+")  # noqa: SIM115 - closed below
        err = open(tmp_path / f"err{rank}", "w+")  # noqa: SIM115 - closed below
        process = subprocess.Popen(
            [sys.executable, "-c", _CHILD, kind, json.dumps(extra), str(rank)],
            env=full_env,
            stdout=out,
            stderr=err,
            text=True,
        )
        processes.append((process, out, err))
    results = []
    try:
        for process, out, err in processes:
            process.wait(timeout=_DEADLINE_S)
            out.seek(0)
            err.seek(0)
            stdout, stderr = out.read(), err.read()
            assert process.returncode == 0, f"child failed:\n{stderr[-3000:]}"
            lines = [line for line in stdout.splitlines() if line.startswith("{")]
            assert lines, f"no result line in output:\n{stdout}\n{stderr[-3000:]}"
            results.append(json.loads(lines[-1]))
    finally:
        for process, out, err in processes:
            if process.poll() is None:
                process.kill()
                process.wait()
            out.close()
            err.close()
    return results


@pytest.mark.timeout(2 * _DEADLINE_S + 30)
def test_two_processes_initialize_from_tf_config(tmp_path):
    task_ports = _free_ports(2)
    coordinator_port = _free_ports(1)[0]
    cluster = {"worker": [f"127.0.0.1:{port}" for port in task_ports]}
    envs = [
        {"TF_CONFIG": json.dumps({"cluster": cluster, "task": {"type": "worker", "index": i}})}
        for i in range(2)
    ]
    results = _run_pair("tfconfig", envs, {"coordinator_port": coordinator_port}, tmp_path)
    for index, result in enumerate(results):
        assert result["process_count"] == 2
        assert result["process_index"] == index
        assert result["gathered"] == [0, 1]
        assert result["args"]["coordinator_address"] == f"127.0.0.1:{coordinator_port}"
        assert result["args"]["process_id"] == index


@pytest.mark.timeout(2 * _DEADLINE_S + 30)
def test_two_processes_initialize_from_slurm_variables(tmp_path):
    port_base = _free_ports(1)[0]
    envs = [
        {
            "SLURM_PROCID": str(rank),
            "SLURM_STEP_NUM_TASKS": "2",
            "SLURM_STEP_NODELIST": "127.0.0.1",
            "SLURM_STEP_TASKS_PER_NODE": "2",
            "CUDA_VISIBLE_DEVICES": "",
        }
        for rank in range(2)
    ]
    results = _run_pair("slurm", envs, {"port_base": port_base}, tmp_path)
    for rank, result in enumerate(results):
        assert result["process_count"] == 2
        assert result["process_index"] == rank
        assert result["gathered"] == [0, 1]
        assert result["args"] == {
            "coordinator_address": f"127.0.0.1:{port_base}",
            "num_processes": 2,
            "process_id": rank,
            "initialization_timeout": 120,
        }


@pytest.mark.timeout(2 * _DEADLINE_S + 30)
def test_explicit_arguments_need_no_resolver_and_take_the_port(tmp_path):
    port = _free_ports(1)[0]
    extra = {"coordinator_address": "127.0.0.1:1", "num_processes": 2, "coordinator_port": port}
    results = _run_pair("explicit", [{}, {}], extra, tmp_path)
    for rank, result in enumerate(results):
        assert result["gathered"] == [0, 1]
        assert result["args"]["coordinator_address"] == f"127.0.0.1:{port}"
        assert result["args"]["process_id"] == rank


@pytest.mark.timeout(2 * _DEADLINE_S + 30)
def test_two_processes_initialize_with_detected_environment(tmp_path):
    task_ports = _free_ports(2)
    cluster = {"chief": [f"127.0.0.1:{task_ports[0]}"], "worker": [f"127.0.0.1:{task_ports[1]}"]}
    envs = [
        {"TF_CONFIG": json.dumps({"cluster": cluster, "task": task})}
        for task in ({"type": "chief", "index": 0}, {"type": "worker", "index": 0})
    ]
    results = _run_pair("detect", envs, {}, tmp_path)
    for rank, result in enumerate(results):
        assert result["gathered"] == [0, 1]
        assert result["args"]["coordinator_address"] == f"127.0.0.1:{task_ports[0]}"
        assert result["args"]["process_id"] == rank
