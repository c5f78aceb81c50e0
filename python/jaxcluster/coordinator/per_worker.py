"""Per-worker values: one element per worker, resident on the workers.

A :class:`PerWorkerValues` passed (anywhere) in a closure's arguments reaches the closure
as the element of the worker that runs it. Elements live on the workers as per-worker
resources of the dispatcher: built there asynchronously, rebuilt when a failed worker comes
back, and released on every worker once nothing refers to them any more — neither this
object nor a closure still queued with it (the dispatcher's handle is reference-counted, so
dropping the last ``PerWorkerValues`` is what releases them; an explicit release would
break closures still waiting to use the iterator).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from jaxcluster.coordinator import _encoding

if TYPE_CHECKING:
    from jaxcluster.coordinator._host import PerWorkerHost

__all__ = ["PerWorkerDataset", "PerWorkerIterator", "PerWorkerValue", "PerWorkerValues"]

_Self = TypeVar("_Self", bound="PerWorkerValues")


class PerWorkerValues:
    """A value with one element per worker; closures receive their worker's element.

    Made by ``iter()`` of a per-worker dataset (the elements are iterators that live on the
    workers) or, as in TF, from one value per worker in worker-index order.

    Example::

        ds = coordinator.create_per_worker_dataset(lambda: range(100))
        it = iter(ds)                                 # a PerWorkerValues of iterators
        rv = coordinator.schedule(lambda it: next(it), args=(it,))

        scale = PerWorkerValues([1.0, 2.0])           # worker 0 gets 1.0, worker 1 gets 2.0
        coordinator.schedule(lambda s: s * 10, args=(scale,))
    """

    def __init__(self, values: Sequence[Any]) -> None:
        if isinstance(values, (str, bytes)) or not isinstance(values, Iterable):
            raise TypeError(
                f"PerWorkerValues takes a sequence with one value per worker, got "
                f"{type(values).__qualname__}"
            )
        self._values: tuple[Any, ...] | None = tuple(values)
        self._resource: Any = None
        self._owner: Any = None
        self._lock = threading.Lock()
        self._description = f"{len(self._values)} values"

    @classmethod
    def _from_resource(
        cls: type[_Self], resource: Any, owner: PerWorkerHost, description: str
    ) -> _Self:
        self = cls.__new__(cls)
        self._values = None
        self._resource = resource
        self._owner = owner
        self._lock = threading.Lock()
        self._description = description
        return self

    def _resource_for(self, host: PerWorkerHost) -> Any:
        """The dispatcher resource holding the elements, created on first use on
        ``host`` (the coordinator's per-worker interface)."""
        with self._lock:
            if self._resource is None:
                assert self._values is not None
                self._check_values(host)
                self._resource = host.create_resource(_ElementOf(self._values))
                self._owner = host
        if self._owner is not host:
            raise ValueError(
                f"this PerWorkerValues ({self._description}) belongs to another "
                "ClusterCoordinator; its elements live on that coordinator's workers"
            )
        return self._resource

    def _check_values(self, host: PerWorkerHost) -> None:
        assert self._values is not None
        workers = host.num_workers
        if len(self._values) != workers:
            raise ValueError(
                f"PerWorkerValues has {len(self._values)} values but the coordinator has "
                f"{workers} workers; expected one value per worker, in worker-index order"
            )

    def state(self, worker: int) -> str:
        """Where the element of ``worker`` stands: ``"pending"``, ``"ready"``,
        ``"failed"`` or ``"aborted"`` (``"pending"`` before its first use)."""
        if self._resource is None:
            return "pending"
        return str(self._resource.state(worker))

    def __reduce_ex__(self, protocol: Any) -> Any:
        return _encoding.placeholder(self)

    def __repr__(self) -> str:
        return f"<PerWorkerValues of {self._description}>"


#: TF's alias.
PerWorkerValue = PerWorkerValues


class PerWorkerIterator(PerWorkerValues):
    """What ``iter()`` of a per-worker dataset returns: one iterator per worker.

    It is advanced inside closures (``next(it)`` on the worker's own iterator), never here.
    """

    def __iter__(self) -> PerWorkerIterator:
        return self

    def __next__(self) -> Any:
        raise TypeError(
            "a per-worker iterator cannot be advanced on the coordinator: its iterators live "
            "on the workers. Pass it to schedule() and call next() inside the closure"
        )


class _ElementOf:
    """Runs on a worker: that worker's element of the given per-worker values."""

    def __init__(self, values: tuple[Any, ...]) -> None:
        self._values = values

    def __call__(self) -> Any:
        from jaxcluster.worker.context import get_current_worker_index

        index = get_current_worker_index()
        if not 0 <= index < len(self._values):
            raise IndexError(
                f"worker {index} has no element in these PerWorkerValues: they hold "
                f"{len(self._values)} values, one per worker when they were first used, and "
                "this worker joined later (add_workers). Values made on the workers "
                "(create_per_worker_dataset, create_per_worker_state) are built on added "
                "workers too"
            )
        return self._values[index]


class _WorkerIterator:
    """A per-worker iterator as it lives on its worker: ``next()`` past the end raises
    ``OutOfRangeError`` (as TF's per-worker iterators do), which is also a ``StopIteration``
    so a ``for`` loop over it inside a closure ends quietly."""

    __slots__ = ("_iterator",)

    def __init__(self, iterator: Iterator[Any]) -> None:
        self._iterator = iterator

    def __iter__(self) -> _WorkerIterator:
        return self

    def __next__(self) -> Any:
        try:
            return next(self._iterator)
        except StopIteration:
            from jaxcluster.errors import OutOfRangeError

            raise OutOfRangeError(
                "end of sequence: this worker's per-worker iterator is exhausted (its "
                "dataset_fn() iterable has no more elements); catch OutOfRangeError around "
                "schedule/join to end the epoch, or make the dataset repeat"
            ) from None


class _IteratorFactory:
    """Runs on a worker: a fresh iterator over ``dataset_fn()``."""

    def __init__(self, dataset_fn: Callable[[], Iterable[Any]]) -> None:
        self._dataset_fn = dataset_fn

    def __call__(self) -> Iterator[Any]:
        dataset = self._dataset_fn()
        try:
            return _WorkerIterator(iter(dataset))
        except TypeError:
            raise TypeError(
                f"dataset_fn returned an object of type {type(dataset).__qualname__}, which is "
                "not iterable; "
                "expected an iterable (a list, a generator, a data loader...)"
            ) from None


class PerWorkerDataset:
    """A dataset made on every worker by ``dataset_fn()``; see
    ``ClusterCoordinator.create_per_worker_dataset``.

    Each ``iter()`` returns a new :class:`PerWorkerValues` of worker-resident iterators,
    built asynchronously from a fresh ``dataset_fn()`` call on each worker. ``iter()``
    never raises a ``dataset_fn`` error: a closure given the failed iterator fails with
    ``ClosureInputError`` instead.

    Example::

        ds = coordinator.create_per_worker_dataset(lambda: iter(range(10)))
        it = iter(ds)
        coordinator.schedule(lambda it: next(it), args=(it,)).fetch()  # 0
    """

    def __init__(self, host: PerWorkerHost, dataset_fn: Callable[[], Any]) -> None:
        if not callable(dataset_fn):
            raise TypeError(
                f"create_per_worker_dataset needs a callable dataset_fn taking no arguments, "
                f"got {type(dataset_fn).__qualname__}: {dataset_fn!r}"
            )
        self._host = host
        self._factory = _IteratorFactory(dataset_fn)
        self._name = getattr(dataset_fn, "__qualname__", type(dataset_fn).__qualname__)

    def __iter__(self) -> PerWorkerIterator:
        resource = self._host.create_resource(self._factory)
        return PerWorkerIterator._from_resource(
            resource, self._host, f"iterators over {self._name}()"
        )

    def __repr__(self) -> str:
        return f"<PerWorkerDataset of {self._name}()>"
