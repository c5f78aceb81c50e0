"""Per-worker state that stays on the workers' devices between closures.

``ClusterCoordinator.create_per_worker_state(init_fn)`` runs ``init_fn()`` on every worker
and keeps the pytree of arrays it returns on that worker's devices (host arrays are put on
the default device; JAX arrays keep the sharding ``init_fn`` gave them, e.g. over a
``Mesh`` of the worker's devices). Passed to ``schedule``, it reaches each closure as its
worker's :class:`DeviceState`: read ``state.value``, replace it with ``state.assign(new)``.
Parameters and optimizer state then never cross the wire after creation; ``fetch`` brings
them to the coordinator on demand.

When a worker fails or restarts, its state is either rebuilt by running ``init_fn`` again
(``on_worker_restart="rebuild"``, the default, as datasets are) or reported lost
(``"lose"``): that worker's element of :attr:`PerWorkerState.values` becomes ``ABORTED``
and closures that use the state there fail with ``ClosureInputError`` around an
``AbortedError``. Nothing runs on a silently re-initialised value.

Example::

    state = coordinator.create_per_worker_state(lambda: {"w": jnp.zeros((1024, 1024))})

    def train(state, batch):
        params = state.value
        params, loss = sgd_step(params, batch)   # a jax.jit, donate_argnums=0 if wanted
        state.assign(params)
        return loss

    losses = [coordinator.schedule(train, args=(state, b)) for b in batches]
    coordinator.join()
    params_of_worker_0 = state.fetch(0)          # numpy pytree
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from jaxcluster import errors, wire
from jaxcluster.coordinator.per_worker import PerWorkerValues
from jaxcluster.coordinator.remote_value import RemoteValueStatus

if TYPE_CHECKING:
    from jaxcluster.coordinator.cluster_coordinator import ClusterCoordinator

__all__ = ["DeviceState", "PerWorkerElement", "PerWorkerState"]

ON_WORKER_RESTART = ("rebuild", "lose")

#: How a worker's resource state reads as TF's RemoteValueStatus.
_STATUS = {
    "ready": RemoteValueStatus.READY,
    "failed": RemoteValueStatus.READY,  # holds an error, as a failed RemoteValue does
    "lost": RemoteValueStatus.ABORTED,
    "pending": RemoteValueStatus.NOT_READY,
    "aborted": RemoteValueStatus.NOT_READY,  # being rebuilt with its worker
}


class DeviceState:
    """A worker's pytree of arrays on its devices, as closures receive it.

    Example::

        def step(state, x):
            state.assign(jax.tree_util.tree_map(lambda p: p + x, state.value))
    """

    def __init__(self, value: Any) -> None:
        self._value = value

    @property
    def value(self) -> Any:
        """The pytree of JAX arrays, on this worker's devices."""
        return self._value

    def assign(self, value: Any) -> None:
        """Replaces the state with ``value`` (a pytree; host arrays are put on the default
        device). Buffers of the old value that the new one does not reuse are freed now
        rather than when Python collects them; ones a ``jax.jit`` already donated are
        left alone."""
        import jax

        new = _on_device(jax, value)
        keep = {id(leaf) for leaf in jax.tree_util.tree_leaves(new)}
        old, self._value = self._value, new
        for leaf in jax.tree_util.tree_leaves(old):
            if isinstance(leaf, jax.Array) and id(leaf) not in keep and not leaf.is_deleted():
                leaf.delete()

    @property
    def nbytes(self) -> int:
        """Bytes of all the arrays, summed."""
        import jax

        return sum(
            int(getattr(leaf, "nbytes", 0)) for leaf in jax.tree_util.tree_leaves(self._value)
        )

    def __repr__(self) -> str:
        return f"<DeviceState of {self.nbytes} bytes>"


def _on_device(jax: Any, tree: Any) -> Any:
    return jax.tree_util.tree_map(
        lambda leaf: leaf if isinstance(leaf, jax.Array) else jax.device_put(leaf), tree
    )


class _StateInit:
    """Runs on a worker: ``init_fn()``, its arrays put on the worker's devices."""

    def __init__(self, init_fn: Callable[[], Any]) -> None:
        self._init_fn = init_fn

    def __call__(self) -> DeviceState:
        import jax

        return DeviceState(_on_device(jax, self._init_fn()))


def _read_state(state: DeviceState) -> Any:
    """Runs on a worker: the state's value, sent back as numpy arrays."""
    return state.value


class PerWorkerElement:
    """One worker's element of a :class:`PerWorkerState`: its status and a fetch, like a
    TF ``RemoteValue`` of a per-worker resource."""

    def __init__(self, owner: PerWorkerState, worker: int) -> None:
        self._owner = owner
        self._worker = worker

    @property
    def status(self) -> RemoteValueStatus:
        """``READY`` (on the worker), ``NOT_READY`` (being built, or rebuilt after its worker
        failed) or ``ABORTED`` (lost with its worker; ``on_worker_restart="lose"``)."""
        return _STATUS.get(self._owner.state(self._worker), RemoteValueStatus.NOT_READY)

    def fetch(self, timeout: float | None = None) -> Any:
        """The worker's value as numpy arrays (see :meth:`PerWorkerState.fetch`)."""
        return self._owner.fetch(self._worker, timeout=timeout)

    def __repr__(self) -> str:
        return f"<PerWorkerElement worker={self._worker} {self.status.value}>"


class PerWorkerState(PerWorkerValues):
    """Device-resident state, one pytree per worker; see
    ``ClusterCoordinator.create_per_worker_state``."""

    _coordinator: ClusterCoordinator
    _rebuild: bool

    @classmethod
    def _create(
        cls, coordinator: ClusterCoordinator, init_fn: Callable[[], Any], on_worker_restart: str
    ) -> PerWorkerState:
        if not callable(init_fn):
            raise TypeError(
                f"create_per_worker_state needs a callable init_fn taking no arguments, got "
                f"{type(init_fn).__qualname__}: {init_fn!r}"
            )
        if on_worker_restart not in ON_WORKER_RESTART:
            raise ValueError(
                f"on_worker_restart={on_worker_restart!r}; expected 'rebuild' (run init_fn "
                "again on a restarted worker) or 'lose' (report that worker's state lost)"
            )
        resource = coordinator._create_resource(
            _StateInit(init_fn), rebuild=on_worker_restart == "rebuild"
        )
        name = getattr(init_fn, "__qualname__", type(init_fn).__qualname__)
        self = cls._from_resource(resource, coordinator, f"device state from {name}()")
        self._coordinator = coordinator
        self._rebuild = on_worker_restart == "rebuild"
        self._fetch_lock = threading.Lock()
        return self

    @property
    def values(self) -> tuple[PerWorkerElement, ...]:
        """One element per worker, in worker-index order."""
        return tuple(PerWorkerElement(self, i) for i in range(self._coordinator._num_workers))

    def fetch(self, worker: int | None = None, *, timeout: float | None = None) -> Any:
        """The value of ``worker`` (numpy arrays in the same pytree), or a list of every
        worker's value when ``worker`` is None, by worker index (``None`` for a worker
        removed with ``remove_workers``, whose state was released; ``AbortedError`` when
        asked for that worker alone).

        Reads the state as it is when the worker gets to it: call ``join()`` first to see
        every scheduled closure's effect. Waits while the state is being (re)built there,
        up to ``timeout`` seconds (``DeadlineExceededError``); raises ``AbortedError`` for
        a state lost with its worker, or one whose worker restarted since (the coordinator
        notices a restart when it next sends that worker work, and then rebuilds the state
        or reports it lost), and the error its ``init_fn`` raised there.
        """
        membership = self._coordinator._membership
        if worker is None:
            return [
                None if membership.is_removed(i) else self.fetch(i, timeout=timeout)
                for i in range(len(membership))
            ]
        workers = len(membership)
        if isinstance(worker, bool) or not isinstance(worker, int) or not 0 <= worker < workers:
            raise IndexError(f"worker={worker!r}; expected an index from 0 to {workers - 1}")
        if membership.is_removed(worker):
            raise errors.AbortedError(
                f"worker {worker} ({membership.address(worker)}) was removed "
                "(remove_workers); its device state was released"
            )
        self._wait_built(worker, timeout)
        from jaxcluster.coordinator.functions import pickle_function

        client = self._coordinator._worker_client(worker)
        function = pickle_function(_read_state)
        client.register_function(function.function_hash, function.kind, function.payload)
        encoded = wire.encode(((wire.ResourceRef(self._resource.resource_id),), {}))
        reply = client.run_closure(
            function.function_hash, encoded.pickle, encoded.buffers, timeout=timeout
        )
        error = reply["error"]
        if error is not None:
            if error.kind == "input" and error.type_name == "NotFoundError":
                raise errors.AbortedError(self._gone(worker))
            from jaxcluster.coordinator._errors import build_exception

            raise build_exception(error)
        return wire.decode(reply["value"], reply["buffers"])

    def _gone(self, worker: int) -> str:
        """Why worker ``worker`` does not hold the state although it was built there."""
        then = (
            "it is built again (init_fn) before the next closure there uses it"
            if self._rebuild
            else "it was created with on_worker_restart='lose', so closures that use it there "
            "fail from now on"
        )
        return (
            f"worker {worker} no longer holds its device state: the worker restarted since it "
            f"was built; {then}"
        )

    def _wait_built(self, worker: int, timeout: float | None) -> None:
        deadline = None if timeout is None else time.monotonic() + timeout
        pause = threading.Event()
        while True:
            state = self.state(worker)
            if state in ("ready", "failed"):
                return
            if state == "lost":
                raise errors.AbortedError(
                    f"the device state of worker {worker} was lost when that worker failed "
                    "or restarted (on_worker_restart='lose')"
                )
            if deadline is not None and time.monotonic() >= deadline:
                raise errors.DeadlineExceededError(
                    f"the device state of worker {worker} was not built within "
                    f"timeout={timeout!r} seconds (state {state!r}); its worker may be "
                    "down or still running init_fn"
                )
            pause.wait(0.02)

    def __repr__(self) -> str:
        states = [self.state(i) for i in range(self._coordinator._num_workers)]
        return f"<PerWorkerState {self._description}: {states}>"
