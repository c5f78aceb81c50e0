"""Version skew at connect (rust/dispatch/versions.rs): a worker that reports another Python
minor version is refused, its last error naming both versions and the fix, and closures run
on the other workers; the worker's report carries its Python version."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from typing import Any

import pytest

from jaxcluster import ClusterSpec
from jaxcluster._native import core
from jaxcluster.cluster_resolver import SimpleClusterResolver
from jaxcluster.coordinator import ClusterCoordinator, get_current_worker_index
from support.closures import local_cluster, wait_until

#: A Python minor version no coordinator of this test runs on.
OTHER_PYTHON = f"{sys.version_info.major}.{sys.version_info.minor + 1}.0"


@pytest.fixture(scope="module")
def cluster() -> Iterator[Any]:
    with local_cluster(1) as c:
        yield c


def test_a_worker_reports_its_python_version(cluster: Any) -> None:
    with cluster.coordinator() as coordinator:
        wait_until(lambda: coordinator.workers[0].report is not None, "worker 0 reported")
        report = coordinator.workers[0].report
        v = sys.version_info
        assert report.python_version == f"{v.major}.{v.minor}.{v.micro}"


def test_a_worker_of_another_python_minor_is_refused(cluster: Any) -> None:
    # A real worker server that says it runs another Python (as a worker started under
    # another interpreter would); the coordinator must not send it closures.
    skewed = core.WorkerServer(
        "127.0.0.1:0", auth_token=cluster.auth_token, python_version=OTHER_PYTHON
    )
    try:
        addresses = [*cluster.addresses, skewed.address]
        resolver = SimpleClusterResolver(ClusterSpec({"worker": addresses}))
        with ClusterCoordinator(resolver, auth_token=cluster.auth_token) as coordinator:
            own = ".".join(map(str, sys.version_info[:3]))
            error = wait_until(
                lambda: (e := coordinator.workers[1].last_error) and OTHER_PYTHON in e and e,
                "the skewed worker is refused",
            )
            assert f"Python {own}" in error, error
            assert "same Python minor version" in error, error
            assert coordinator.workers[1].state != "up"
            ran_on = {coordinator.schedule(get_current_worker_index).fetch() for _ in range(4)}
            assert ran_on == {0}
            assert coordinator.workers[1].state != "up"
    finally:
        skewed.shutdown()
