"""The abstract ``ClusterResolver`` every resolver subclasses, and ``format_master_url``.

Same interface as ``tf.distribute.cluster_resolver.ClusterResolver``, plus
:meth:`ClusterResolver.jax_distributed_args`, the bridge to ``jax.distributed.initialize``.
"""

from __future__ import annotations

import abc
import collections
from typing import Any

from jaxcluster.cluster_resolver._bridge import distributed_args, process_order
from jaxcluster.cluster_spec import ClusterSpec

__all__ = ["ClusterResolver", "format_master_url"]


def format_master_url(master: str, rpc_layer: str | None = None) -> str:
    """``"grpc://host:port"`` when ``rpc_layer`` is set, else ``master`` unchanged.

    Example::

        >>> format_master_url("10.0.0.1:8470", "grpc")
        'grpc://10.0.0.1:8470'
    """
    return f"{rpc_layer}://{master}" if rpc_layer else master


class ClusterResolver(abc.ABC):
    """Finds the tasks of a cluster and which of them this process is.

    Subclasses implement :meth:`cluster_spec` and :meth:`master`; both re-resolve on every
    call, so a resolver sees the cluster as it is now. ``task_type``, ``task_id`` and
    ``rpc_layer`` are ``None`` and ``environment`` is ``''`` until set, even in a subclass whose
    ``__init__`` never calls ``super().__init__()``.

    Example::

        class StaticResolver(ClusterResolver):
            def cluster_spec(self):
                return ClusterSpec({"worker": ["127.0.0.1:2222", "127.0.0.1:2223"]})

            def master(self, task_type=None, task_id=None, rpc_layer=None):
                return ""

        r = StaticResolver()
        r.task_type, r.task_id = "worker", 1
        r.jax_distributed_args()
        # {'coordinator_address': '127.0.0.1:2222', 'num_processes': 2, 'process_id': 1}
    """

    # Class-level defaults keep the properties readable in subclasses that skip __init__.
    _task_type: str | None = None
    _task_id: int | None = None
    _rpc_layer: str | None = None
    _environment: str | None = ""

    @abc.abstractmethod
    def cluster_spec(self) -> ClusterSpec:
        """The current cluster: every job and the address of each of its tasks."""

    @abc.abstractmethod
    def master(
        self,
        task_type: str | None = None,
        task_id: int | None = None,
        rpc_layer: str | None = None,
    ) -> str:
        """The address of one task (by default this process's), as a master URL."""

    @property
    def task_type(self) -> str | None:
        """Job name of this process's task, or ``None`` when unknown."""
        return self._task_type

    @task_type.setter
    def task_type(self, task_type: str | None) -> None:
        self._task_type = task_type

    @property
    def task_id(self) -> int | None:
        """Index of this process's task within its job, or ``None`` when unknown."""
        return self._task_id

    @task_id.setter
    def task_id(self, task_id: int | None) -> None:
        self._task_id = task_id

    @property
    def rpc_layer(self) -> str | None:
        """Protocol prefix for master URLs (e.g. ``"grpc"``), or ``None``."""
        return self._rpc_layer

    @rpc_layer.setter
    def rpc_layer(self, rpc_layer: str | None) -> None:
        self._rpc_layer = rpc_layer

    @property
    def environment(self) -> str | None:
        """The cluster environment, e.g. ``"google"`` for TPU pods; ``''`` when none.
        Settable, as ``task_type``, ``task_id`` and ``rpc_layer`` are."""
        return self._environment

    @environment.setter
    def environment(self, environment: str | None) -> None:
        self._environment = environment

    def num_accelerators(
        self,
        task_type: str | None = None,
        task_id: int | None = None,
        config_proto: Any = None,
    ) -> dict[str, int]:
        """Accelerators by device type, e.g. ``{"GPU": 8}``; CPUs are not counted.

        Counts JAX devices, by TF-style device name
        (``/job:<job>/replica:0/task:<id>/device:<TYPE>:<n>``). Without ``task_type`` and
        ``task_id``: this process's local devices. With both: that task's devices only — every
        process's devices are known once ``jax.distributed`` is initialised (the task's process
        is found in :meth:`cluster_spec`'s process order); before that only this process's
        own, named with this resolver's task, so another task counts ``{}`` (as in TF, which
        counts the devices of the task's name among those it can see). On a CPU-only machine
        the result is empty, as in TF. ``config_proto`` is accepted for TF compatibility and
        ignored.

        Example::

            resolver.num_accelerators()                          # {'GPU': 8}
            resolver.num_accelerators("worker", 3)               # {'GPU': 8} once distributed

        Note that listing devices initialises JAX's backends: call this after
        ``jaxcluster.initialize()`` in a multi-process job, not before.
        """
        del config_proto
        from jaxcluster.devices import DeviceSpec

        counts: collections.defaultdict[str, int] = collections.defaultdict(int)
        whole_task = task_type is not None and task_id is not None
        for name, kind in self._device_names((task_type, task_id) if whole_task else None):
            if kind == "CPU":
                continue
            if whole_task:
                # Parsed, not matched as text: '/task:1' must not match '/task:10' (it does
                # in TF's substring test).
                spec = DeviceSpec.from_string(name)
                if spec.job != task_type or spec.task != int(task_id):  # type: ignore[arg-type]
                    continue
            counts[kind] += 1
        return counts

    def _device_names(self, task: tuple[Any, Any] | None) -> list[tuple[str, str]]:
        """``(TF-style name, device type)`` of this process's devices (as
        :func:`jaxcluster.devices.list_logical_devices` lists them, ``localhost`` named as
        this resolver's task), or, asked about a ``task``, of every device JAX knows (all
        processes once ``jax.distributed`` is up; ``ValueError`` when that task is not in the
        cluster spec)."""
        import jax  # deferred: importing jax costs a second and resolvers may not need it

        from jaxcluster import devices as device_listing
        from jaxcluster.devices import DeviceSpec, device_type

        if task is not None and jax.process_count() > 1:
            order = process_order(self.cluster_spec())
            if (task[0], int(task[1])) not in order:
                raise ValueError(
                    f"task ({task[0]!r}, {task[1]!r}) is not in the cluster spec "
                    f"({self.cluster_spec().as_dict()!r})"
                )
            devices = list(jax.devices())
            if any(d.process_index >= len(order) for d in devices):
                raise ValueError(
                    f"jax.distributed runs {jax.process_count()} processes but the cluster spec "
                    f"has {len(order)} tasks ({self.cluster_spec().as_dict()!r}); the resolver "
                    "does not describe this JAX cluster"
                )
            tasks = [order[d.process_index] for d in devices]
        else:
            job, index = "localhost", 0
            if self.task_type is not None and self.task_id is not None:
                job, index = self.task_type, int(self.task_id)
            names = []
            # Looked up on the module at each call: it is the one listing of this process's
            # devices (and what TF's tests replace, as they replace tf.config's).
            for device in device_listing.list_logical_devices():
                spec = DeviceSpec.from_string(device.name)
                if spec.job == "localhost":
                    spec = spec.replace(job=job, task=index)
                names.append((spec.to_string(), device.device_type))
            return names
        return [
            (f"/job:{job}/replica:0/task:{index}/device:{device_type(d)}:{d.id}", device_type(d))
            for d, (job, index) in zip(devices, tasks, strict=True)
        ]

    def jax_distributed_args(self, coordinator_port: int | str | None = None) -> dict[str, Any]:
        """Arguments for ``jax.distributed.initialize`` consistent with :meth:`cluster_spec`.

        Returns ``dict(coordinator_address=..., num_processes=..., process_id=...)``. Process
        ids number the tasks job by job (``chief`` first, then the other jobs in cluster-spec
        order); the coordinator is process 0's address with its port replaced by
        ``coordinator_port`` or the ``JAX_COORDINATOR_PORT`` environment variable when given.
        ``ValueError`` when the spec has no tasks or this process's task is not in it.
        """
        return distributed_args(self.cluster_spec(), self.task_type, self.task_id, coordinator_port)
