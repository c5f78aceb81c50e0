"""Workers killed with SIGKILL between and during closures: nothing scheduled is lost.

Every closure records each execution as a file, so executions by worker incarnations that
died are counted too: at-least-once means every closure ran at least once, and every
RemoteValue holds the right value.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from jaxcluster.coordinator import ClusterCoordinator, RemoteValue, get_current_worker_index
from support.closures import (
    counted_square,
    gated_square,
    local_cluster,
    runs,
    wait_for_file,
    wait_until,
)


def _worker_index() -> int:
    return get_current_worker_index()


def _schedule_squares(
    coordinator: ClusterCoordinator, directory: Path, numbers: range, gate: Path | None = None
) -> list[RemoteValue]:
    if gate is None:
        return [coordinator.schedule(counted_square, args=(str(directory), i)) for i in numbers]
    return [
        coordinator.schedule(gated_square, args=(str(directory), i, str(gate))) for i in numbers
    ]


def _check_squares(directory: Path, numbers: range, rvs: list[RemoteValue]) -> None:
    assert [rv.fetch() for rv in rvs] == [i * i for i in numbers]
    for i in numbers:
        assert runs(directory, f"sq{i}"), f"closure {i} never ran to completion"
    total = sum(len(runs(directory, f"sq{i}")) for i in numbers)
    assert total >= len(numbers)


def _wait_used(coordinator: ClusterCoordinator, index: int, num_workers: int) -> None:
    """Schedules small batches until worker ``index`` runs one of them."""

    def used() -> bool:
        batch = [coordinator.schedule(_worker_index) for _ in range(2 * num_workers)]
        return index in coordinator.fetch(batch)

    wait_until(used, f"worker {index} to run closures again", every=0.05)


def _started_on(directory: Path, pid: int) -> bool:
    return any(directory.glob(f"started-*.{pid}"))


def _kill_mid_closure(cluster: Any, index: int, directory: Path) -> None:
    pid = cluster.worker_pid(index)
    wait_until(lambda: _started_on(directory, pid), f"worker {index} to start a closure")
    cluster.kill_worker(index)


@pytest.mark.parametrize("num_workers", [2, 4])
def test_killed_between_closures(num_workers: int, tmp_path: Path) -> None:
    with local_cluster(num_workers) as cluster, cluster.coordinator() as coordinator:
        first = _schedule_squares(coordinator, tmp_path, range(0, 20))
        assert coordinator.join() is True
        cluster.kill_worker(1)
        second = _schedule_squares(coordinator, tmp_path, range(20, 60))
        assert coordinator.join() is True
        _check_squares(tmp_path, range(0, 20), first)
        _check_squares(tmp_path, range(20, 60), second)
        cluster.restart_worker(1)
        _wait_used(coordinator, 1, num_workers)
        metrics = coordinator.metrics()
        assert metrics["worker_failures"] >= 1
        assert metrics["workers"][1]["state"] == "up"


@pytest.mark.parametrize("num_workers", [2, 4])
def test_killed_mid_closure(num_workers: int, tmp_path: Path) -> None:
    gate = tmp_path / "gate"
    with local_cluster(num_workers) as cluster, cluster.coordinator() as coordinator:
        rvs = _schedule_squares(coordinator, tmp_path, range(3 * num_workers), gate)
        _kill_mid_closure(cluster, 1, tmp_path)
        gate.touch()
        assert coordinator.join() is True
        _check_squares(tmp_path, range(3 * num_workers), rvs)
        # The closure worker 1 was running started again elsewhere.
        started = [p.name.split(".")[0] for p in tmp_path.glob("started-*")]
        assert len(started) > len(set(started))
        assert coordinator.metrics()["retried"] >= 1


def test_a_worker_killed_twice(tmp_path: Path) -> None:
    with local_cluster(2) as cluster, cluster.coordinator() as coordinator:
        for round_ in range(2):
            directory = tmp_path / f"round{round_}"
            directory.mkdir()
            gate = directory / "gate"
            rvs = _schedule_squares(coordinator, directory, range(8), gate)
            _kill_mid_closure(cluster, 1, directory)
            gate.touch()
            assert coordinator.join() is True
            _check_squares(directory, range(8), rvs)
            cluster.restart_worker(1)
            _wait_used(coordinator, 1, 2)
        assert coordinator.metrics()["worker_failures"] >= 2


def test_two_workers_killed(tmp_path: Path) -> None:
    gate = tmp_path / "gate"
    with local_cluster(4) as cluster, cluster.coordinator() as coordinator:
        rvs = _schedule_squares(coordinator, tmp_path, range(16), gate)
        _kill_mid_closure(cluster, 1, tmp_path)
        _kill_mid_closure(cluster, 2, tmp_path)
        gate.touch()
        assert coordinator.join() is True
        _check_squares(tmp_path, range(16), rvs)
        more = _schedule_squares(coordinator, tmp_path, range(16, 40))
        assert coordinator.join() is True
        _check_squares(tmp_path, range(16, 40), more)


def slow_to_rebuild(directory: str) -> Iterator[int]:
    """A dataset_fn whose builds block while ``hold`` exists, until ``release`` does."""
    import os

    Path(directory, f"building.{os.getpid()}").touch()
    if Path(directory, "hold").exists() and not wait_for_file(Path(directory, "release")):
        raise TimeoutError("release never appeared")
    return iter(range(1_000_000))


def test_killed_while_per_worker_iterators_are_rebuilt(tmp_path: Path) -> None:
    builds = tmp_path / "builds"
    builds.mkdir()
    with local_cluster(2) as cluster, cluster.coordinator() as coordinator:
        dataset = coordinator.create_per_worker_dataset(lambda: slow_to_rebuild(str(builds)))
        iterator = iter(dataset)
        assert coordinator.fetch([coordinator.schedule(next, args=(iterator,)) for _ in range(8)])
        (builds / "hold").touch()
        cluster.kill_worker(1)
        cluster.restart_worker(1)
        pid = cluster.worker_pid(1)
        # The link finds the new incarnation when it next has work, and rebuilds the
        # iterator there (blocked by "hold") before serving; kill the worker right then.
        rvs = [coordinator.schedule(next, args=(iterator,)) for _ in range(20)]
        wait_until(lambda: (builds / f"building.{pid}").exists(), "the rebuild to start")
        cluster.kill_worker(1)
        (builds / "release").touch()
        assert coordinator.join() is True
        assert all(isinstance(v, int) for v in coordinator.fetch(rvs))
        cluster.restart_worker(1)
        wait_until(lambda: iterator.state(1) == "ready", "worker 1's iterator to be rebuilt")
        _wait_used(coordinator, 1, 2)
        assert coordinator.schedule(next, args=(iterator,)).fetch() >= 0


def test_a_worker_that_never_returns_is_given_up(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("JAXCLUSTER_WORKER_RECOVERY_SEC", "2")
    gate = tmp_path / "gate"
    with local_cluster(2) as cluster, cluster.coordinator() as coordinator:
        rvs = _schedule_squares(coordinator, tmp_path, range(6), gate)
        _kill_mid_closure(cluster, 1, tmp_path)
        gate.touch()
        assert coordinator.join() is True
        _check_squares(tmp_path, range(6), rvs)
        wait_until(lambda: coordinator.workers[1]["state"] == "given_up", "worker 1 to be given up")
        later = _schedule_squares(coordinator, tmp_path, range(6, 20))
        assert coordinator.join() is True
        _check_squares(tmp_path, range(6, 20), later)
        assert coordinator.workers[0]["state"] == "up"


def test_a_coordinator_made_while_a_worker_is_down(tmp_path: Path) -> None:
    with local_cluster(2) as cluster:
        cluster.kill_worker(1)
        with cluster.coordinator() as coordinator:  # neither blocks nor raises
            assert coordinator.workers[1]["state"] == "recovering"
            rvs = _schedule_squares(coordinator, tmp_path, range(10))
            assert coordinator.join() is True
            _check_squares(tmp_path, range(10), rvs)
            cluster.restart_worker(1)
            _wait_used(coordinator, 1, 2)


def test_a_worker_killed_before_its_first_closure_is_seen_down_without_work() -> None:
    """An idle worker's death shows in ``coordinator.workers`` (a dashboard's view) when its
    connection breaks, not only once a closure is sent to it: the link opens its stream as
    soon as the worker comes up, before there is any work, and watches it. After the worker
    is back, the watch is set up again, so a second death is seen the same way."""
    with local_cluster(2) as cluster, cluster.coordinator() as coordinator:
        wait_until(
            lambda: [w["state"] for w in coordinator.workers] == ["up", "up"],
            "both workers to be up",
        )
        for death in range(2):
            cluster.kill_worker(1)
            wait_until(
                lambda: coordinator.workers[1]["state"] != "up",
                f"the idle worker's death {death + 1} to show, with nothing scheduled",
                timeout=30.0,
            )
            assert coordinator.workers[0]["state"] == "up"
            assert coordinator.metrics()["completed"] == 0
            cluster.restart_worker(1)
            wait_until(lambda: coordinator.workers[1]["state"] == "up", "worker 1 to be back")
        assert coordinator.metrics()["worker_failures"] >= 2
        assert coordinator.fetch(coordinator.schedule(_worker_index)) in (0, 1)
