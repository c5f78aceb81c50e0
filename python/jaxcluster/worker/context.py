"""Which worker is running the current closure, and the token this worker process uses.

The executor runs one closure at a time per process, so the index is process-wide (not
thread-local): threads a closure starts, and iterators it advances, see it too.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = [
    "get_current_worker_index",
    "get_worker_auth_token",
    "running_on_worker",
    "set_worker_auth_token",
    "swap_current_index",
]

_current_index: int | None = None
_auth_token: str | None = None


def get_current_worker_index() -> int:
    """The index of the worker executing the current closure, as its coordinator counts
    workers (TF's meaning): the ``worker`` task index for the cluster's first workers, the
    next free index for a worker added later (``add_workers``, ``refresh_interval``); a
    closure sent by a plain client without one gets the worker's ``--index``.

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


def set_worker_auth_token(token: str | None) -> None:
    """Records the token this worker was started with (``--auth-token-file`` or
    ``JAXCLUSTER_AUTH_TOKEN``), so code running in closures can reach parameter servers."""
    global _auth_token
    _auth_token = token


def get_worker_auth_token() -> str | None:
    """The token of this process: the one recorded by :func:`set_worker_auth_token`, else
    ``JAXCLUSTER_AUTH_TOKEN`` (surrounding whitespace ignored), else ``None``.

    Parameter-server variables used inside a closure authenticate with it, so they never
    carry a token in their pickled form.

    Example::

        token = get_worker_auth_token()   # e.g. on a worker started by LocalCluster
    """
    if _auth_token is not None:
        return _auth_token
    return os.environ.get("JAXCLUSTER_AUTH_TOKEN", "").strip() or None
