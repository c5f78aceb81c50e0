"""TF 2.21 ``distribute/cluster_resolver/sagemaker_cluster_resolver_test.py``: every behaviour
it asserts, asserted against jaxcluster's ``SageMakerClusterResolver``."""

from __future__ import annotations

import pytest

from jaxcluster.cluster_resolver import SageMakerClusterResolver
from support.cluster_defs import assert_cluster_def
from support.cluster_env import clear_cluster_env


@pytest.fixture(autouse=True)
def _bare_env(monkeypatch: pytest.MonkeyPatch) -> None:
    clear_cluster_env(monkeypatch)


def _hosts(monkeypatch: pytest.MonkeyPatch, hosts: str, current: str) -> None:
    monkeypatch.setenv("SM_HOSTS", hosts)
    monkeypatch.setenv("SM_CURRENT_HOST", current)


def test_cluster_spec(monkeypatch: pytest.MonkeyPatch) -> None:
    _hosts(monkeypatch, '["algo-1","algo-2"]', "algo-2")
    assert_cluster_def(
        SageMakerClusterResolver().cluster_spec(), {"worker": {0: "algo-1:2223", 1: "algo-2:2223"}}
    )


def test_master_is_the_current_host(monkeypatch: pytest.MonkeyPatch) -> None:
    _hosts(monkeypatch, '["algo-1","algo-2"]', "algo-1")
    assert SageMakerClusterResolver().master() == "algo-1:2223"


def test_master_of_a_given_task(monkeypatch: pytest.MonkeyPatch) -> None:
    _hosts(monkeypatch, '["algo-1","algo-2"]', "algo-2")
    assert SageMakerClusterResolver().master("worker", 1) == "algo-2:2223"


def test_rpc_layer(monkeypatch: pytest.MonkeyPatch) -> None:
    _hosts(monkeypatch, '["algo-1","algo-2"]', "algo-1")
    assert SageMakerClusterResolver(rpc_layer="grpc").master() == "grpc://algo-1:2223"


def test_overrides(monkeypatch: pytest.MonkeyPatch) -> None:
    _hosts(monkeypatch, '["algo-1","algo-2"]', "algo-1")
    resolver = SageMakerClusterResolver(task_type="worker", task_id=0)
    assert resolver.master() == "algo-1:2223"
    assert (resolver.task_type, resolver.task_id) == ("worker", 0)
    resolver.task_type, resolver.task_id, resolver.rpc_layer = "worker", 1, "test"
    assert resolver.master() == "test://algo-2:2223"
    assert (resolver.task_type, resolver.task_id, resolver.rpc_layer) == ("worker", 1, "test")


def test_task_id_override(monkeypatch: pytest.MonkeyPatch) -> None:
    _hosts(monkeypatch, '["algo-1","algo-2"]', "algo-2")
    assert SageMakerClusterResolver(task_id=1).task_id == 1


def test_no_hosts_means_no_master(monkeypatch: pytest.MonkeyPatch) -> None:
    _hosts(monkeypatch, "", "")
    assert SageMakerClusterResolver().master() == ""


def test_one_host_needs_no_master(monkeypatch: pytest.MonkeyPatch) -> None:
    _hosts(monkeypatch, '["algo-1"]', "")
    assert SageMakerClusterResolver().master() == ""
