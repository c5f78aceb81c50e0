"""Dataflow on the coordinator: submitting closures that keep their result or take other
closures' results, and reading kept values back (``dataflow_tracker.py`` tracks them,
queues them once their producers ended, and re-makes lost values).

:class:`Dataflow` makes a node per such closure and hands it to the :class:`Tracker`,
submits a node's closure with its inputs resolved (a kept producer becomes
``wire.KeptRef(value_id, holder)``, a returned value is inlined), and reads a kept value
back for ``RemoteValue.fetch()`` with the holder's ``ReadValue`` (``Dispatcher.read_value``:
the coordinator's token, TLS and session, the GIL released, counted in ``metrics()``'s
``kept_bytes_fetched``), re-making it by lineage when the holder lost it.
"""

from __future__ import annotations

import time
import weakref
from collections.abc import Callable, Mapping
from typing import Any

from jaxcluster import errors, wire
from jaxcluster._native import core
from jaxcluster.coordinator.dataflow_nodes import Node, producers_of
from jaxcluster.coordinator.dataflow_tracker import Tracker
from jaxcluster.coordinator.structure import map_structure

__all__ = ["Dataflow", "finalize_release", "kept_ref"]

#: A read that failed with one of these lost the value with its holder: the holder no
#: longer holds it (``NOT_FOUND``: released, or a new process) or cannot be reached, which
#: includes a connection that broke mid-read (the RPC layer reports every transport failure
#: ``UNAVAILABLE``: ``rpc/wire/status.rs``). As a worker's pull does, the coordinator then
#: re-makes the value by lineage. Anything else the holder answered is raised.
_LOST = (
    errors.NotFoundError,
    errors.UnavailableError,
)


def _KeptRef(value_id: int, holder: str) -> Any:
    """``wire.KeptRef``, which the worker side defines (the ignore covers a tree without)."""
    return wire.KeptRef(value_id, holder)  # type: ignore[attr-defined,unused-ignore]


def kept_ref(node: Node, addresses: list[str]) -> Any:
    """The ``wire.KeptRef`` a consumer's arguments carry for kept producer ``node``."""
    holder = node.holder()
    assert holder is not None and node.value_id is not None
    return _KeptRef(node.value_id, addresses[holder])


def finalize_release(value: Any, tracker: Tracker, node: Node) -> None:
    """Releases ``node``'s kept value on its holder once ``value`` is collected."""
    weakref.finalize(value, tracker.release_later, node)


class Dataflow:
    """The coordinator's side of dataflow: submitting nodes and pulling kept values.

    ``host`` is the coordinator's ``CoordinatorHost`` (function registration, resources),
    ``functions`` its ``FunctionSerializer``.
    """

    def __init__(
        self,
        dispatcher: Any,
        host: Any,
        functions: Any,
        remote_value: type,
        max_remakes: int | None,
    ) -> None:
        self._dispatcher = dispatcher
        self._host = host
        self._functions = functions
        self._remote_value = remote_value
        self.tracker = Tracker(
            dispatcher, self.submit, lambda rv: getattr(rv, "_node", None), max_remakes
        )

    def producers_of(self, args: Any, kwargs: Any, coordinator: Any) -> list[Any]:
        """The RemoteValues among a closure's arguments (each of ``coordinator``)."""
        return producers_of(args, kwargs, self._remote_value, coordinator)

    def join(self, timeout: float | None) -> bool:
        """``ClusterCoordinator.join``: closures waiting for their producers are not queued
        yet, so wait until none is, then for the queue, until a join ends with nothing new
        submitted. ``False`` once ``timeout`` passed."""
        tracker = self.tracker
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            if not tracker.wait_idle(deadline):
                return False
            epoch = tracker.epoch
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            if not self._dispatcher.join(left):
                return False
            tracker.take_pending_error()
            if tracker.idle() and tracker.epoch == epoch:
                return True

    def schedule(
        self,
        fn: Callable[..., Any],
        args: tuple[Any, ...],
        kwargs: Mapping[str, Any],
        producers: list[Any],
        keep: bool,
        coordinator: Callable[[], Any],
    ) -> Any:
        """The RemoteValue of a dataflow closure, queued now or once its producers end."""
        node = Node(fn, tuple(args), dict(kwargs), producers, keep)
        value = self._remote_value(node.cell, coordinator, "", node)
        if producers:
            self.tracker.add(node)
        else:
            self.tracker.add_running(node, self.submit(node, None))
        if keep:
            finalize_release(value, self.tracker, node)
        return value

    def submit(self, node: Node, worker: int | None) -> Any:
        """Queues ``node``'s closure with its producers' results in its arguments."""
        from jaxcluster.coordinator import _encoding

        addresses = self._dispatcher.worker_addresses()
        kind: type[Any] = self._remote_value

        def resolve(leaf: Any) -> Any:
            if not isinstance(leaf, kind):
                return leaf
            source = getattr(leaf, "_node", None)
            if source is not None and source.keep:
                return kept_ref(source, addresses)
            return leaf.fetch()  # ended: its value is here already

        args = map_structure(resolve, node.args)
        kwargs = map_structure(resolve, dict(node.kwargs))
        if args or kwargs:
            encoded, resources = _encoding.encode_args(args, kwargs, self._host.resource_for)
            pickled, buffers = encoded.pickle, encoded.buffers
        else:
            pickled, buffers, resources = b"", [], []
        function = self._functions.serialize(node.fn, args, kwargs)
        self._host.register(function, node.fn)
        keep_id = self._dispatcher.new_resource_id() if node.keep else None
        node.value_id = keep_id
        if worker is None:
            return self._dispatcher.schedule(
                function.function_hash, pickled, buffers, resources, keep_result_id=keep_id
            )
        return self._dispatcher.schedule_on(
            worker, function.function_hash, pickled, buffers, resources, keep_result_id=keep_id
        )

    def pull(self, value: Any, timeout: float | None) -> Any:
        """A kept value read from its holder with ``ReadValue`` (in this coordinator's
        session, with its token and TLS settings; counted in ``metrics()``'s
        ``kept_bytes_fetched``), re-made by lineage when the holder lost it or cannot be
        reached (at most ``max_closure_retries`` times)."""
        node: Node = value._node
        while True:
            value._kept_info()  # the producer's own error, if it failed
            holder, value_id = node.holder(), node.value_id
            assert holder is not None and value_id is not None
            try:
                encoded = self._dispatcher.read_value(holder, value_id, timeout=timeout)
            except _LOST as exc:
                if node.remakes >= self.tracker._max_remakes:
                    raise self._lost(node, holder, exc) from exc
                self.tracker.remake_now(node)
                if not node.cell.wait(timeout):
                    raise errors.DeadlineExceededError(
                        f"kept value {value_id} of closure {node.name} was lost with its "
                        f"holder ({type(exc).__name__}: {exc}) and was not re-made within "
                        f"timeout={timeout!r} seconds"
                    ) from exc
                continue
            try:
                return wire.decode(encoded.pickle, encoded.buffers)
            except Exception as exc:
                error = errors.InternalError(
                    f"kept value {value_id} arrived but could not be unpickled here: "
                    f"{type(exc).__name__}: {exc}"
                )
                raise error from exc

    def _lost(self, node: Node, holder: int, exc: BaseException) -> BaseException:
        """The error of a kept value still unreadable after every re-make: ``AbortedError``
        when its holder was removed or given up, else the input error the read met."""
        states = {w.index: w.state for w in self._dispatcher.worker_statuses()}
        where = f"worker {holder} ({self._dispatcher.worker_addresses()[holder]})"
        what = f"kept value {node.value_id} of closure {node.name}"
        if states.get(holder) in (core.WorkerState.REMOVED, core.WorkerState.GIVEN_UP):
            return errors.AbortedError(
                f"{what} could not be read: its holder, {where}, is {states[holder]}, and it "
                f"was re-made {node.remakes} times already (max_closure_retries)"
            )
        error = errors.ClosureInputError(exc)
        error.args = (
            f"{what} could not be read from its holder, {where}: {type(exc).__name__}: {exc}; "
            f"it was re-made {node.remakes} times already (max_closure_retries)",
        )
        return error
