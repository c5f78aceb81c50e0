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

``on_preemption`` says what a preemption notice changes: ``"rebuild"`` (the default) treats
the preempted worker's replacement as any restarted worker. With ``"save"`` the coordinator
copies that worker's value to its own memory (a numpy pytree) as soon as the notice arrives,
before the notice's deadline: the preempting worker, which refuses every other closure,
still runs these *preemption saves* of its own session's state and stays up for them
(``coordinator/preemption_save.py``). When that worker index is next built (the worker
restarted on its address, or replaced), its value is built from the copy instead of by
``init_fn`` (put on the default device, as ``assign`` does; on a multi-host slice each
array sharded over the slice as it was when saved), and the copy is dropped. A
save that cannot finish before the deadline (the worker vanished first) leaves that worker
to ``init_fn``, with a WARNING naming the state and the worker: progress is never lost
quietly. Other workers are not affected; ``state.preemption_saves`` counts the saves.

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

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from jaxcluster import errors
from jaxcluster.coordinator.per_worker import PerWorkerValues
from jaxcluster.coordinator.remote_value import RemoteValueStatus

if TYPE_CHECKING:
    from jaxcluster.coordinator._host import PerWorkerHost

__all__ = ["DeviceState", "PerWorkerElement", "PerWorkerState", "PreemptionSaves"]

ON_WORKER_RESTART = ("rebuild", "lose")

#: What happens to a worker's value when that worker announces its preemption.
ON_PREEMPTION = ("rebuild", "save")

_log = logging.getLogger("jaxcluster.coordinator")

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

    #: Created with ``on_preemption="save"``, and not yet read by a preemption save.
    _awaits_save = False

    def __init__(self, value: Any) -> None:
        self._value = value

    @property
    def awaits_preemption_save(self) -> bool:
        """Whether a worker being preempted must still let its coordinator copy this
        state (created with ``on_preemption="save"``, not read by a save yet)."""
        return self._awaits_save

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


@dataclass(frozen=True)
class _Layout:
    """How one array leaf of a slice's state was sharded over the slice's devices (a
    ``NamedSharding`` spanning hosts), so its saved copy is laid out the same way again."""

    device_ids: list[Any]  # the mesh's device ids, nested as the mesh
    axis_names: tuple[str, ...]
    spec: tuple[Any, ...]


def _layouts(jax: Any, value: Any) -> list[_Layout | None]:
    """Per leaf of ``value``: its layout when it is sharded over more than this host."""
    from jax.sharding import NamedSharding

    out: list[_Layout | None] = []
    for leaf in jax.tree_util.tree_leaves(value):
        sharding = getattr(leaf, "sharding", None)
        spans_hosts = isinstance(leaf, jax.Array) and not leaf.is_fully_addressable
        if spans_hosts and isinstance(sharding, NamedSharding):
            mesh = sharding.mesh
            ids = mesh.device_ids.tolist()
            out.append(_Layout(ids, tuple(mesh.axis_names), tuple(sharding.spec)))
        else:
            out.append(None)
    return out


def _laid_out(jax: Any, value: Any, layouts: list[_Layout | None]) -> Any:
    """``value`` (numpy leaves) with each leaf that had a layout sharded as it was; the
    other leaves as they are (``_on_device`` puts them on the default device)."""
    import numpy as np
    from jax.sharding import Mesh, NamedSharding, PartitionSpec

    leaves, tree = jax.tree_util.tree_flatten(value)
    if len(leaves) != len(layouts):
        return value
    devices = {d.id: d for d in jax.devices()}
    out = []
    for leaf, layout in zip(leaves, layouts, strict=True):
        if layout is not None:
            grid = np.vectorize(devices.__getitem__, otypes=[object])(np.array(layout.device_ids))
            sharding = NamedSharding(Mesh(grid, layout.axis_names), PartitionSpec(*layout.spec))
            host = np.asarray(leaf)
            leaf = jax.make_array_from_callback(host.shape, sharding, lambda i, h=host: h[i])
        out.append(leaf)
    return jax.tree_util.tree_unflatten(tree, out)


class _StateInit:
    """Runs on a worker: ``init_fn()``, its arrays put on the worker's devices; or, given
    the copy saved before this worker index's preemption, that copy instead (a slice's
    arrays sharded over the slice as they were when saved)."""

    def __init__(self, init_fn: Callable[[], Any], save: bool = False) -> None:
        self._init_fn = init_fn
        self._save = save

    def __call__(self, *saved: Any) -> DeviceState:
        import jax

        if saved:
            value, layouts = saved[0]
            value = _laid_out(jax, value, layouts)
        else:
            value = self._init_fn()
        state = DeviceState(_on_device(jax, value))
        state._awaits_save = self._save
        return state


def _built(state: DeviceState) -> None:
    """Runs on a worker once its state is there (built or re-attached)."""


def _read_state(state: DeviceState) -> Any:
    """Runs on a worker: the state's value, sent back as numpy arrays."""
    return state.value


def _save_state(state: DeviceState) -> Any:
    """Runs on a worker being preempted (a preemption save): ``(value, layouts)``, the
    state's value sent back as numpy arrays and how a slice's arrays were sharded over it
    (``_StateInit`` takes both); the worker need not stay up for this state any more."""
    import jax

    state._awaits_save = False
    return state.value, _layouts(jax, state.value)


@dataclass(frozen=True)
class PreemptionSaves:
    """How often a state's value was copied off a preempted worker
    (``PerWorkerState.preemption_saves``; ``on_preemption="save"``).

    Example: ``state.preemption_saves.saved`` (1 after one worker's preemption)
    """

    #: Copies taken before the notice's deadline (each used by that worker's replacement).
    saved: int = 0
    #: Saves that could not finish in time: that worker's replacement ran ``init_fn``.
    failed: int = 0
    #: Bytes received by the saves, summed.
    bytes: int = 0


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

    _host: PerWorkerHost

    _name: str = ""
    _on_preemption: str = "rebuild"
    _reattached: bool | None = None
    #: Replaced (never mutated) by the coordinator's ``PreemptionSaver``.
    _saves: PreemptionSaves = PreemptionSaves()

    @classmethod
    def _create(
        cls,
        host: PerWorkerHost,
        init_fn: Callable[[], Any],
        on_worker_restart: str,
        name: str = "",
        on_preemption: str = "rebuild",
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
        if on_preemption not in ON_PREEMPTION:
            raise ValueError(
                f"on_preemption={on_preemption!r}; expected 'rebuild' (a preempted worker's "
                "replacement runs init_fn) or 'save' (it starts from a copy fetched before "
                "the notice's deadline)"
            )
        if on_preemption == "save" and on_worker_restart != "rebuild":
            raise ValueError(
                f"on_preemption='save' with on_worker_restart={on_worker_restart!r}: a saved "
                "copy is used when the preempted worker's state is built again, which "
                "on_worker_restart='rebuild' asks for"
            )
        if not isinstance(name, str):
            raise TypeError(f"name={name!r}; expected a str (or None for unnamed state)")
        save = on_preemption == "save"
        resource = host.create_resource(
            _StateInit(init_fn, save), rebuild=on_worker_restart == "rebuild", name=name
        )
        fn_name = getattr(init_fn, "__qualname__", type(init_fn).__qualname__)
        self = cls._from_resource(resource, host, f"device state from {fn_name}()")
        self._host = host
        self._name = name
        self._on_preemption = on_preemption
        if save:
            host.save_on_preemption(self)
        return self

    @property
    def preemption_saves(self) -> PreemptionSaves:
        """How often this state was copied off a preempted worker, how often that could
        not finish before the deadline, and the bytes copied (``on_preemption="save"``;
        all 0 otherwise). Each save also logs a line: INFO, or WARNING when it failed."""
        return self._saves

    @property
    def description(self) -> str:
        """What the state is, for log lines: ``device state 'NAME'``, else ``device state
        from INIT_FN()``."""
        return f"device state {self._name!r}" if self._name else self._description

    @property
    def on_preemption(self) -> str:
        """``"rebuild"`` or ``"save"``, as given to ``create_per_worker_state``."""
        return self._on_preemption

    @property
    def reattached(self) -> bool:
        """Whether every worker's value was a live named value re-attached (``name=``
        given and an earlier coordinator's state found), so ``init_fn`` ran nowhere.

        Waits until every worker has built or re-attached its value, then logs (INFO)
        which workers re-attached and which built. ``False`` for unnamed state.
        """
        if self._reattached is None:
            host = self._host
            workers = [i for i in range(host.num_workers) if not host.is_removed(i)]
            for worker in workers:
                # Queued behind the value's build on that worker: done once it is there.
                host.schedule_on(worker, _built, (self,)).fetch()
            resource = self._resource_for(host)
            found = [i for i in workers if resource.reattached(i)]
            built = [i for i in workers if i not in found]
            if self._name:
                _log.info(
                    "named state %r: re-attached on workers %s, built by init_fn on workers %s",
                    self._name,
                    found,
                    built,
                )
            self._reattached = bool(self._name) and bool(workers) and not built
        return self._reattached

    @property
    def values(self) -> tuple[PerWorkerElement, ...]:
        """One element per worker, in worker-index order."""
        return tuple(PerWorkerElement(self, i) for i in range(self._host.num_workers))

    def fetch(self, worker: int | None = None, *, timeout: float | None = None) -> Any:
        """The value of ``worker`` (numpy arrays in the same pytree), or a list of every
        worker's value when ``worker`` is None, by worker index (``None`` for a worker
        removed with ``remove_workers``, whose state was released; ``AbortedError`` when
        asked for that worker alone).

        Reads the state as it is when the worker gets to it: call ``join()`` first to see
        every scheduled closure's effect. The read is a closure for that worker alone, queued
        behind the state's (re)building there, so it waits while the state is being built,
        up to ``timeout`` seconds (``DeadlineExceededError``); a worker that restarts under
        it reads the rebuilt state. Raises ``AbortedError`` for a state lost with its worker
        (``on_worker_restart="lose"``) or a worker removed or given up, and the error its
        ``init_fn`` raised there.
        """
        host = self._host
        workers = host.num_workers
        if worker is None:
            return [
                None if host.is_removed(i) else self.fetch(i, timeout=timeout)
                for i in range(workers)
            ]
        if isinstance(worker, bool) or not isinstance(worker, int) or not 0 <= worker < workers:
            raise IndexError(f"worker={worker!r}; expected an index from 0 to {workers - 1}")
        if host.is_removed(worker):
            raise errors.AbortedError(
                f"worker {worker} ({host.address(worker)}) was removed "
                "(remove_workers); its device state was released"
            )
        if self.state(worker) == "lost":
            raise errors.AbortedError(_lost(worker))
        read = host.schedule_on(worker, _read_state, (self,))
        try:
            return read.fetch(timeout=timeout)
        except errors.DeadlineExceededError:
            raise errors.DeadlineExceededError(
                f"the device state of worker {worker} was not read within timeout={timeout!r} "
                f"seconds (state {self.state(worker)!r}); its worker may be down or still "
                "running init_fn"
            ) from None
        except errors.ClosureInputError as exc:
            original = exc.original_exception
            if isinstance(original, errors.AbortedError) and self.state(worker) == "lost":
                raise errors.AbortedError(_lost(worker)) from exc
            # The state failed to build there: the error init_fn raised.
            raise (original if isinstance(original, BaseException) else exc) from exc

    def __repr__(self) -> str:
        states = [self.state(i) for i in range(self._host.num_workers)]
        return f"<PerWorkerState {self._description}: {states}>"


def _lost(worker: int) -> str:
    return (
        f"the device state of worker {worker} was lost when that worker failed or restarted "
        "(on_worker_restart='lose')"
    )
