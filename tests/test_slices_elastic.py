"""Elastic slices: a sliced coordinator (3 slices x 2 host processes x 2 forced CPU
devices) loses one slice while closures run, goes on with two, takes it back and serves
on three; and refresh_interval follows a rewritten TF_CONFIG whose host list grows and
shrinks by whole slices. Every closure is checked to end exactly once, on every host of
one slice."""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from jaxcluster import LocalCluster
from jaxcluster.cluster_resolver import TFConfigClusterResolver
from jaxcluster.coordinator import ClusterCoordinator, get_current_worker_index
from support.closures import TESTS_DIR, wait_until

HOSTS, DEVICES, SLICES = 2, 2, 3
pytestmark = pytest.mark.timeout(600)


def slice_dataset() -> Iterator[tuple[int, int]]:
    """A dataset_fn: yields ``(the slice's index as this host sees it, n)``."""
    index = get_current_worker_index()
    return ((index, n) for n in range(10**7))


def logged_on_slice(directory: str, i: int, iterator: Iterator[tuple[int, int]]) -> int:
    """Runs on every host of a slice: appends ``rank index dataset-index`` to closure
    ``i``'s log; returns the slice's index."""
    import jax

    index = get_current_worker_index()
    built_for, _ = next(iterator)
    fd = os.open(os.path.join(directory, f"{i}.log"), os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    try:
        os.write(fd, f"{jax.process_index()} {index} {built_for}\n".encode())
    finally:
        os.close(fd)
    return index


def where() -> int:
    return get_current_worker_index()


class Producer(threading.Thread):
    """Schedules ``logged_on_slice`` until stopped, at most ``window`` outstanding."""

    def __init__(self, coordinator: ClusterCoordinator, directory: Path, window: int = 16):
        super().__init__(daemon=True)
        self.coordinator, self.directory, self.window = coordinator, directory, window
        self.iterator = iter(coordinator.create_per_worker_dataset(slice_dataset))
        self.values: list[Any] = []
        self.stopped = threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            while not self.stopped.is_set():
                i = len(self.values)
                if i >= self.window:
                    self.values[i - self.window].fetch()
                self.values.append(
                    self.coordinator.schedule(
                        logged_on_slice, args=(str(self.directory), i, self.iterator)
                    )
                )
        except BaseException as exc:  # re-raised by the test
            self.error = exc


@pytest.fixture(scope="module")
def cluster() -> Iterator[LocalCluster]:
    path = os.pathsep.join(p for p in (str(TESTS_DIR), os.environ.get("PYTHONPATH")) if p)
    with LocalCluster(
        num_workers=SLICES * HOSTS,
        hosts_per_slice=HOSTS,
        devices_per_host=DEVICES,
        env={"PYTHONPATH": path},
        worker_args=["--slice-init-timeout", "120"],
    ) as local:
        yield local


def completed_on(coordinator: ClusterCoordinator, index: int) -> int:
    return int(coordinator.metrics()["workers"][index]["completed"])


def state_of(coordinator: ClusterCoordinator, index: int) -> str:
    return str(coordinator.metrics()["workers"][index]["state"])


def test_a_slice_leaves_while_closures_run_and_joins_again(
    cluster: LocalCluster, tmp_path: Path
) -> None:
    slices = cluster.slices
    with cluster.coordinator() as coordinator:
        producer = Producer(coordinator, tmp_path)
        producer.start()
        wait_until(
            lambda: all(completed_on(coordinator, i) > 0 for i in range(SLICES)),
            "closures on all three slices",
            timeout=240,
        )
        # Naming the rank-1 host of slice 2 removes that slice, whole.
        coordinator.remove_workers(slices[2][1])
        assert [state_of(coordinator, i) for i in range(SLICES)] == ["up", "up", "removed"]
        done_on_removed = completed_on(coordinator, 2)
        counts = {i: completed_on(coordinator, i) for i in (0, 1)}
        wait_until(
            lambda: all(completed_on(coordinator, i) > n + 20 for i, n in counts.items()),
            "closures going on on the two slices left",
        )
        # The same hosts join again as a new slice index; its dataset is built anew.
        assert coordinator.add_workers(slices[2]) == [3]
        assert coordinator.slices[3] == slices[2]
        wait_until(lambda: completed_on(coordinator, 3) > 20, "closures on the returned slice")
        assert all(state_of(coordinator, i) == "up" for i in (0, 1, 3))
        producer.stopped.set()
        producer.join(timeout=120)
        assert producer.error is None, producer.error
        coordinator.join()
        results = [value.fetch() for value in producer.values]
        # Nothing ran on the removed slice after its removal returned.
        assert completed_on(coordinator, 2) == done_on_removed
        assert coordinator.metrics()["retried"] == 0
    assert set(results) == {0, 1, 2, 3}
    for i, index in enumerate(results):
        lines = sorted((tmp_path / f"{i}.log").read_text().split("\n")[:-1])
        # Exactly once, on both hosts of one slice, each reading that slice's dataset.
        assert lines == [f"{rank} {index} {index}" for rank in range(HOSTS)], (i, lines)
    assert len(list(tmp_path.glob("*.log"))) == len(results)


def test_refresh_interval_grows_and_shrinks_by_whole_slices(
    cluster: LocalCluster, tmp_path: Path
) -> None:
    def write(hosts: list[str]) -> None:
        staged = tmp_path / "tf_config.json.new"
        staged.write_text(json.dumps({"cluster": {"worker": hosts}}))
        os.replace(staged, tmp_path / "tf_config.json")  # as a ConfigMap update swaps it

    slices = cluster.slices
    write(slices[0] + slices[1])
    resolver = TFConfigClusterResolver(tf_config_file=tmp_path / "tf_config.json")
    with ClusterCoordinator(
        resolver, auth_token=cluster.auth_token, hosts_per_slice=HOSTS, refresh_interval=0.2
    ) as coordinator:
        assert coordinator.slices == slices[:2]
        write(slices[0] + slices[1] + slices[2])
        wait_until(lambda: coordinator.slices == slices, "the third slice added", timeout=60)

        def serving() -> set[int]:
            return set(coordinator.fetch([coordinator.schedule(where) for _ in range(12)]))

        wait_until(lambda: serving() == {0, 1, 2}, "closures on all three slices", timeout=240)
        write(slices[0] + slices[2])  # slice 1's hosts are gone
        wait_until(lambda: state_of(coordinator, 1) == "removed", "slice 1 removed", timeout=60)
        assert coordinator.slices == slices  # by index: slice 1 keeps its hosts, removed

        def only_two() -> bool:
            seen = serving()
            assert seen <= {0, 2}, seen  # never the removed slice
            return seen == {0, 2}

        wait_until(only_two, "closures on the two slices listed")
