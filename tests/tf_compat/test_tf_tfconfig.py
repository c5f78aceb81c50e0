"""TF 2.21 ``distribute/cluster_resolver/tfconfig_cluster_resolver_test.py``: every behaviour
it asserts, asserted against jaxcluster's ``TFConfigClusterResolver``."""

from __future__ import annotations

import json
from dataclasses import dataclass

import jax
import pytest

from jaxcluster.cluster_resolver import TFConfigClusterResolver
from support.cluster_defs import assert_cluster_def
from support.cluster_env import clear_cluster_env

CLUSTER = {
    "ps": ["ps0:2222", "ps1:2222"],
    "worker": ["worker0:2222", "worker1:2222", "worker2:2222"],
}


@pytest.fixture(autouse=True)
def _bare_env(monkeypatch: pytest.MonkeyPatch) -> None:
    clear_cluster_env(monkeypatch)


def _tf_config(monkeypatch: pytest.MonkeyPatch, **config: object) -> None:
    monkeypatch.setenv("TF_CONFIG", json.dumps(config))


def test_cluster_spec(monkeypatch: pytest.MonkeyPatch) -> None:
    _tf_config(monkeypatch, cluster=CLUSTER, task={"type": "ps", "index": 0})
    assert_cluster_def(
        TFConfigClusterResolver().cluster_spec(),
        {
            "ps": {0: "ps0:2222", 1: "ps1:2222"},
            "worker": {0: "worker0:2222", 1: "worker1:2222", 2: "worker2:2222"},
        },
    )


def test_sparse_cluster_spec(monkeypatch: pytest.MonkeyPatch) -> None:
    cluster = {"ps": CLUSTER["ps"], "worker": {"1": "worker1:2222"}}
    _tf_config(monkeypatch, cluster=cluster, task={"type": "worker", "index": 1})
    assert_cluster_def(
        TFConfigClusterResolver().cluster_spec(),
        {"ps": {0: "ps0:2222", 1: "ps1:2222"}, "worker": {1: "worker1:2222"}},
    )


def test_master_is_this_task(monkeypatch: pytest.MonkeyPatch) -> None:
    _tf_config(monkeypatch, cluster=CLUSTER, task={"type": "ps", "index": 0})
    resolver = TFConfigClusterResolver()
    assert resolver.master() == "ps0:2222"
    assert resolver.master("worker", 1) == "worker1:2222"


def test_session_master_wins(monkeypatch: pytest.MonkeyPatch) -> None:
    _tf_config(
        monkeypatch,
        cluster=CLUSTER,
        session_master="sessionmaster:2222",
        task={"type": "ps", "index": 0},
    )
    assert TFConfigClusterResolver().master() == "sessionmaster:2222"


def test_rpc_layer(monkeypatch: pytest.MonkeyPatch) -> None:
    _tf_config(monkeypatch, cluster=CLUSTER, rpc_layer="grpc", task={"type": "ps", "index": 0})
    resolver = TFConfigClusterResolver()
    assert resolver.master() == "grpc://ps0:2222"
    assert (resolver.task_type, resolver.task_id, resolver.rpc_layer) == ("ps", 0, "grpc")


def test_overrides(monkeypatch: pytest.MonkeyPatch) -> None:
    _tf_config(monkeypatch, cluster=CLUSTER, rpc_layer="grpc", task={"type": "ps", "index": 1})
    resolver = TFConfigClusterResolver(task_type="ps", task_id=0)
    assert resolver.master() == "grpc://ps0:2222"
    assert (resolver.task_type, resolver.task_id) == ("ps", 0)

    resolver.task_type, resolver.task_id, resolver.rpc_layer = "worker", 1, "test"
    assert resolver.master() == "test://worker1:2222"
    assert (resolver.task_type, resolver.task_id, resolver.rpc_layer) == ("worker", 1, "test")


def test_task_type_is_cast_to_str(monkeypatch: pytest.MonkeyPatch) -> None:
    cluster = {"123456": CLUSTER["ps"], "worker": CLUSTER["worker"]}
    _tf_config(monkeypatch, cluster=cluster, rpc_layer="grpc", task={"type": 123456, "index": 0})
    assert TFConfigClusterResolver().task_type == "123456"


def test_task_index_is_cast_to_int(monkeypatch: pytest.MonkeyPatch) -> None:
    _tf_config(monkeypatch, cluster=CLUSTER, rpc_layer="grpc", task={"type": "ps", "index": "1"})
    assert TFConfigClusterResolver().task_id == 1


def test_task_id_override(monkeypatch: pytest.MonkeyPatch) -> None:
    _tf_config(
        monkeypatch,
        cluster={"worker": ["w0:2222", "w1:2222"]},
        task={"type": "worker", "index": "0"},
    )
    assert TFConfigClusterResolver(task_id=1).task_id == 1


def test_no_cluster_means_no_master(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TF_CONFIG", "\n    {}\n    ")
    assert TFConfigClusterResolver().master() == ""


def test_a_one_task_cluster_needs_no_master(monkeypatch: pytest.MonkeyPatch) -> None:
    _tf_config(monkeypatch, cluster={"worker": ["worker0:2222"]})
    assert TFConfigClusterResolver().master() == ""


@dataclass(frozen=True)
class FakeDevice:
    platform: str
    id: int
    process_index: int


def test_num_accelerators_defaults_to_this_task(monkeypatch: pytest.MonkeyPatch) -> None:
    cluster = {"worker1": ["w10:2222"], "worker2": ["w21:2222", "w22:2222", "w23:2222", "w24:2222"]}
    _tf_config(
        monkeypatch, cluster=cluster, rpc_layer="grpc", task={"type": "worker1", "index": "0"}
    )
    devices = [
        FakeDevice("tpu", 0, 0),
        FakeDevice("tpu", 1, 0),
        FakeDevice("gpu", 0, 0),
        FakeDevice("gpu", 1, 0),
        FakeDevice("tpu", 2, 2),
        FakeDevice("tpu", 3, 3),
        FakeDevice("gpu", 2, 4),  # worker2 task 3 is process 4
        FakeDevice("gpu", 3, 4),
    ]
    monkeypatch.setattr(jax, "devices", lambda *a: list(devices))
    monkeypatch.setattr(jax, "process_count", lambda: 5)
    resolver = TFConfigClusterResolver()
    assert resolver.num_accelerators() == {"TPU": 2, "GPU": 2}
    assert resolver.num_accelerators(task_type="worker2", task_id=3) == {"GPU": 2}
