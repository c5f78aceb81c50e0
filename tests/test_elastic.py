"""Elastic workers: add_workers / remove_workers while closures run, and refresh_interval
following a (fake, real-JSON) Kubernetes API as pods come and go. Workers are real
processes on loopback; every closure is checked to end exactly once with its value."""

from __future__ import annotations

import json
import os
import socket
import threading
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from jaxcluster import errors
from jaxcluster.cluster_resolver import (
    KubernetesClusterResolver,
    SimpleClusterResolver,
    TFConfigClusterResolver,
)
from jaxcluster.cluster_spec import ClusterSpec
from jaxcluster.coordinator import ClusterCoordinator, get_current_worker_index
from support.closures import TESTS_DIR, local_cluster, wait_until
from support.k8s_api import FakeKubernetesAPI, write_kubeconfig
from support.workers import launch


def logged_square(directory: str, i: int) -> tuple[int, int]:
    """Runs on a worker: appends ``i`` to its process's log, returns ``(i * i, index)``."""
    fd = os.open(
        os.path.join(directory, f"{os.getpid()}.log"), os.O_WRONLY | os.O_APPEND | os.O_CREAT
    )
    try:
        os.write(fd, f"{i}\n".encode())
    finally:
        os.close(fd)
    return i * i, get_current_worker_index()


def starts(directory: Path) -> Counter[int]:
    counted: Counter[int] = Counter()
    for log in directory.glob("*.log"):
        counted.update(int(line) for line in log.read_text().split())
    return counted


def state_of(coordinator: ClusterCoordinator, index: int) -> str:
    return str(coordinator.metrics()["workers"][index]["state"])


def completed_on(coordinator: ClusterCoordinator, index: int) -> int:
    return int(coordinator.metrics()["workers"][index]["completed"])


class Producer(threading.Thread):
    """Schedules closures until stopped, at most ``window`` outstanding."""

    def __init__(self, coordinator: ClusterCoordinator, directory: Path, window: int = 64):
        super().__init__(daemon=True)
        self.coordinator, self.directory, self.window = coordinator, directory, window
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
                    self.coordinator.schedule(logged_square, args=(str(self.directory), i))
                )
        except BaseException as exc:  # re-raised by the test
            self.error = exc


def test_a_cluster_grows_from_2_to_4_and_shrinks_to_1_under_load(tmp_path: Path) -> None:
    with local_cluster(4) as cluster:
        addresses = list(cluster.addresses)
        resolver = SimpleClusterResolver(ClusterSpec({"worker": addresses[:2]}))
        with ClusterCoordinator(resolver, auth_token=cluster.auth_token) as coordinator:
            producer = Producer(coordinator, tmp_path)
            producer.start()
            wait_until(lambda: len(producer.values) > 100, "closures on 2 workers")
            assert coordinator.add_workers(addresses[2:]) == [2, 3]
            wait_until(
                lambda: completed_on(coordinator, 2) > 0 and completed_on(coordinator, 3) > 0,
                "closures on the added workers",
            )
            # By address and by index, mixed.
            coordinator.remove_workers([addresses[0], 1, addresses[2]])
            assert [state_of(coordinator, i) for i in range(4)] == [
                "removed",
                "removed",
                "removed",
                "up",
            ]
            done_before = {i: completed_on(coordinator, i) for i in (0, 1, 2)}
            seen = completed_on(coordinator, 3)
            wait_until(lambda: completed_on(coordinator, 3) > seen + 100, "worker 3 alone")
            producer.stopped.set()
            producer.join(timeout=120)
            assert producer.error is None, producer.error
            coordinator.join()
            results = [value.fetch() for value in producer.values]
            # Nothing ran on a removed worker after its removal returned.
            assert {i: completed_on(coordinator, i) for i in (0, 1, 2)} == done_before
            assert "1 workers" in repr(coordinator)
            assert coordinator.metrics()["retried"] == 0
    assert [square for square, _ in results] == [i * i for i in range(len(results))]
    assert {index for _, index in results} == {0, 1, 2, 3}
    counted = starts(tmp_path)
    assert sorted(counted) == list(range(len(results)))
    assert set(counted.values()) == {1}, "a closure ran twice although no worker failed"


def make_dataset() -> Any:
    from jaxcluster.coordinator import get_current_worker_index

    return iter(range(get_current_worker_index() * 1000, get_current_worker_index() * 1000 + 500))


def next_with_index(iterator: Any) -> tuple[int, int]:
    return next(iterator), get_current_worker_index()


def test_an_added_worker_builds_the_per_worker_dataset_and_a_removed_one_releases_state(
    tmp_path: Path,
) -> None:
    with local_cluster(2) as cluster:
        addresses = list(cluster.addresses)
        resolver = SimpleClusterResolver(ClusterSpec({"worker": addresses[:1]}))
        with ClusterCoordinator(resolver, auth_token=cluster.auth_token) as coordinator:
            iterators = iter(coordinator.create_per_worker_dataset(make_dataset))
            state = coordinator.create_per_worker_state(lambda: {"w": 1.0})
            assert coordinator.add_workers([addresses[1]]) == [1]
            seen: dict[int, list[int]] = {0: [], 1: []}

            def ran_on_both() -> bool:
                batch = [coordinator.schedule(next_with_index, args=(iterators,)) for _ in range(8)]
                for value, index in coordinator.fetch(batch):
                    seen[index].append(value)
                return bool(seen[0] and seen[1])

            wait_until(ran_on_both, "closures on both workers")
            # Each worker advanced its own iterator, built there.
            assert all(v < 500 for v in seen[0]) and all(1000 <= v < 1500 for v in seen[1])
            assert state.fetch(1) == {"w": 1.0}
            coordinator.remove_workers([1])
            with pytest.raises(errors.AbortedError, match="was removed"):
                state.fetch(1)
            assert state.fetch() == [{"w": 1.0}, None]
            # The worker process still runs, and no longer holds the resources.
            status = cluster_worker_status(cluster, 1)
            assert status["resources_created"] == status["resources_released"] > 0, status
            _, index = coordinator.schedule(next_with_index, args=(iterators,)).fetch()
            assert index == 0


def cluster_worker_status(cluster: Any, index: int) -> dict[str, Any]:
    from support.closures import worker_status

    return worker_status(cluster, index)


def test_bad_membership_changes_are_refused_and_change_nothing() -> None:
    with local_cluster(2) as cluster:
        addresses = list(cluster.addresses)
        resolver = SimpleClusterResolver(ClusterSpec({"worker": addresses}))
        with ClusterCoordinator(resolver, auth_token=cluster.auth_token) as coordinator:
            with pytest.raises(ValueError, match="already serve"):
                coordinator.add_workers([addresses[0]])
            with pytest.raises(ValueError, match="not a worker address"):
                coordinator.add_workers(["no-port"])
            with pytest.raises(ValueError, match="no worker of this coordinator is at"):
                coordinator.remove_workers(["127.0.0.1:1"])
            with pytest.raises(ValueError, match="there is no worker 5"):
                coordinator.remove_workers([5])
            with pytest.raises(ValueError, match="no worker able to run closures"):
                coordinator.remove_workers([0, 1])
            assert [state_of(coordinator, i) for i in range(2)] != ["removed", "removed"]
            coordinator.remove_workers(addresses[1])
            with pytest.raises(ValueError, match="already removed"):
                coordinator.remove_workers([1])
            # A removed worker can come back: as a new worker, with a new index.
            assert coordinator.add_workers([addresses[1]]) == [2]
            assert coordinator.schedule(lambda: 7).fetch() == 7


# --- refresh_interval against the fake Kubernetes API ----------------------------------


def _free_port_on(hosts: list[str]) -> int:
    """A port free on every one of ``hosts`` (loopback addresses)."""
    for _ in range(50):
        with socket.socket() as probe:
            probe.bind((hosts[0], 0))
            port = int(probe.getsockname()[1])
        try:
            for host in hosts[1:]:
                with socket.socket() as other:
                    other.bind((host, port))
        except OSError:
            continue
        return port
    raise AssertionError(f"no port free on all of {hosts}")


@pytest.fixture
def pod_workers() -> Iterator[tuple[int, list[str]]]:
    """Three workers on 127.0.0.1-3, one port: what three pods of one Deployment are."""
    hosts = ["127.0.0.1", "127.0.0.2", "127.0.0.3"]
    port = _free_port_on(hosts)
    # The closures are this module's functions, pickled by reference: workers import them.
    path = os.pathsep.join(p for p in (str(TESTS_DIR), os.environ.get("PYTHONPATH")) if p)
    procs = [
        launch(
            ["--address", f"{host}:{port}", "--index", str(i)],
            token="pod-token",
            env={"PYTHONPATH": path},
        )
        for i, host in enumerate(hosts)
    ]
    try:
        for proc in procs:
            proc.wait_listening()
        yield port, hosts
    finally:
        for proc in procs:
            proc.finish(kill=True)


def test_refresh_interval_follows_pods_as_they_are_added_and_deleted(
    pod_workers: tuple[int, list[str]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    port, hosts = pod_workers
    with FakeKubernetesAPI(token="k8s-token") as api:
        monkeypatch.setenv("KUBECONFIG", str(write_kubeconfig(tmp_path / "kubeconfig", api)))
        labels = {"job-name": "tensorflow"}
        api.add_pod("trainer-0", labels, pod_ip=hosts[0])
        api.add_pod("trainer-1", labels, pod_ip=hosts[1])
        resolver = KubernetesClusterResolver(tf_server_port=port)
        with ClusterCoordinator(
            resolver, auth_token="pod-token", refresh_interval=0.2
        ) as coordinator:
            producer = Producer(coordinator, tmp_path / "runs", window=16)
            (tmp_path / "runs").mkdir()
            producer.start()
            api.add_pod("trainer-2", labels, pod_ip=hosts[2])
            wait_until(
                lambda: (
                    len(coordinator.metrics()["workers"]) == 3 and completed_on(coordinator, 2) > 0
                ),
                "the new pod's worker added and running closures",
            )
            assert coordinator.metrics()["workers"][2]["address"] == f"{hosts[2]}:{port}"
            api.delete_pod("trainer-0")
            wait_until(lambda: state_of(coordinator, 0) == "removed", "trainer-0 removed")
            seen = completed_on(coordinator, 1) + completed_on(coordinator, 2)
            wait_until(
                lambda: completed_on(coordinator, 1) + completed_on(coordinator, 2) > seen + 50,
                "closures on the remaining pods",
            )
            # An API outage keeps the workers as they are.
            api.set_forbidden(True)
            forbidden_from = len(api.requests)
            wait_until(lambda: len(api.requests) > forbidden_from + 2, "refreshes while 403")
            assert [state_of(coordinator, i) for i in (1, 2)] == ["up", "up"]
            producer.stopped.set()
            producer.join(timeout=120)
            assert producer.error is None, producer.error
            coordinator.join()
            results = [value.fetch() for value in producer.values]
    assert [square for square, _ in results] == [i * i for i in range(len(results))]
    counted = starts(tmp_path / "runs")
    assert sorted(counted) == list(range(len(results)))
    assert set(counted.values()) == {1}


def worker_index_and_flag() -> tuple[int, int]:
    """Runs on a worker: the coordinator's index for it, and its own ``--index``."""
    import sys

    flag = int(sys.argv[sys.argv.index("--index") + 1]) if "--index" in sys.argv else -1
    return get_current_worker_index(), flag


def test_closures_see_the_coordinators_index_not_the_workers_flag() -> None:
    with local_cluster(2) as cluster:
        swapped = list(reversed(cluster.addresses))
        resolver = SimpleClusterResolver(ClusterSpec({"worker": swapped}))
        with ClusterCoordinator(resolver, auth_token=cluster.auth_token) as coordinator:
            seen: set[tuple[int, int]] = set()

            def both() -> bool:
                batch = [coordinator.schedule(worker_index_and_flag) for _ in range(8)]
                seen.update(coordinator.fetch(batch))
                return len(seen) == 2

            wait_until(both, "closures on both workers")
    # Coordinator worker 0 is the process started as --index 1, and the other way round.
    assert seen == {(0, 1), (1, 0)}


def test_refresh_interval_follows_a_rewritten_tf_config_file(tmp_path: Path) -> None:
    def write(workers: list[str]) -> None:
        staged = tmp_path / "tf_config.json.new"
        staged.write_text(json.dumps({"cluster": {"worker": workers}}))
        os.replace(staged, tmp_path / "tf_config.json")  # as a ConfigMap update swaps it

    with local_cluster(2) as cluster:
        first, second = cluster.addresses
        write([first])
        resolver = TFConfigClusterResolver(tf_config_file=tmp_path / "tf_config.json")
        with ClusterCoordinator(
            resolver, auth_token=cluster.auth_token, refresh_interval=0.2
        ) as coordinator:
            write([first, second])
            wait_until(
                lambda: len(coordinator.metrics()["workers"]) == 2, "the second worker added"
            )
            write([second])
            wait_until(lambda: state_of(coordinator, 0) == "removed", "the first worker removed")
            values = [coordinator.schedule(worker_index_and_flag) for _ in range(20)]
            assert {index for index, _ in coordinator.fetch(values)} == {1}


def test_a_refresh_brings_back_a_given_up_worker_the_resolver_still_lists(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("JAXCLUSTER_WORKER_RECOVERY_SEC", "1")
    with local_cluster(2) as cluster:
        (tmp_path / "tf_config.json").write_text(
            json.dumps({"cluster": {"worker": cluster.addresses}})
        )
        resolver = TFConfigClusterResolver(tf_config_file=tmp_path / "tf_config.json")
        with ClusterCoordinator(
            resolver, auth_token=cluster.auth_token, refresh_interval=0.2
        ) as coordinator:
            # Both links hold an open stream: a link that never had one notices a dead
            # worker only when it has a closure to send.
            wait_until(
                lambda: (
                    {
                        index
                        for index, _ in coordinator.fetch(
                            [coordinator.schedule(worker_index_and_flag) for _ in range(8)]
                        )
                    }
                    == {0, 1}
                ),
                "closures on both workers",
            )
            cluster.kill_worker(1)
            wait_until(lambda: state_of(coordinator, 1) == "given_up", "worker 1 given up")
            cluster.restart_worker(1)
            wait_until(lambda: state_of(coordinator, 1) == "removed", "worker 1 rejoined")
            wait_until(lambda: state_of(coordinator, 2) == "up", "worker 1 back as worker 2")
            # While it was down it stayed given up: one new index, not one per refresh.
            assert len(coordinator.metrics()["workers"]) == 3
            values = coordinator.fetch(
                [coordinator.schedule(worker_index_and_flag) for _ in range(40)]
            )
            assert {index for index, _ in values} <= {0, 2}
            wait_until(
                lambda: (
                    2
                    in {
                        index
                        for index, _ in coordinator.fetch(
                            [coordinator.schedule(worker_index_and_flag) for _ in range(8)]
                        )
                    }
                ),
                "a closure on the worker that came back",
            )


def test_given_up_workers_are_probed_at_once_not_one_after_another(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A refresh probes every given-up worker the resolver still lists; most are usually
    # still down, and each probe may wait its whole timeout. Each probe here waits for all
    # the others to have started: probed one after another, none would get past the barrier.
    from jaxcluster.coordinator.elastic import Membership

    addresses = [f"10.9.0.{i}:8470" for i in range(6)]
    barrier = threading.Barrier(len(addresses), timeout=60)
    probed: list[str] = []

    def answers(self: Membership, address: str, timeout: float = 5.0) -> bool:
        probed.append(address)
        barrier.wait()
        return address.endswith((".1:8470", ".4:8470"))

    monkeypatch.setattr(Membership, "answers", answers)
    membership = Membership(None, addresses, None, None)
    assert membership.answering(addresses) == ["10.9.0.1:8470", "10.9.0.4:8470"]
    assert sorted(probed) == sorted(addresses)
    assert membership.answering([]) == []


def test_answering_tells_a_serving_worker_from_a_closed_port() -> None:
    from jaxcluster.coordinator.elastic import Membership

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed = f"127.0.0.1:{s.getsockname()[1]}"
    with local_cluster(1) as cluster:
        live = cluster.addresses[0]
        assert Membership(None, [], cluster.auth_token, None).answering([closed, live]) == [live]
        # Without the token the worker refuses the probe: not counted as serving.
        assert Membership(None, [], None, None).answering([live]) == []
