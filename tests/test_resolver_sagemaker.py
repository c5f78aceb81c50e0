"""SageMakerClusterResolver: SM_HOSTS / SM_CURRENT_HOST with TF's semantics."""

from __future__ import annotations

import pytest

from jaxcluster.cluster_resolver import SageMakerClusterResolver


def _set(monkeypatch, hosts, current):
    monkeypatch.setenv("SM_HOSTS", hosts)
    monkeypatch.setenv("SM_CURRENT_HOST", current)


def test_hosts_sorted_into_worker_job(monkeypatch):
    _set(monkeypatch, '["algo-2", "algo-1", "algo-3"]', "algo-3")
    resolver = SageMakerClusterResolver()
    assert resolver.cluster_spec().as_dict() == {
        "worker": ["algo-1:2223", "algo-2:2223", "algo-3:2223"]
    }
    assert (resolver.task_type, resolver.task_id) == ("worker", 2)
    assert resolver.master() == "algo-3:2223"
    assert resolver.master("worker", 0, rpc_layer="grpc") == "grpc://algo-1:2223"
    assert resolver.jax_distributed_args(coordinator_port=1234) == {
        "coordinator_address": "algo-1:1234",
        "num_processes": 3,
        "process_id": 2,
    }


def test_port_task_and_rpc_overrides(monkeypatch):
    _set(monkeypatch, '["a", "b"]', "a")
    resolver = SageMakerClusterResolver(
        port=9000, task_id=1, rpc_layer="grpc", environment="sagemaker"
    )
    assert resolver.master() == "grpc://b:9000"
    assert resolver.environment == "sagemaker"
    resolver.task_id = None
    assert resolver.master() == "grpc://a:9000"


def test_environment_is_re_read(monkeypatch):
    _set(monkeypatch, '["a"]', "a")
    resolver = SageMakerClusterResolver()
    assert resolver.cluster_spec().num_tasks("worker") == 1
    _set(monkeypatch, '["a", "b"]', "b")
    assert resolver.cluster_spec().num_tasks("worker") == 2
    assert resolver.task_id == 1


def test_current_host_not_in_hosts_gives_empty_spec(monkeypatch):
    _set(monkeypatch, '["a", "b"]', "c")
    resolver = SageMakerClusterResolver()
    assert not resolver.cluster_spec()
    assert (resolver.task_type, resolver.task_id, resolver.master()) == (None, None, "")
    with pytest.raises(ValueError, match=r"SM_CURRENT_HOST is 'c'.*SM_HOSTS"):
        resolver.jax_distributed_args()


def test_empty_hosts_is_an_empty_cluster(monkeypatch):
    _set(monkeypatch, "", "a")
    assert not SageMakerClusterResolver().cluster_spec()


@pytest.mark.parametrize(
    ("hosts", "current", "fragment"),
    [
        ('["a",', "a", "SM_HOSTS is not valid JSON"),
        ('{"a": 1}', "a", "SM_HOSTS is '{\"a\": 1}'; expected a JSON list"),
        ("[1, 2]", "a", "SM_HOSTS is '\\[1, 2\\]'"),
    ],
)
def test_bad_sm_hosts_names_the_variable(monkeypatch, hosts, current, fragment):
    _set(monkeypatch, hosts, current)
    with pytest.raises(ValueError, match=fragment):
        SageMakerClusterResolver().cluster_spec()


def test_missing_variables_are_named(monkeypatch):
    monkeypatch.delenv("SM_HOSTS", raising=False)
    monkeypatch.setenv("SM_CURRENT_HOST", "a")
    with pytest.raises(ValueError, match="SM_HOSTS is not set"):
        SageMakerClusterResolver().cluster_spec()
    monkeypatch.delenv("SM_CURRENT_HOST")
    with pytest.raises(ValueError, match="SM_HOSTS and SM_CURRENT_HOST are not set"):
        SageMakerClusterResolver().cluster_spec()


def test_bad_port_rejected():
    with pytest.raises(ValueError, match="port is 'http'"):
        SageMakerClusterResolver(port="http")  # type: ignore[arg-type]
