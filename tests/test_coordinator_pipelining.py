"""Pipelined dispatch against real workers: a busy worker gets closures queued on it only
while no worker is idle, and closures queued on a worker that is SIGKILLed all run again.

Every claim is shown by conditions (gate files, what each worker reports queued), never
by timing: a closure stuck behind a gated one would never finish, and the fetch with a
deadline would fail.
"""

from __future__ import annotations

import os
from pathlib import Path

from jaxcluster.coordinator import get_current_worker_index
from support.closures import (
    WAIT_SECONDS,
    gated_square,
    local_cluster,
    runs,
    wait_until,
    worker_status,
)


def where() -> tuple[int, int]:
    """Runs on a worker: ``(worker index, pid)``."""
    return get_current_worker_index(), os.getpid()


def _started_by(directory: Path, pid: int | None) -> bool:
    return pid is not None and any(directory.glob(f"started-*.{pid}"))


def test_with_a_worker_idle_nothing_queues_behind_a_long_closure(tmp_path: Path) -> None:
    gate = tmp_path / "gate"
    with local_cluster(2) as cluster, cluster.coordinator() as coordinator:
        long = coordinator.schedule(gated_square, args=(str(tmp_path), 7, str(gate)))
        pids = {i: cluster.worker_pid(i) for i in range(2)}
        wait_until(
            lambda: any(_started_by(tmp_path, pid) for pid in pids.values()),
            "the long closure to start",
        )
        busy = next(i for i, pid in pids.items() if _started_by(tmp_path, pid))
        idle = 1 - busy
        for _ in range(30):
            # Each one finishes while the busy worker is still held by its gate, so none
            # waited behind it; and the busy worker never had one queued.
            index, pid = coordinator.schedule(where).fetch(timeout=WAIT_SECONDS)
            assert (index, pid) == (idle, pids[idle])
            assert worker_status(cluster, busy)["queued"] == 0
        assert not long.done()
        gate.touch()
        assert long.fetch(timeout=WAIT_SECONDS) == 49


def test_closures_queued_on_a_worker_killed_mid_pipeline_all_run_again(tmp_path: Path) -> None:
    gate = tmp_path / "gate"
    numbers = range(24)
    with local_cluster(2) as cluster, cluster.coordinator() as coordinator:
        # Both workers start one gated closure; with neither idle, the second link to start
        # also queues more on its worker (pipelining).
        rvs = [
            coordinator.schedule(gated_square, args=(str(tmp_path), i, str(gate))) for i in numbers
        ]

        def pipelined() -> tuple[int, int] | None:
            """``(worker, queued)`` of a worker running one closure with more queued."""
            for i in range(2):
                if _started_by(tmp_path, cluster.worker_pid(i)):
                    queued = int(worker_status(cluster, i)["queued"])
                    if queued >= 2:
                        return i, queued
            return None

        victim, queued = wait_until(pipelined, "closures to be pipelined on a worker")
        cluster.kill_worker(victim)
        gate.touch()
        assert coordinator.join(timeout=WAIT_SECONDS) is True
        assert [rv.fetch() for rv in rvs] == [i * i for i in numbers]
        for i in numbers:
            assert runs(tmp_path, f"sq{i}"), f"closure {i} never ran to completion"
        metrics = coordinator.metrics()
        # The running closure and every queued one went back to the queue.
        assert metrics["retried"] >= 1 + queued
        assert metrics["worker_failures"] >= 1
