"""The check TF's resolver tests run on every cluster spec they get back, in our terms.

TF compares a spec with an expected ``ClusterDef`` four ways: the spec's own
``as_cluster_def()``, and that of a ``ClusterSpec`` rebuilt from the spec, from its cluster def
and from its ``as_dict()``. A resolver's spec must survive all four unchanged.

Example::

    assert_cluster_def(spec, {"ps": {0: "ps0:2222"}, "worker": {0: "w0:2222", 1: "w1:2222"}})
"""

from __future__ import annotations

from collections.abc import Mapping

from jaxcluster import ClusterSpec

__all__ = ["assert_cluster_def", "cluster_def"]


def cluster_def(jobs: Mapping[str, Mapping[int, str]]) -> dict[str, list[dict[str, object]]]:
    """The cluster def of ``{job: {index: address}}``: jobs and tasks sorted."""
    return {
        "job": [
            {"name": name, "tasks": dict(sorted(tasks.items()))}
            for name, tasks in sorted(jobs.items())
        ]
    }


def assert_cluster_def(spec: ClusterSpec, jobs: Mapping[str, Mapping[int, str]]) -> None:
    expected = cluster_def(jobs)
    assert isinstance(spec, ClusterSpec)
    assert spec.as_cluster_def() == expected
    assert ClusterSpec(spec).as_cluster_def() == expected
    assert ClusterSpec(spec.as_cluster_def()).as_cluster_def() == expected
    assert ClusterSpec(spec.as_dict()).as_cluster_def() == expected
