"""Many threads scheduling, fetching and joining on one coordinator at once."""

from __future__ import annotations

import threading
from typing import Any

import numpy as np

from jaxcluster.coordinator import ClusterCoordinator

THREADS = 8
PER_THREAD = 150


def _affine(a: int, b: np.ndarray) -> np.ndarray:
    return b * a + 1


def test_many_threads_schedule_and_fetch_concurrently(cluster: Any) -> None:
    errors: list[BaseException] = []
    results: dict[int, list[Any]] = {}
    start = threading.Barrier(THREADS)

    def producer(thread: int, coordinator: ClusterCoordinator) -> None:
        try:
            start.wait(timeout=60)
            mine = []
            for i in range(PER_THREAD):
                key = thread * PER_THREAD + i
                if i % 3 == 0:
                    rv = coordinator.schedule(_affine, args=(key, np.arange(4)))
                else:
                    rv = coordinator.schedule(lambda k: ("id", k), args=(key,))
                mine.append((key, rv))
                if i % 25 == 0:  # fetch while others keep scheduling
                    mine[len(mine) // 2][1].fetch(timeout=120)
                if i % 50 == 49:
                    coordinator.done()
            results[thread] = [(key, rv.fetch(timeout=120)) for key, rv in mine]
        except BaseException as exc:
            errors.append(exc)

    with cluster.coordinator() as coordinator:
        threads = [threading.Thread(target=producer, args=(t, coordinator)) for t in range(THREADS)]
        for t in threads:
            t.start()
        coordinator.join(timeout=300)  # races with the producers; must not raise
        for t in threads:
            t.join(timeout=300)
        assert not errors, errors
        assert coordinator.join() is True
        metrics = coordinator.metrics()
        assert metrics["completed"] == THREADS * PER_THREAD
        assert metrics["queued"] == 0 and metrics["inflight"] == 0
    assert sorted(results) == list(range(THREADS))
    for thread_results in results.values():
        for key, value in thread_results:
            if key % PER_THREAD % 3 == 0:
                np.testing.assert_array_equal(value, np.arange(4) * key + 1)
            else:
                assert value == ("id", key)
