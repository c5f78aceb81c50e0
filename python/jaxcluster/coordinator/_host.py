"""What per-worker values need of their coordinator, and nothing more.

``per_worker.py`` and ``device_state.py`` are given a :class:`PerWorkerHost` instead of the
``ClusterCoordinator``: create a resource on every worker, run a function on one worker,
the number of workers and whether one was removed, and whether the coordinator is still
open. The dispatcher owns every one of those facts; :class:`CoordinatorHost` only asks it.

Example::

    host = CoordinatorHost(dispatcher, FunctionSerializer(), is_closed=lambda: False)
    resource = host.create_resource(make_iterator)
    value = host.schedule_on(0, read_state, (state,)).fetch(timeout=10.0)
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from jaxcluster.coordinator import _encoding
from jaxcluster.coordinator.functions import function_name
from jaxcluster.coordinator.remote_value import RemoteValue

if TYPE_CHECKING:
    from jaxcluster.coordinator.functions import FunctionSerializer, SerializedFunction
    from jaxcluster.coordinator.per_worker import PerWorkerValues
    from jaxcluster.coordinator.preemption_save import PreemptionSaver

__all__ = ["CoordinatorHost", "PerWorkerHost"]


class PerWorkerHost(Protocol):
    """The narrow interface per-worker values use (see the module docstring)."""

    @property
    def num_workers(self) -> int:
        """How many worker indices there are (removed workers included)."""
        ...

    def check_open(self) -> None:
        """Raises ``RuntimeError`` once the coordinator was shut down."""
        ...

    def create_resource(self, fn: Callable[[], Any], rebuild: bool = True, name: str = "") -> Any:
        """A per-worker resource: ``fn()`` runs on every worker and its result stays there
        (with ``name``, a live value of that name is adopted instead)."""
        ...

    def schedule_on(self, worker: int, fn: Callable[..., Any], args: tuple[Any, ...]) -> Any:
        """Runs ``fn(*args)`` on worker ``worker`` alone; returns its ``RemoteValue``."""
        ...

    def is_removed(self, worker: int) -> bool:
        """Whether worker ``worker`` was removed (``remove_workers``)."""
        ...

    def address(self, worker: int) -> str:
        """The address of worker ``worker``."""
        ...

    def save_on_preemption(self, state: Any) -> None:
        """Copies ``state`` off every worker that announces its preemption, for its
        replacement to start from (``on_preemption="save"``)."""
        ...


class CoordinatorHost:
    """A :class:`PerWorkerHost` over one dispatcher; also registers the coordinator's
    functions (once each), so every path that sends a function shares one set."""

    def __init__(
        self,
        dispatcher: Any,
        functions: FunctionSerializer,
        is_closed: Callable[[], bool],
        saver: PreemptionSaver | None = None,
    ) -> None:
        self._dispatcher = dispatcher
        self._functions = functions
        self._is_closed = is_closed
        self._saver = saver
        self._registered: set[bytes] = set()
        self._lock = threading.Lock()

    @property
    def num_workers(self) -> int:
        return int(self._dispatcher.num_workers)

    def check_open(self) -> None:
        if self._is_closed():
            raise RuntimeError("this ClusterCoordinator has been shut down")

    def register(self, function: SerializedFunction, fn: Any = None) -> None:
        """Registers ``function`` with the dispatcher unless it was already."""
        if function.function_hash in self._registered:
            return
        with self._lock:
            if function.function_hash not in self._registered:
                self._dispatcher.register_function(
                    function.function_hash,
                    function.kind,
                    function.payload,
                    function_name(fn),
                )
                self._registered.add(function.function_hash)

    def create_resource(self, fn: Callable[[], Any], rebuild: bool = True, name: str = "") -> Any:
        self.check_open()
        function = self._functions.serialize(fn, (), {})
        self.register(function, fn)
        return self._dispatcher.create_resource(function.function_hash, rebuild=rebuild, name=name)

    def resource_for(self, values: PerWorkerValues) -> Any:
        """The dispatcher resource of ``values`` (created on first use)."""
        return values._resource_for(self)

    def schedule_on(self, worker: int, fn: Callable[..., Any], args: tuple[Any, ...]) -> Any:
        self.check_open()
        encoded, resources = _encoding.encode_args(args, {}, self.resource_for)
        function = self._functions.serialize(fn, args, {})
        self.register(function, fn)
        cell = self._dispatcher.schedule_on(
            worker, function.function_hash, encoded.pickle, encoded.buffers, resources
        )
        return RemoteValue(cell, None, function.origin)

    def is_removed(self, worker: int) -> bool:
        return bool(self._dispatcher.is_removed(worker))

    def address(self, worker: int) -> str:
        return str(self._dispatcher.worker_addresses()[worker])

    def save_on_preemption(self, state: Any) -> None:
        if self._saver is None:
            raise RuntimeError("this coordinator cannot save device state on preemption")
        self._saver.watch(state)
