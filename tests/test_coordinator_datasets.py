"""Per-worker datasets and values against real workers."""

from __future__ import annotations

import gc
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from jaxcluster import errors
from jaxcluster.coordinator import (
    ClusterCoordinator,
    PerWorkerValues,
    get_current_worker_index,
)
from support.closures import (
    barrier,
    wait_for_file,
    wait_until,
    worker_status,
)

NUM_WORKERS = 2


def numbered_batches() -> Iterator[tuple[int, int]]:
    """A dataset_fn: batches tagged with the worker that built the iterator."""
    index = get_current_worker_index()
    return ((index, i) for i in range(10_000))


def take(iterator: Iterator[Any]) -> tuple[Any, int]:
    return next(iterator), get_current_worker_index()


def take_two(first: Iterator[Any], second: Iterator[Any]) -> tuple[Any, Any]:
    return next(first), next(second)


def fail_at_gate(gate: str) -> None:
    wait_for_file(gate)
    raise RuntimeError("one bad step")


def broken_dataset() -> list[int]:
    return [1 // 0]


def test_each_worker_advances_its_own_iterator(coordinator: ClusterCoordinator) -> None:
    iterator = iter(coordinator.create_per_worker_dataset(numbered_batches))
    rvs = [coordinator.schedule(take, args=(iterator,)) for _ in range(60)]
    assert coordinator.join() is True
    seen: dict[int, list[int]] = {}
    for (built_on, i), ran_on in coordinator.fetch(rvs):
        assert built_on == ran_on  # the closure got its own worker's iterator
        seen.setdefault(ran_on, []).append(i)
    for worker, positions in seen.items():
        # One closure at a time per worker: each iterator advanced without skips or repeats.
        assert sorted(positions) == list(range(len(positions))), worker
    assert sum(len(p) for p in seen.values()) == 60


def test_both_workers_get_iterators(coordinator: ClusterCoordinator, tmp_path: Path) -> None:
    iterator = iter(coordinator.create_per_worker_dataset(numbered_batches))

    def first_batch_at_barrier(it: Iterator[Any]) -> tuple[Any, int]:
        return next(it), barrier(str(tmp_path), NUM_WORKERS)

    rvs = [coordinator.schedule(first_batch_at_barrier, args=(iterator,)) for _ in range(2)]
    results = coordinator.fetch(rvs)
    assert sorted(results) == [((w, 0), w) for w in range(NUM_WORKERS)]


def test_two_datasets_in_one_closure(coordinator: ClusterCoordinator) -> None:
    letters = iter(coordinator.create_per_worker_dataset(lambda: iter("abcdefgh")))
    numbers = iter(coordinator.create_per_worker_dataset(lambda: range(100, 200)))
    value = coordinator.schedule(take_two, args=(letters, numbers)).fetch()
    assert value == ("a", 100)
    kwargs_value = coordinator.schedule(
        lambda *, a, b: (next(a), next(b)), kwargs={"a": letters, "b": numbers}
    ).fetch()
    assert kwargs_value[0] in "ab" and kwargs_value[1] in (100, 101)


def _live_resources(cluster: Any) -> list[int]:
    statuses = [worker_status(cluster, i) for i in range(NUM_WORKERS)]
    return [s["resources_created"] - s["resources_released"] for s in statuses]


def test_repeated_iterator_creation_leaks_nothing(
    cluster: Any, coordinator: ClusterCoordinator
) -> None:
    gc.collect()
    baseline = wait_until(
        lambda: (lambda live: live if live == _live_resources(cluster) else None)(
            _live_resources(cluster)
        ),
        "stable resource counts",
    )
    dataset = coordinator.create_per_worker_dataset(lambda: iter(range(5)))
    for _ in range(20):
        iterator = iter(dataset)
        assert coordinator.schedule(next, args=(iterator,)).fetch() == 0
        del iterator
    before = [worker_status(cluster, i)["resources_created"] for i in range(NUM_WORKERS)]
    assert sum(before) >= 20  # they were really built on the workers
    gc.collect()
    wait_until(
        lambda: _live_resources(cluster) == baseline, "every dropped iterator to be released"
    )


def test_a_failing_dataset_fn_is_an_input_error_only_when_used(
    coordinator: ClusterCoordinator,
) -> None:
    dataset = coordinator.create_per_worker_dataset(broken_dataset)
    unused = iter(dataset)  # never raises here
    wait_until(
        lambda: [unused.state(w) for w in range(NUM_WORKERS)] == ["failed"] * NUM_WORKERS,
        "the iterator's creation to fail on every worker",
    )
    assert coordinator.join() is True  # an unused failed iterator is harmless
    assert coordinator.schedule(lambda: "fine").fetch() == "fine"

    used = iter(dataset)
    rv = coordinator.schedule(next, args=(used,))
    with pytest.raises(errors.ClosureInputError) as info:
        coordinator.join()
    assert isinstance(info.value.original_exception, ZeroDivisionError)
    with pytest.raises(errors.ClosureInputError):
        rv.fetch()
    wait_until(lambda: used.state(0) == "failed" or used.state(1) == "failed", "failed state")
    assert coordinator.join() is True


def test_a_dataset_fn_returning_a_non_iterable_says_so(coordinator: ClusterCoordinator) -> None:
    iterator = iter(coordinator.create_per_worker_dataset(lambda: 42))
    rv = coordinator.schedule(next, args=(iterator,))
    with pytest.raises(
        errors.ClosureInputError, match="returned an object of type int, which is not iterable"
    ):
        coordinator.join()
    assert rv.done()


def test_iterators_still_work_after_a_cancellation(
    coordinator: ClusterCoordinator, tmp_path: Path
) -> None:
    iterator = iter(coordinator.create_per_worker_dataset(numbered_batches))
    before = coordinator.fetch([coordinator.schedule(take, args=(iterator,)) for _ in range(6)])
    gate = tmp_path / "gate"
    gate.touch()
    failing = coordinator.schedule(fail_at_gate, args=(str(gate),))
    wait_until(failing.done, "the failing closure to end")
    cancelled = coordinator.metrics()["cancelled"]
    # The pending error is raised after the closure is queued, which cancels it (as TF).
    with pytest.raises(RuntimeError, match="one bad step"):
        coordinator.schedule(take, args=(iterator,))
    assert coordinator.metrics()["cancelled"] == cancelled + 1
    after = coordinator.fetch([coordinator.schedule(take, args=(iterator,)) for _ in range(6)])
    positions: dict[int, list[int]] = {}
    for (built_on, i), ran_on in before + after:
        assert built_on == ran_on
        positions.setdefault(ran_on, []).append(i)
    for worker, seen in positions.items():
        # The iterators kept their state, and the cancelled closure consumed nothing: each
        # worker's batches are its first ones, each taken once. (Not necessarily in the
        # order scheduled: a closure that reached a worker whose iterator was not built yet
        # goes back to the queue, and one scheduled after it may run first, as in TF.)
        assert sorted(seen) == list(range(len(seen))), worker


def test_per_worker_values_from_a_list(coordinator: ClusterCoordinator, tmp_path: Path) -> None:
    scales = PerWorkerValues([10, 20])

    def scaled_at_barrier(scale: int) -> tuple[int, int]:
        return scale, barrier(str(tmp_path), NUM_WORKERS)

    rvs = [coordinator.schedule(scaled_at_barrier, args=(scales,)) for _ in range(2)]
    assert sorted(coordinator.fetch(rvs)) == [(10, 0), (20, 1)]
    with pytest.raises(ValueError, match="has 3 values but the coordinator has 2 workers"):
        coordinator.schedule(lambda s: s, args=(PerWorkerValues([1, 2, 3]),))


def test_a_per_worker_iterator_is_not_advanced_locally(coordinator: ClusterCoordinator) -> None:
    iterator = iter(coordinator.create_per_worker_dataset(lambda: [1]))
    with pytest.raises(TypeError, match="call next\\(\\) inside the closure"):
        next(iterator)
    with pytest.raises(TypeError, match="callable dataset_fn"):
        coordinator.create_per_worker_dataset([1, 2])  # type: ignore[arg-type]
