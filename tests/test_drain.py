"""A drained worker answers the closure it was running, once (issue 29).

SIGTERM promises to finish the running closure and answer it. The answer must reach the
coordinator before the process exits, and the coordinator must not declare the draining
worker silent (and run the closure again elsewhere) while it finishes: each closure here
runs longer than ``heartbeat_timeout`` after the signal, and records each start in a file
(so a start by the process that exited counts too).
"""

from __future__ import annotations

import functools
import os
import signal
import time
from pathlib import Path

from support.closures import local_cluster, wait_until

# Longer than the heartbeat timeout below: a draining worker that stopped answering pings
# would be declared silent while it runs.
RUN_SECONDS = 2.5
HEARTBEAT_TIMEOUT = 1.0


def long_closure(directory: str, i: int) -> int:
    """Runs on a worker: records its start (with the pid), runs a while, returns ``i``."""
    Path(directory, f"start-{i}.{os.getpid()}").touch()
    time.sleep(RUN_SECONDS)
    return i


def _starts(directory: Path) -> dict[int, list[str]]:
    starts: dict[int, list[str]] = {}
    for marker in directory.glob("start-*"):
        number, pid = marker.name.removeprefix("start-").split(".")
        starts.setdefault(int(number), []).append(pid)
    return starts


def _runs_on(directory: Path, pid: int) -> bool:
    return any(str(pid) in pids for pids in _starts(directory).values())


def test_a_closure_running_when_its_worker_is_sigtermed_runs_once(tmp_path: Path) -> None:
    rounds, per_round = 2, 4
    with (
        local_cluster(2) as cluster,
        cluster.coordinator(heartbeat_timeout=HEARTBEAT_TIMEOUT) as coordinator,
    ):
        for r in range(rounds):
            pid = cluster.worker_pid(0)
            assert pid is not None
            numbers = range(r * per_round, (r + 1) * per_round)
            values = [coordinator.schedule(long_closure, args=(str(tmp_path), i)) for i in numbers]
            wait_until(functools.partial(_runs_on, tmp_path, pid), "a closure running on worker 0")
            os.kill(pid, signal.SIGTERM)
            wait_until(lambda: cluster.worker_pid(0) is None, "worker 0 to drain and exit")
            cluster.restart_worker(0)
            assert [v.fetch() for v in values] == list(numbers)
        starts = _starts(tmp_path)
        twice = {i: pids for i, pids in starts.items() if len(pids) > 1}
        assert not twice, f"closures started more than once (closure: pids): {twice}"
        assert sorted(starts) == list(range(rounds * per_round))
