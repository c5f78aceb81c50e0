"""ClusterSpec: construction, lookups, dense/sparse views, comparison, errors."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from jaxcluster.cluster_spec import ClusterSpec


def test_dense_jobs_keep_given_order_and_tasks():
    spec = ClusterSpec({"worker": ["w0:1", "w1:1"], "chief": ["c0:1"], "ps": ("p0:1",)})
    assert spec.jobs == ["worker", "chief", "ps"]
    assert spec.num_tasks("worker") == 2
    assert spec.task_indices("worker") == [0, 1]
    assert spec.task_address("worker", 1) == "w1:1"
    assert spec.job_tasks("ps") == ["p0:1"]
    assert spec.as_dict() == {"worker": ["w0:1", "w1:1"], "chief": ["c0:1"], "ps": ["p0:1"]}


def test_sparse_job_with_string_indices_has_holes():
    spec = ClusterSpec({"worker": {"3": "w3:1", 1: "w1:1"}})
    assert spec.task_indices("worker") == [1, 3]
    assert spec.num_tasks("worker") == 2
    assert spec.job_tasks("worker") == [None, "w1:1", None, "w3:1"]
    assert spec.as_dict() == {"worker": {1: "w1:1", 3: "w3:1"}}


def test_sparse_dict_covering_zero_to_n_is_shown_as_list():
    spec = ClusterSpec({"worker": {1: "b", 0: "a"}})
    assert spec.as_dict() == {"worker": ["a", "b"]}


def test_empty_job_is_truthy_and_shown_as_empty_dict():
    spec = ClusterSpec({"a": []})
    assert bool(spec)
    assert spec.as_dict() == {"a": {}}
    assert spec.job_tasks("a") == []
    assert spec.num_tasks("a") == 0
    assert not ClusterSpec({})


def test_copy_from_cluster_spec_is_equal_and_independent():
    original = ClusterSpec({"worker": ["a:1"]})
    copy = ClusterSpec(original)
    assert copy == original
    assert copy is not original
    assert copy.as_dict() == original.as_dict()


def test_dense_equals_same_sparse_and_task_order_matters():
    assert ClusterSpec({"w": ["a", "b"]}) == ClusterSpec({"w": {0: "a", 1: "b"}})
    assert ClusterSpec({"w": ["a", "b"]}) != ClusterSpec({"w": ["b", "a"]})
    assert ClusterSpec({"w": ["a"]}) != ClusterSpec({"w": ["a"], "ps": []})
    assert ClusterSpec({"w": ["a"]}) == {"w": ["a"]}
    assert ClusterSpec({"w": ["a"]}) != 3


def test_unknown_job_or_index_raise_value_error_naming_them():
    spec = ClusterSpec({"worker": ["a"]})
    with pytest.raises(ValueError, match=r"'ps'.*jobs: worker"):
        spec.num_tasks("ps")
    with pytest.raises(ValueError, match="index 5 in job 'worker'"):
        spec.task_address("worker", 5)
    for method in (spec.task_indices, spec.job_tasks):
        with pytest.raises(ValueError, match="'ps'"):
            method("ps")


@pytest.mark.parametrize(
    ("cluster", "error", "fragment"),
    [
        ({"worker": "a:1"}, TypeError, "tasks of job 'worker'"),
        ({"worker": [1]}, TypeError, "address of task 0 of job 'worker'"),
        ({3: ["a"]}, TypeError, "job name"),
        ({"worker": {"x": "a"}}, ValueError, "'x'"),
        ({"worker": {-1: "a"}}, ValueError, "negative"),
        ({"worker": {1.5: "a"}}, TypeError, "must be an integer"),
        (["worker"], TypeError, "got list"),
        ("worker", TypeError, "got str"),
    ],
)
def test_bad_input_is_rejected_with_the_value_seen(cluster, error, fragment):
    with pytest.raises(error, match=fragment):
        ClusterSpec(cluster)


def test_as_cluster_def_is_sorted_plain_data():
    spec = ClusterSpec({"worker": {2: "w2", 0: "w0"}, "chief": ["c"]})
    cluster_def = spec.as_cluster_def()
    assert cluster_def == {
        "job": [
            {"name": "chief", "tasks": {0: "c"}},
            {"name": "worker", "tasks": {0: "w0", 2: "w2"}},
        ]
    }
    assert list(cluster_def["job"][1]["tasks"]) == [0, 2]
    assert json.loads(json.dumps(cluster_def))["job"][0]["name"] == "chief"


def test_repr_round_trips():
    spec = ClusterSpec({"worker": {1: "b"}, "ps": ["p"]})
    assert repr(spec) == "ClusterSpec({'worker': {1: 'b'}, 'ps': ['p']})"


_addresses = st.text(min_size=1, max_size=8)
_dense = st.lists(_addresses, max_size=4)
_sparse = st.dictionaries(st.integers(0, 20), _addresses, max_size=4)
_clusters = st.dictionaries(st.text(min_size=1, max_size=6), st.one_of(_dense, _sparse), max_size=4)


@given(_clusters)
def test_round_trip_through_as_dict(cluster):
    spec = ClusterSpec(cluster)
    assert ClusterSpec(spec.as_dict()) == spec
    assert spec.jobs == list(cluster)
    for job, tasks in cluster.items():
        assert spec.num_tasks(job) == len(tasks)
        expected = dict(enumerate(tasks)) if isinstance(tasks, list) else tasks
        for index, address in expected.items():
            assert spec.task_address(job, index) == address
