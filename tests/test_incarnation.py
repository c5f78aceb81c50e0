"""A worker restart is told by its random incarnation, not its pid: in a container every
worker's main process is pid 1, so a restarted pod reports the same pid.

Real worker processes run here in their own pid namespace (``unshare --pid --fork``), so
each really is pid 1, as in a container. The restart happens while the coordinator's link
is idle and has no stream open: nothing breaks that the coordinator could notice, so only
``GetStatus`` can tell it the worker lost its per-worker resources.
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from jaxcluster import ClusterSpec
from jaxcluster.cluster_resolver import SimpleClusterResolver
from jaxcluster.coordinator import ClusterCoordinator
from support.workers import WorkerProc, launch, wait_until

TOKEN = "incarnation-token"


def _can_unshare() -> bool:
    if shutil.which("unshare") is None:
        return False
    done = subprocess.run(
        ["unshare", "--pid", "--fork", "--kill-child", "true"], capture_output=True, timeout=30
    )
    return done.returncode == 0


pytestmark = pytest.mark.skipif(
    not _can_unshare(), reason="needs `unshare --pid` (util-linux, CAP_SYS_ADMIN)"
)


@contextmanager
def _worker_as_pid_1(address: str = "127.0.0.1:0") -> Iterator[WorkerProc]:
    # --kill-child: the worker (pid 1 inside) dies with the unshare process we kill.
    worker = launch(
        ["--address", address], token=TOKEN, prefix=["unshare", "--pid", "--fork", "--kill-child"]
    )
    try:
        worker.wait_listening()
        yield worker
    finally:
        worker.finish(kill=True)


def test_a_restarted_worker_with_the_same_pid_gets_its_resources_rebuilt() -> None:
    with _worker_as_pid_1() as first:
        address = first.address
        resolver = SimpleClusterResolver(ClusterSpec({"worker": [address]}))
        coordinator = ClusterCoordinator(resolver, auth_token=TOKEN)
        try:
            dataset = coordinator.create_per_worker_dataset(lambda: iter(range(1000)))
            iterator = iter(dataset)
            # Built with a unary CreateResource: no closure stream is opened yet.
            wait_until(
                lambda: first.client().get_status(timeout=10.0)["resources_created"] == 1,
                what="the iterator built on the worker",
            )
            before = coordinator.workers[0]
            assert before["state"] == "up" and before["pid"] == 1, "the premise: pid 1"
            first.finish(kill=True)
            with _worker_as_pid_1(address) as second:
                assert second.client().get_status(timeout=10.0)["pid"] == 1
                # The link saw nothing (it was idle, no stream open) and the iterator is
                # gone with the old process: the closure's input error makes the link
                # ask GetStatus, which must reveal a new process although the pid is the
                # same. Then the iterator is rebuilt (a fresh dataset_fn() call) and the
                # closure runs again, instead of failing with ClosureInputError.
                value = coordinator.schedule(next, args=(iterator,))
                assert value.fetch(timeout=120) == 0
                after = coordinator.workers[0]
                assert after["pid"] == 1
                assert after["incarnation"] not in (0, before["incarnation"])
                assert coordinator.metrics()["worker_failures"] == 1
        finally:
            coordinator.shutdown()
