"""Kept results on real workers (issue 26 part 2): ``keep_result=True``, consumers on the
holder (no bytes move) or elsewhere (bytes move worker to worker), garbage-collected values
released, and lineage when the holder is SIGKILLed before or after its consumer started.

Byte counters are the workers' own (``GetStatus``: ``peer_bytes_sent`` /
``peer_bytes_received``); the coordinator receives only ``KeptInfo`` and small results.
"""

from __future__ import annotations

import gc
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from jaxcluster.coordinator import ClusterCoordinator
from support.closures import barrier, local_cluster, record_run, runs, wait_for_file, wait_until

MIB = 1 << 20


def _ones(directory: str, tag: str, n: int) -> Any:
    """Runs on a worker: records the run, returns ``n`` float32 ones."""
    record_run(directory, tag)
    return np.ones(n, np.float32)


def _ones_at_barrier(directory: str, n: int) -> Any:
    """Runs on a worker: both producers pass the barrier together, so on two workers."""
    barrier(directory, 2)
    return np.ones(n, np.float32)


def _total(*arrays: Any) -> float:
    return float(sum(float(a.sum()) for a in arrays))


def _gated_total(directory: str, gate: str, array: Any) -> float:
    """Runs on a worker: marks its start, waits for ``gate``, sums ``array``."""
    record_run(directory, "consumer")
    Path(directory, f"started.{os.getpid()}").touch()
    assert wait_for_file(gate), f"{gate} never appeared"
    return float(array.sum())


def _peer(cluster: Any) -> list[dict[str, int]]:
    from support.closures import worker_status

    keys = ("peer_bytes_sent", "peer_bytes_received")
    return [{k: int(worker_status(cluster, i)[k]) for k in keys} for i in range(2)]


def _session_bytes(coordinator: ClusterCoordinator, worker: int) -> int:
    report = coordinator.workers[worker].report
    sessions = [] if report is None else report.sessions
    return sum(s.bytes for s in sessions if s.id == coordinator.session_id)


@pytest.fixture(scope="module")
def cluster() -> Iterator[Any]:
    with local_cluster(2) as c:
        yield c


@pytest.fixture(scope="module")
def coordinator(cluster: Any) -> Iterator[ClusterCoordinator]:
    with cluster.coordinator(error_policy="per_closure") as c:
        yield c


def test_a_kept_value_reports_its_spec_and_stays_for_a_chain(
    coordinator: ClusterCoordinator, cluster: Any, tmp_path: Path
) -> None:
    before = _peer(cluster)
    rv = coordinator.schedule(_ones, args=(str(tmp_path), "p", MIB), keep_result=True)
    assert rv.kept and rv.nbytes == 4 * MIB
    assert tuple(rv.spec.shape) == (MIB,) and str(rv.spec.dtype) == "float32"
    holder = rv.worker
    for _ in range(3):  # each stage runs on the free holder of its input
        rv = coordinator.schedule(lambda x: x + 1, args=(rv,), keep_result=True)
        assert rv.nbytes == 4 * MIB and rv.worker == holder
    total = coordinator.schedule(_total, args=(rv,))
    assert total.fetch() == 4.0 * MIB
    assert _peer(cluster) == before  # nothing moved between workers
    np.testing.assert_array_equal(rv.fetch()[:3], [4, 4, 4])  # pulled on demand


def _plus_one(array: Any) -> Any:
    return array + 1.0


def test_consumers_stay_on_their_holder_while_releases_are_pending(
    coordinator: ClusterCoordinator, cluster: Any, tmp_path: Path
) -> None:
    """A kept value made and dropped at once leaves a release queued for its holder when
    the next consumer is placed: a release is not work to queue behind, so each consumer
    still runs where its input lies and no byte moves between workers. (It ran elsewhere and
    pulled its input; on a GPU worker that copied the array off the device.)"""
    base = coordinator.schedule(_ones, args=(str(tmp_path), "p", MIB), keep_result=True)
    assert base.nbytes == 4 * MIB
    holder = base.worker
    before = _peer(cluster)
    for step in range(5):
        dropped = []
        for _ in range(20):  # each made on the holder: it is free once the last one ended
            dropped.append(coordinator.schedule(_plus_one, args=(base,), keep_result=True))
            assert dropped[-1].nbytes == 4 * MIB
        del dropped
        gc.collect()  # 20 releases queued for the holder, sent one by one
        total = coordinator.schedule(_total, args=(base,))
        assert total.fetch(timeout=60) == float(MIB)
        assert total.worker == holder, f"step {step} ran on {total.worker}, not the holder"
    after = _peer(cluster)
    received = [
        a["peer_bytes_received"] - b["peer_bytes_received"]
        for a, b in zip(after, before, strict=True)
    ]
    assert received == [0, 0]


def test_fetching_a_kept_value_reads_it_from_its_holder_and_counts_its_bytes(
    coordinator: ClusterCoordinator, cluster: Any, tmp_path: Path
) -> None:
    from support.closures import worker_status

    rv = coordinator.schedule(_ones, args=(str(tmp_path), "f", MIB), keep_result=True)
    assert rv.nbytes == 4 * MIB
    holder = rv.worker
    assert holder is not None
    before = coordinator.metrics()
    served = int(worker_status(cluster, holder)["peer_reads_served"])
    np.testing.assert_array_equal(rv.fetch(timeout=60), np.ones(MIB, np.float32))
    after = coordinator.metrics()
    assert after["kept_values_fetched"] == before["kept_values_fetched"] + 1
    fetched = after["kept_bytes_fetched"] - before["kept_bytes_fetched"]
    assert 4 * MIB <= fetched < 4 * MIB + 4096  # the array and a small pickle
    assert after["completed"] == before["completed"]  # read, not a closure run for it
    assert int(worker_status(cluster, holder)["peer_reads_served"]) == served + 1


def test_fan_in_runs_on_the_bigger_holder_and_pulls_the_rest_peer_to_peer(
    coordinator: ClusterCoordinator, cluster: Any, tmp_path: Path
) -> None:
    small = coordinator.schedule(_ones_at_barrier, args=(str(tmp_path), MIB), keep_result=True)
    big = coordinator.schedule(_ones_at_barrier, args=(str(tmp_path), 4 * MIB), keep_result=True)
    assert (small.nbytes, big.nbytes) == (4 * MIB, 16 * MIB)  # waits for both
    assert {small.worker, big.worker} == {0, 1}
    before = _peer(cluster)
    total = coordinator.schedule(lambda d, s: _total(d["b"][0], s), args=({"b": [big]}, small))
    assert total.fetch(timeout=60) == 5.0 * MIB
    assert total.worker == big.worker
    after = _peer(cluster)
    moved_in = after[big.worker]["peer_bytes_received"] - before[big.worker]["peer_bytes_received"]
    moved_out = after[small.worker]["peer_bytes_sent"] - before[small.worker]["peer_bytes_sent"]
    assert 4 * MIB <= moved_in < 4 * MIB + 64 * 1024  # the small value, worker to worker
    assert moved_out == moved_in


def _jax_ones_at_barrier(directory: str, n: int) -> Any:
    """Runs on a worker: as ``_ones_at_barrier``, a ``jax.Array``."""
    import jax.numpy as jnp

    barrier(directory, 2)
    return {"jax": jnp.ones(n, jnp.float32), "numpy": np.ones(2, np.float32)}


def _kinds(big: Any, small: Any) -> tuple[str, str, str, float]:
    """Runs on a worker: what kind of value each input arrived as, and their sum."""
    import jax

    def kind(x: Any) -> str:
        return "jax" if isinstance(x, jax.Array) else type(x).__name__

    total = float(big["jax"].sum() + small["jax"].sum() + small["numpy"].sum())
    return kind(big["jax"]), kind(small["jax"]), kind(small["numpy"]), total


def test_a_pulled_value_arrives_as_it_was_kept(
    coordinator: ClusterCoordinator, cluster: Any, tmp_path: Path
) -> None:
    """A jax.Array kept on one worker and pulled by another arrives as a jax.Array (on the
    puller's default device), as it does on its holder, and a numpy leaf as numpy; the
    coordinator's fetch() still returns numpy."""
    small = coordinator.schedule(_jax_ones_at_barrier, args=(str(tmp_path), MIB), keep_result=True)
    big = coordinator.schedule(
        _jax_ones_at_barrier, args=(str(tmp_path), 4 * MIB), keep_result=True
    )
    assert small.nbytes < big.nbytes
    assert {small.worker, big.worker} == {0, 1}
    before = _peer(cluster)
    kinds = coordinator.schedule(_kinds, args=(big, small))
    assert kinds.fetch(timeout=60) == ("jax", "jax", "ndarray", 5.0 * MIB + 2)
    assert kinds.worker == big.worker  # the small value was pulled
    after = _peer(cluster)
    assert (
        after[big.worker]["peer_bytes_received"] - before[big.worker]["peer_bytes_received"]
        >= 4 * MIB
    )
    fetched = small.fetch(timeout=60)
    assert type(fetched["jax"]) is np.ndarray and type(fetched["numpy"]) is np.ndarray
    np.testing.assert_array_equal(fetched["jax"], np.ones(MIB, np.float32))


def test_a_collected_kept_value_is_released_on_its_worker(
    coordinator: ClusterCoordinator, tmp_path: Path
) -> None:
    rv = coordinator.schedule(_ones, args=(str(tmp_path), "gc", 2 * MIB), keep_result=True)
    assert rv.nbytes == 8 * MIB
    holder = rv.worker
    assert holder is not None
    held = _session_bytes(coordinator, holder)
    assert held >= 8 * MIB
    del rv
    gc.collect()
    wait_until(
        lambda: _session_bytes(coordinator, holder) <= held - 8 * MIB, "the release on the holder"
    )


def _kept_then_holder_killed(cluster: Any, coordinator: Any, tmp_path: Path) -> tuple[Any, int]:
    """A 4 MiB value kept on some worker, and that worker SIGKILLed: (its RemoteValue, the
    holder's index)."""
    producer = coordinator.schedule(_ones, args=(str(tmp_path), "p", MIB), keep_result=True)
    assert producer.nbytes == 4 * MIB
    holder = producer.worker
    assert holder is not None
    cluster.kill_worker(holder)
    return producer, holder


def test_a_holder_killed_before_its_consumer_ran_remakes_the_value(
    tmp_path: Path,
) -> None:
    with local_cluster(2) as cluster, cluster.coordinator(recovery_timeout=30) as coordinator:
        producer, holder = _kept_then_holder_killed(cluster, coordinator, tmp_path)
        wait_until(
            lambda: coordinator.workers[holder].state != "up", "the coordinator to see it down"
        )
        consumer = coordinator.schedule(_total, args=(producer,))
        assert consumer.fetch(timeout=120) == float(MIB)
        assert len(runs(tmp_path, "p")) == 2  # lineage ran the producer once more
        assert producer.worker == 1 - holder
        assert coordinator.join(timeout=60) is True


def test_fetching_a_kept_value_whose_holder_was_killed_remakes_it(tmp_path: Path) -> None:
    with local_cluster(2) as cluster, cluster.coordinator(recovery_timeout=30) as coordinator:
        producer, holder = _kept_then_holder_killed(cluster, coordinator, tmp_path)
        np.testing.assert_array_equal(producer.fetch(timeout=120), np.ones(MIB, np.float32))
        assert len(runs(tmp_path, "p")) == 2  # lineage ran the producer once more
        assert producer.worker == 1 - holder
        assert coordinator.metrics()["kept_values_fetched"] == 1


def test_a_holder_killed_after_its_consumer_started_reruns_both(tmp_path: Path) -> None:
    gate = str(tmp_path / "open")
    with local_cluster(2) as cluster, cluster.coordinator(recovery_timeout=60) as coordinator:
        producer = coordinator.schedule(_ones, args=(str(tmp_path), "p", MIB), keep_result=True)
        assert producer.nbytes == 4 * MIB
        holder = producer.worker
        assert holder is not None
        consumer = coordinator.schedule(_gated_total, args=(str(tmp_path), gate, producer))
        wait_until(lambda: list(tmp_path.glob("started.*")), "the consumer to start")
        cluster.kill_worker(holder)
        cluster.restart_worker(holder)  # same address, a new process: the value is gone
        Path(gate).touch()
        assert consumer.fetch(timeout=120) == float(MIB)
        assert len(runs(tmp_path, "p")) == 2
        assert coordinator.join(timeout=60) is True
        assert consumer.fetch() == float(MIB)  # ended once, with the right value


def test_kept_values_are_the_sessions_own(cluster: Any, tmp_path: Path) -> None:
    from jaxcluster._native import core

    first = cluster.coordinator()
    rv = first.schedule(_ones, args=(str(tmp_path), "s", MIB), keep_result=True)
    assert rv.nbytes == 4 * MIB
    holder, session = rv.worker, first.session_id
    assert _session_bytes(first, holder) >= 4 * MIB
    # Another session cannot take it as an input: the value is not its own.
    with cluster.coordinator() as second, pytest.raises(ValueError, match="another Cluster"):
        second.schedule(_total, args=(rv,))
    first.shutdown()  # EndSession: the holder releases what the session kept
    client = core.WorkerClient(cluster.addresses[holder], auth_token=cluster.auth_token)

    def released() -> bool:
        sessions = client.get_status(timeout=10.0).sessions
        return all(s.id != session or s.bytes == 0 for s in sessions)

    wait_until(released, "the session's kept value released at shutdown")
