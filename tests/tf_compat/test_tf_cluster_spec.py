"""TF 2.21 ``training/server_lib_test.py`` (``ClusterSpecTest``, ``ServerDefTest``): every
behaviour those classes assert about ``tf.train.ClusterSpec``, asserted against
``jaxcluster.ClusterSpec``. (The ``GrpcServerTest`` class tests TF's in-process server and
sessions, which jaxcluster does not have.)"""

from __future__ import annotations

import pytest

from jaxcluster import ClusterSpec
from support.cluster_defs import assert_cluster_def, cluster_def


def test_str_shows_the_jobs_as_a_dict() -> None:
    spec = ClusterSpec({"ps": ["ps0:1111"], "worker": ["worker0:3333", "worker1:4444"]})
    assert (
        str(spec) == "ClusterSpec({'ps': ['ps0:1111'], 'worker': ['worker0:3333', 'worker1:4444']})"
    )


def test_dict_cluster_def_and_spec_forms_are_equivalent() -> None:
    spec = ClusterSpec(
        {"ps": ["ps0:2222", "ps1:2222"], "worker": ["worker0:2222", "worker1:2222", "worker2:2222"]}
    )
    assert_cluster_def(
        spec,
        {
            "ps": {0: "ps0:2222", 1: "ps1:2222"},
            "worker": {0: "worker0:2222", 1: "worker1:2222", 2: "worker2:2222"},
        },
    )


def test_string_task_index_becomes_an_int() -> None:
    spec = ClusterSpec({"ps": ["ps0:2222", "ps1:2222"], "worker": {"1": "worker1:2222"}})
    assert_cluster_def(spec, {"ps": {0: "ps0:2222", 1: "ps1:2222"}, "worker": {1: "worker1:2222"}})


def test_a_job_with_no_workers_is_kept() -> None:
    spec = ClusterSpec({"ps": ["ps0:2222", "ps1:2222"], "worker": []})
    assert_cluster_def(spec, {"ps": {0: "ps0:2222", 1: "ps1:2222"}, "worker": {}})


def test_accessors() -> None:
    original = {
        "ps": ["ps0:2222", "ps1:2222"],
        "worker": ["worker0:2222", "worker1:2222", "worker2:2222"],
        "sparse": {0: "sparse0:2222", 3: "sparse3:2222"},
    }
    spec = ClusterSpec(original)
    assert spec.as_dict() == original

    assert [spec.num_tasks(j) for j in ("ps", "worker", "sparse")] == [2, 3, 2]
    assert spec.task_address("ps", 0) == "ps0:2222"
    assert spec.task_address("sparse", 0) == "sparse0:2222"
    assert spec.task_indices("ps") == [0, 1]
    assert spec.task_indices("worker") == [0, 1, 2]
    assert spec.task_indices("sparse") == [0, 3]
    assert spec.job_tasks("ps") == ["ps0:2222", "ps1:2222"]
    assert spec.job_tasks("worker") == ["worker0:2222", "worker1:2222", "worker2:2222"]
    assert spec.job_tasks("sparse") == ["sparse0:2222", None, None, "sparse3:2222"]
    for call in (
        lambda: spec.num_tasks("unknown"),
        lambda: spec.task_address("unknown", 0),
        lambda: spec.task_address("sparse", 2),
        lambda: spec.task_indices("unknown"),
        lambda: spec.job_tasks("unknown"),
    ):
        with pytest.raises(ValueError):
            call()


def test_truthiness() -> None:
    assert not ClusterSpec({})
    assert ClusterSpec({"job": ["host:port"]})


def test_equality() -> None:
    assert ClusterSpec({}) == ClusterSpec({})
    assert ClusterSpec({"job": ["host:2222"]}) == ClusterSpec({"job": ["host:2222"]})
    assert ClusterSpec({"job": {0: "host:2222"}}) == ClusterSpec({"job": ["host:2222"]})


def test_inequality() -> None:
    assert ClusterSpec({}) != ClusterSpec({"job": ["host:2223"]})
    assert ClusterSpec({"job1": ["host:2222"]}) != ClusterSpec({"job2": ["host:2222"]})
    assert ClusterSpec({"job": ["host:2222"]}) != ClusterSpec({"job": ["host:2223"]})
    assert ClusterSpec({"job": ["host:2222", "host:2223"]}) != ClusterSpec(
        {"job": ["host:2223", "host:2222"]}
    )


@pytest.mark.parametrize(
    "jobs",
    [
        {"local": ["localhost:2222"]},
        {"local": ["localhost:2222", "localhost:2223"]},
        {"ps": ["ps0:2222", "ps1:2222"], "worker": ["w0:2222", "w1:2222", "w2:2222"]},
        {"ps": ["ps0:2222", "ps1:2222"], "worker": {0: "worker0:2222", 2: "worker2:2222"}},
    ],
)
def test_cluster_def_round_trips_through_a_spec(jobs: dict) -> None:
    """ServerDefTest: the cluster def of a spec, made into a spec again, gives the same def."""
    made = ClusterSpec(jobs).as_cluster_def()
    assert made == cluster_def(
        {job: dict(enumerate(t)) if isinstance(t, list) else t for job, t in jobs.items()}
    )
    assert ClusterSpec(made).as_cluster_def() == made
    # TF's ClusterDef message is read as jobs with .name and .tasks; ours reads the same way.
    assert [(job.name, job.tasks) for job in made.job] == [
        (j["name"], j["tasks"]) for j in made["job"]
    ]
