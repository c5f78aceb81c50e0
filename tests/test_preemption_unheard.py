"""A worker preempted before any coordinator heard its notice (it ran nothing, so it
drained and left at once, while the coordinator's link waited out its reconnection
backoff) is still counted as a preemption: it says so on its way out, its launcher
(``LocalCluster`` here) tells its next process (``JAXCLUSTER_PREVIOUS_EXIT=preempted:…``),
and the link counts the preemption when that process answers (SPEC §12)."""

from __future__ import annotations

import logging
import os
import signal
from typing import Any

import pytest

from jaxcluster import LocalCluster
from jaxcluster._task_process import describe_exit, preempted_line, preempted_source
from support.closures import wait_until
from support.workers import pid_gone

#: Seconds the link has been reconnecting before the worker comes back: its next probe is
#: then several seconds away (the backoff doubles from 0.1 s), long enough for the new
#: process to start, get its notice and leave unheard.
BACKED_OFF = 6.5


def _worker(coordinator: Any, index: int) -> dict[str, Any]:
    return dict(coordinator.metrics()["workers"][index])


def test_a_worker_preempted_before_the_coordinator_heard_counts_as_a_preemption(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="jaxcluster.dispatch")
    with LocalCluster(2) as cluster, cluster.coordinator(recovery_timeout=300) as coordinator:
        wait_until(lambda: _worker(coordinator, 0)["state"] == "up", "worker 0 up")
        cluster.kill_worker(0)  # a crash: a failure, and the link backs off
        wait_until(
            lambda: (
                _worker(coordinator, 0)["state"] == "recovering"
                and _worker(coordinator, 0)["in_state_seconds"] >= BACKED_OFF
            ),
            "the link to back off",
            timeout=60,
        )
        cluster.restart_worker(0)
        unheard = cluster.worker_pid(0)
        assert unheard is not None
        os.kill(unheard, signal.SIGTERM)  # preempted before its first closure
        wait_until(lambda: pid_gone(unheard), "the preempted worker to leave")
        assert coordinator.metrics()["preemptions"] == {}  # nobody heard it

        cluster.restart_worker(0)  # its replacement, told how it ended
        wait_until(lambda: _worker(coordinator, 0)["state"] == "up", "the replacement up")
        assert coordinator.metrics()["preemptions"] == {"signal": 1}
        report = coordinator.workers[0].report
        assert report is not None
        assert report.previous_exit == "drained after a preemption notice (signal)"
        warned = [
            r.getMessage() for r in caplog.records if "before this coordinator" in r.getMessage()
        ]
        assert len(warned) == 1 and "worker 0" in warned[0], warned
        assert coordinator.schedule(lambda: 1).fetch(timeout=60) == 1


def test_the_preempted_line_round_trips_and_reads_as_previous_exit() -> None:
    assert preempted_source(preempted_line("gce")) == "gce"
    assert preempted_source("jaxcluster worker listening on 127.0.0.1:1") is None
    assert describe_exit("preempted:aws") == "drained after a preemption notice (aws)"
    assert describe_exit("0") == "exit status 0"
