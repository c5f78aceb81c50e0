"""TFConfigClusterResolver: TF_CONFIG parsing, overrides, master(), and bad input."""

from __future__ import annotations

import json

import pytest

from jaxcluster.cluster_resolver import TFConfigClusterResolver
from jaxcluster.cluster_spec import ClusterSpec

_CLUSTER = {"chief": ["c0:2222"], "worker": ["w0:2222", "w1:2222"], "ps": ["p0:2222"]}


def _set(monkeypatch, config):
    monkeypatch.setenv("TF_CONFIG", config if isinstance(config, str) else json.dumps(config))


def test_reads_cluster_task_and_rpc_layer(monkeypatch):
    _set(
        monkeypatch,
        {"cluster": _CLUSTER, "task": {"type": "worker", "index": 1}, "rpc_layer": "grpc"},
    )
    resolver = TFConfigClusterResolver()
    assert resolver.cluster_spec() == ClusterSpec(_CLUSTER)
    assert (resolver.task_type, resolver.task_id, resolver.rpc_layer) == ("worker", 1, "grpc")
    assert resolver.master() == "grpc://w1:2222"
    assert resolver.master("ps", 0, rpc_layer="http") == "http://p0:2222"
    assert resolver.environment is None


def test_tf_config_is_re_read_on_every_call(monkeypatch):
    _set(
        monkeypatch, {"cluster": {"worker": ["a:1", "b:1"]}, "task": {"type": "worker", "index": 0}}
    )
    resolver = TFConfigClusterResolver()
    assert resolver.master() == "a:1"
    _set(
        monkeypatch,
        {"cluster": {"worker": ["x:1", "y:1", "z:1"]}, "task": {"type": "worker", "index": 2}},
    )
    assert resolver.master() == "z:1"
    assert resolver.cluster_spec().num_tasks("worker") == 3
    assert resolver.task_id == 2


def test_tf_config_file_is_read_on_every_call_and_wins_over_the_environment(monkeypatch, tmp_path):
    _set(monkeypatch, {"cluster": {"worker": ["env:1"]}, "task": {"type": "worker", "index": 0}})
    path = tmp_path / "tf_config.json"
    path.write_text(
        json.dumps({"cluster": {"worker": ["a:1", "b:1"]}, "task": {"type": "worker", "index": 1}})
    )
    resolver = TFConfigClusterResolver(tf_config_file=path)
    assert resolver.cluster_spec().job_tasks("worker") == ["a:1", "b:1"]
    assert (resolver.task_type, resolver.task_id, resolver.master()) == ("worker", 1, "b:1")
    path.write_text(json.dumps({"cluster": {"worker": ["c:1"]}}))
    assert resolver.cluster_spec().job_tasks("worker") == ["c:1"]
    path.write_text('{"cluster": {"worker": [')  # caught mid-rewrite
    with pytest.raises(ValueError, match=r"TF_CONFIG file .*tf_config.json is not valid JSON"):
        resolver.cluster_spec()
    path.unlink()
    with pytest.raises(FileNotFoundError):
        resolver.cluster_spec()


def test_constructor_arguments_override_and_are_cast(monkeypatch):
    _set(
        monkeypatch,
        {"cluster": _CLUSTER, "task": {"type": "worker", "index": 1}, "rpc_layer": "grpc"},
    )
    resolver = TFConfigClusterResolver(
        task_type="ps", task_id="0", rpc_layer="http", environment="cloud"
    )
    assert (resolver.task_type, resolver.task_id) == ("ps", 0)
    assert resolver.master() == "http://p0:2222"
    assert resolver.environment == "cloud"
    resolver.task_type, resolver.task_id, resolver.rpc_layer = "chief", 0, None
    assert resolver.master() == "grpc://c0:2222"


def test_string_index_and_sparse_jobs(monkeypatch):
    _set(
        monkeypatch,
        {
            "cluster": {"worker": {"1": "w1:1", "4": "w4:1"}, "chief": ["c:1"]},
            "task": {"type": "worker", "index": "4"},
        },
    )
    resolver = TFConfigClusterResolver()
    assert resolver.task_id == 4
    assert resolver.cluster_spec().as_dict() == {"worker": {1: "w1:1", 4: "w4:1"}, "chief": ["c:1"]}
    assert resolver.master() == "w4:1"
    assert resolver.jax_distributed_args() == {
        "coordinator_address": "c:1",
        "num_processes": 3,
        "process_id": 2,
    }


def test_session_master_wins(monkeypatch):
    _set(
        monkeypatch,
        {
            "cluster": _CLUSTER,
            "task": {"type": "worker", "index": 0},
            "session_master": "grpc://elsewhere:1",
        },
    )
    assert TFConfigClusterResolver().master() == "grpc://elsewhere:1"


def test_single_task_or_no_cluster_has_empty_master(monkeypatch):
    _set(monkeypatch, {"cluster": {"worker": ["only:1"]}, "task": {"type": "worker", "index": 0}})
    assert TFConfigClusterResolver().master() == ""
    monkeypatch.delenv("TF_CONFIG")
    resolver = TFConfigClusterResolver()
    assert resolver.master() == ""
    assert not resolver.cluster_spec()
    assert (resolver.task_type, resolver.task_id, resolver.rpc_layer) == (None, None, None)


def test_num_accelerators_defaults_to_own_task(monkeypatch):
    import jax

    _set(monkeypatch, {"cluster": _CLUSTER, "task": {"type": "worker", "index": 1}})
    non_cpu = [d for d in jax.local_devices() if d.platform != "cpu"]
    assert sum(TFConfigClusterResolver().num_accelerators().values()) == len(non_cpu)


_BAD_INPUTS = [
    ('{"cluster": {"worker": ["a:1"]', ValueError, "TF_CONFIG is not valid JSON.*line 1"),
    ("[1, 2]", ValueError, "TF_CONFIG must be a JSON object.*list"),
    ('{"cluster": ["a:1"]}', ValueError, "TF_CONFIG 'cluster' must be an object"),
    ('{"cluster": {"worker": "a:1"}}', TypeError, "TF_CONFIG 'cluster' is invalid.*'worker'"),
    ('{"cluster": {"worker": {"one": "a:1"}}}', ValueError, "TF_CONFIG 'cluster' is invalid"),
    ('{"cluster": {"worker": [1]}}', TypeError, "TF_CONFIG 'cluster' is invalid"),
]


@pytest.mark.parametrize(("raw", "error", "fragment"), _BAD_INPUTS)
def test_bad_tf_config_names_the_variable(monkeypatch, raw, error, fragment):
    _set(monkeypatch, raw)
    with pytest.raises(error, match=fragment):
        TFConfigClusterResolver().cluster_spec()


@pytest.mark.parametrize(
    ("task", "fragment"),
    [
        ({"type": "worker", "index": "one"}, "TF_CONFIG task index is 'one'"),
        ({"type": "worker", "index": 1.5}, "TF_CONFIG task index is 1.5"),
        ("worker", "TF_CONFIG 'task' must be an object"),
    ],
)
def test_bad_task_index_is_a_clear_value_error(monkeypatch, task, fragment):
    _set(monkeypatch, {"cluster": _CLUSTER, "task": task})
    with pytest.raises(ValueError, match=fragment):
        _ = TFConfigClusterResolver().task_id


def test_unknown_task_type_suggests_the_job(monkeypatch):
    _set(
        monkeypatch,
        {"cluster": {"chief": ["c:1"], "worker": ["w:1"]}, "task": {"type": "wrker", "index": 0}},
    )
    resolver = TFConfigClusterResolver()
    expected = (
        "TF_CONFIG task type 'wrker' is not a job in the cluster (jobs: chief, worker); "
        "did you mean 'worker'?"
    )
    with pytest.raises(ValueError) as info:
        resolver.master()
    assert str(info.value) == expected
    with pytest.raises(ValueError) as info:
        resolver.jax_distributed_args()
    assert str(info.value) == expected


def test_index_out_of_range_and_missing_task(monkeypatch):
    _set(monkeypatch, {"cluster": _CLUSTER, "task": {"type": "worker", "index": 7}})
    with pytest.raises(ValueError, match=r"TF_CONFIG task index 7 .* 'worker' .*indices: 0, 1"):
        TFConfigClusterResolver().master()
    _set(monkeypatch, {"cluster": _CLUSTER})
    with pytest.raises(ValueError, match="set TF_CONFIG 'task'"):
        TFConfigClusterResolver().master()


def test_jax_args_without_cluster_name_tf_config(monkeypatch):
    _set(monkeypatch, {"task": {"type": "worker", "index": 0}})
    with pytest.raises(ValueError, match="TF_CONFIG describes no cluster"):
        TFConfigClusterResolver().jax_distributed_args()
    monkeypatch.delenv("TF_CONFIG")
    with pytest.raises(ValueError, match="TF_CONFIG describes no cluster \\(it is unset\\)"):
        TFConfigClusterResolver().jax_distributed_args()
