"""Helpers for coordinator tests: closures that run on workers, and condition waits.

Workers started by :func:`local_cluster` have ``tests/`` on their ``PYTHONPATH``, so the
functions here (and in the test modules) are pickled by reference and imported there.
Closures coordinate through files in a temporary directory shared with the test process:
markers they write, and files the test creates to release them. Every wait has a deadline.
"""

from __future__ import annotations

import os
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

TESTS_DIR = Path(__file__).resolve().parent.parent
# Long enough for a loaded 2-core machine; a closure never waits past it.
WAIT_SECONDS = 90.0


def wait_until(
    predicate: Callable[[], Any], what: str, timeout: float = WAIT_SECONDS, every: float = 0.02
) -> Any:
    """Polls ``predicate`` until it returns something truthy; fails after ``timeout``."""
    deadline = time.monotonic() + timeout
    pause = threading.Event()
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")
        pause.wait(every)


def until_ran_on(
    coordinator: Any,
    fn: Callable[..., tuple[int, Any]],
    args: tuple[Any, ...],
    worker: int,
    count: int = 8,
) -> list[Any]:
    """Schedules ``count`` calls of ``fn(*args)`` at a time, each returning ``(index of the
    worker it ran on, result)``, until some ran on ``worker``; those results, in order.

    A coordinator sees a restarted worker (its new incarnation) only once it sends it work,
    so this is how a test waits for a restart to be noticed and handled."""

    def ran_there() -> list[Any]:
        calls = [coordinator.schedule(fn, args=args) for _ in range(count)]
        return [result for index, result in coordinator.fetch(calls) if index == worker]

    return wait_until(ran_there, f"a closure on worker {worker}")  # type: ignore[no-any-return]


def wait_for_file(path: str | Path, timeout: float = WAIT_SECONDS) -> bool:
    """Runs anywhere: waits until ``path`` exists; ``False`` if it never does."""
    try:
        wait_until(lambda: os.path.exists(path), f"{path}", timeout=timeout, every=0.01)
    except AssertionError:
        return False
    return True


def record_run(directory: str, tag: str) -> None:
    """Runs on a worker: leaves one file per execution (counts at-least-once runs)."""
    name = f"{tag}.{os.getpid()}.{uuid.uuid4().hex}"
    Path(directory, name).touch()


def runs(directory: str | Path, tag: str | None = None) -> list[str]:
    """The execution markers written so far (all, or those of ``tag``)."""
    names = [p.name for p in Path(directory).iterdir()]
    if tag is None:
        return names
    return [n for n in names if n.split(".")[0] == tag]


def counted_square(directory: str, i: int) -> int:
    """Runs on a worker: records the execution and returns ``i * i``."""
    record_run(directory, f"sq{i}")
    return i * i


def gated_square(directory: str, i: int, gate: str) -> int:
    """Runs on a worker: records a start marker with the pid, waits for ``gate``, records
    the execution and returns ``i * i``."""
    Path(directory, f"started-{i}.{os.getpid()}").touch()
    if not wait_for_file(gate):
        raise TimeoutError(f"gate file {gate} never appeared")
    return counted_square(directory, i)


def barrier(directory: str, parties: int, timeout: float = WAIT_SECONDS) -> int:
    """Runs on a worker: arrives at a file barrier and waits until ``parties`` closures
    have arrived; returns the executing worker's index. Only closures running at the same
    time can all pass it."""
    from jaxcluster.coordinator import get_current_worker_index

    index = get_current_worker_index()
    Path(directory, f"arrived.{index}.{uuid.uuid4().hex}").touch()
    arrived = lambda: len(list(Path(directory).glob("arrived.*"))) >= parties  # noqa: E731
    wait_until(arrived, f"{parties} closures at the barrier", timeout=timeout, every=0.01)
    return index


def worker_status(cluster: Any, index: int) -> dict[str, Any]:
    """``GetStatus`` of one worker of a ``LocalCluster``."""
    from jaxcluster._native import core

    client = core.WorkerClient(cluster.addresses[index], auth_token=cluster.auth_token)
    return dict(client.get_status(timeout=10.0))


@contextmanager
def local_cluster(num_workers: int, **env: str) -> Iterator[Any]:
    """A ``LocalCluster`` whose workers can import the test modules."""
    from jaxcluster import LocalCluster

    path = os.pathsep.join(p for p in (str(TESTS_DIR), os.environ.get("PYTHONPATH")) if p)
    with LocalCluster(num_workers, env={"PYTHONPATH": path, **env}) as cluster:
        yield cluster


@contextmanager
def slice_cluster(num_workers: int, hosts_per_slice: int, devices_per_host: int) -> Iterator[Any]:
    """A ``LocalCluster`` of slices whose hosts can import the test modules, a slice host's
    death noticed in 3 s, and 120 s for a slice to form on a loaded machine."""
    from jaxcluster import LocalCluster

    path = os.pathsep.join(p for p in (str(TESTS_DIR), os.environ.get("PYTHONPATH")) if p)
    with LocalCluster(
        num_workers=num_workers,
        hosts_per_slice=hosts_per_slice,
        devices_per_host=devices_per_host,
        env={"PYTHONPATH": path},
        worker_args=["--slice-heartbeat-timeout", "3", "--slice-init-timeout", "120"],
    ) as cluster:
        yield cluster
