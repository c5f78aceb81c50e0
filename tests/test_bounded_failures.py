"""Failures that used to last forever, bounded (issue 16): a closure that kills every worker
it runs on, a worker frozen with SIGSTOP, and a cluster none of whose workers is reachable.

Closures record each start as a file (``start<i>.<pid>.<uuid>``), so the test counts
executions by processes that died or froze too.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from jaxcluster.cluster_resolver import SimpleClusterResolver
from jaxcluster.cluster_spec import ClusterSpec
from jaxcluster.coordinator import ClusterCoordinator
from jaxcluster.errors import UnavailableError, WorkerCrashedError
from support.closures import barrier, counted_square, local_cluster, runs, wait_until, worker_status


def poison(directory: str) -> int:
    """Runs on a worker: records the run and ends the worker process, as a segfault would."""
    Path(directory, f"poison.{os.getpid()}.{uuid.uuid4().hex}").touch()
    os._exit(3)


def slow_square(directory: str, i: int) -> int:
    """Runs on a worker: records its start with the pid, takes 0.1 s, returns ``i * i``."""
    Path(directory, f"start{i}.{os.getpid()}.{uuid.uuid4().hex}").touch()
    threading.Event().wait(0.1)
    return i * i


@contextmanager
def _supervised(cluster: Any) -> Iterator[None]:
    """Starts every worker of ``cluster`` that died again, as Kubernetes or Slurm would."""
    stop = threading.Event()

    def supervise() -> None:
        while not stop.wait(0.05):
            for index in range(cluster.num_workers):
                if cluster.worker_pid(index) is None and not stop.is_set():
                    cluster.restart_worker(index)

    thread = threading.Thread(target=supervise, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(timeout=120)


def test_a_closure_that_kills_its_workers_fails_after_max_closure_retries(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="jaxcluster")
    with (
        local_cluster(2) as cluster,
        _supervised(cluster),
        cluster.coordinator(max_closure_retries=2, error_policy="per_closure") as coordinator,
    ):
        rv = coordinator.schedule(poison, args=(str(tmp_path),))
        with pytest.raises(WorkerCrashedError) as info:
            rv.fetch()
        message = str(info.value)
        assert len(runs(tmp_path, "poison")) == 3, "1 run and 2 retries"
        assert "poison" in message, message
        assert "max_closure_retries=2" in message, message
        assert any(address in message for address in cluster.addresses), message
        # LocalCluster tells each restarted worker how its predecessor ended.
        assert "exit status 3" in message, message
        # Each death was logged, under the jaxcluster logger hierarchy.
        retries = [
            r
            for r in caplog.records
            if r.name == "jaxcluster.dispatch"
            and r.levelno == logging.WARNING
            and "max_closure_retries=2" in r.getMessage()
        ]
        assert len(retries) == 3, [r.getMessage() for r in caplog.records]
        failed = [r for r in caplog.records if r.levelno == logging.ERROR]
        assert any("(poison) was run 3 times" in r.getMessage() for r in failed), failed
        # The workers serve everything else.
        squares = [coordinator.schedule(counted_square, args=(str(tmp_path), i)) for i in range(8)]
        assert coordinator.fetch(squares) == [i * i for i in range(8)]


def test_the_bound_is_checked() -> None:
    resolver = SimpleClusterResolver(ClusterSpec({"worker": ["127.0.0.1:1"]}))
    for bad in (-1, 1.5, True):
        with pytest.raises(ValueError, match="max_closure_retries"):
            ClusterCoordinator(resolver, auth_token="t", max_closure_retries=bad)
    with pytest.raises(ValueError, match="heartbeat_timeout"):
        ClusterCoordinator(resolver, auth_token="t", heartbeat_timeout=0)
    with pytest.raises(ValueError, match="connect_timeout"):
        ClusterCoordinator(resolver, auth_token="t", connect_timeout=-1.0)


def _starts(directory: Path) -> dict[int, list[int]]:
    """The pids that started each closure, by closure number."""
    found: dict[int, list[int]] = {}
    for path in directory.glob("start*"):
        number, pid, _ = path.name[len("start") :].split(".")
        found.setdefault(int(number), []).append(int(pid))
    return found


def test_a_frozen_worker_is_noticed_in_seconds_and_its_queued_closures_run_once(
    tmp_path: Path,
) -> None:
    meeting, work = tmp_path / "barrier", tmp_path / "work"
    meeting.mkdir()
    work.mkdir()
    with local_cluster(2) as cluster, cluster.coordinator(heartbeat_timeout=2.0) as coordinator:
        # Both workers are up and take closures at once.
        both = [coordinator.schedule(barrier, args=(str(meeting), 2)) for _ in range(2)]
        assert sorted(coordinator.fetch(both)) == [0, 1]
        frozen = cluster.worker_pid(1)
        count = 30
        rvs = [coordinator.schedule(slow_square, args=(str(work), i)) for i in range(count)]
        wait_until(lambda: any(work.glob(f"start*.{frozen}.*")), "worker 1 to start one")
        os.kill(frozen, signal.SIGSTOP)
        start = time.monotonic()
        try:
            values = coordinator.fetch(rvs)
            elapsed = time.monotonic() - start
        finally:
            os.kill(frozen, signal.SIGCONT)
        assert values == [i * i for i in range(count)]
        # HTTP/2 keepalive alone takes ~40 s to notice; heartbeats take 2 s.
        assert elapsed < 30.0, f"the closures took {elapsed:.1f} s after the freeze"
        # Woken up, the worker finishes the closure it was running (its answer is not
        # used) and starts none of the closures it had queued: they ran elsewhere.
        wait_until(
            lambda: (lambda s: s["inflight"] + s["queued"] == 0)(worker_status(cluster, 1)),
            "worker 1 to settle after SIGCONT",
        )
        starts = _starts(work)
        assert sorted(starts) == list(range(count)), "every closure ran"
        twice = {i: pids for i, pids in starts.items() if len(pids) > 1}
        assert len(twice) <= 1, f"closures started more than once: {twice}"
        for pids in twice.values():
            assert frozen in pids, f"only the frozen worker's running closure runs again: {twice}"
        # The worker is in use again.
        again = tmp_path / "again"
        again.mkdir()
        both = [coordinator.schedule(barrier, args=(str(again), 2)) for _ in range(2)]
        assert sorted(coordinator.fetch(both)) == [0, 1]


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_a_cluster_never_reached_fails_fast_naming_every_address(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="jaxcluster")
    addresses = [f"127.0.0.1:{_closed_port()}", "no-such-host.invalid:8470"]
    resolver = SimpleClusterResolver(ClusterSpec({"worker": addresses}))
    start = time.monotonic()
    with ClusterCoordinator(resolver, auth_token="t", connect_timeout=1.0) as coordinator:
        rv = coordinator.schedule(counted_square, args=("/nonexistent", 2))
        with pytest.raises(UnavailableError) as info:
            rv.fetch()
        elapsed = time.monotonic() - start
        message = str(info.value)
        for address in addresses:
            assert address in message, message
        assert "connect_timeout" in message, message
        assert elapsed < 60.0, f"took {elapsed:.1f} s"
        with pytest.raises(UnavailableError):
            coordinator.schedule(counted_square, args=("/nonexistent", 3))
        with pytest.raises(UnavailableError):
            coordinator.join()
    # Each unreachable worker was logged when it first failed to answer.
    logged = " ".join(r.getMessage() for r in caplog.records if r.name == "jaxcluster.dispatch")
    for address in addresses:
        assert address in logged, logged
