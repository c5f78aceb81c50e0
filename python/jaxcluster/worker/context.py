"""Which worker is running the current closure.

The executor runs one closure at a time per process, so the index is process-wide (not
thread-local): threads a closure starts, and iterators it advances, see it too.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["get_current_worker_index", "running_on_worker", "swap_current_index"]

_current_index: int | None = None


def get_current_worker_index() -> int:
    """The index of the worker executing the current closure (its ``--index``).

    Raises ``RuntimeError`` when called anywhere but inside a closure (or a
    ``dataset_fn``) running on a worker.

    Example::

        def step(batch):
            return batch.sum() * (get_current_worker_index() + 1)
    """
    if _current_index is None:
        raise RuntimeError(
            "get_current_worker_index() was called outside a closure running on a worker; "
            "it only has a value inside functions the coordinator schedules (fn passed to "
            "ClusterCoordinator.schedule or a dataset_fn)"
        )
    return _current_index


def swap_current_index(index: int | None) -> int | None:
    """Sets the current worker index; returns the previous one (to restore afterwards).

    The executor's per-closure form of :func:`running_on_worker`, without a generator.
    """
    global _current_index
    previous = _current_index
    _current_index = index
    return previous


@contextmanager
def running_on_worker(index: int) -> Iterator[None]:
    """Marks the enclosed code as running on worker ``index``."""
    global _current_index
    previous = _current_index
    _current_index = index
    try:
        yield
    finally:
        _current_index = previous
