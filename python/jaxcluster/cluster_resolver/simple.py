"""``SimpleClusterResolver``: a resolver over a cluster spec you already have."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from jaxcluster.cluster_resolver.base import ClusterResolver, format_master_url
from jaxcluster.cluster_spec import ClusterSpec

__all__ = ["SimpleClusterResolver"]


class SimpleClusterResolver(ClusterResolver):
    """Returns the cluster spec, master and task it was constructed with.

    As ``tf.distribute.cluster_resolver.SimpleClusterResolver``; ``cluster_spec`` may also be a
    plain dict, which is turned into a :class:`ClusterSpec`.

    Example::

        >>> spec = ClusterSpec({"worker": ["127.0.0.1:2222", "127.0.0.1:2223"]})
        >>> r = SimpleClusterResolver(spec, task_type="worker", task_id=1, rpc_layer="grpc")
        >>> r.master("worker", 0)
        'grpc://127.0.0.1:2222'
    """

    def __init__(
        self,
        cluster_spec: ClusterSpec | Mapping[str, Any],
        master: str = "",
        task_type: str | None = None,
        task_id: int | None = None,
        environment: str = "",
        num_accelerators: Mapping[str, int] | None = None,
        rpc_layer: str | None = None,
    ) -> None:
        super().__init__()
        if isinstance(cluster_spec, Mapping):
            cluster_spec = ClusterSpec(cluster_spec)
        if not isinstance(cluster_spec, ClusterSpec):
            raise TypeError(
                "cluster_spec must be a ClusterSpec or a dict of job name -> addresses; got "
                f"{type(cluster_spec).__name__} {cluster_spec!r}"
            )
        if not isinstance(master, str):
            raise TypeError(f"master must be a string; got {type(master).__name__} {master!r}")
        self._cluster_spec = cluster_spec
        self._master = master
        self._task_type = task_type
        self._task_id = task_id
        self._environment = environment
        self._num_accelerators = dict(num_accelerators) if num_accelerators else None
        self._rpc_layer = rpc_layer

    def cluster_spec(self) -> ClusterSpec:
        """The cluster spec given to the constructor."""
        return self._cluster_spec

    def master(
        self,
        task_type: str | None = None,
        task_id: int | None = None,
        rpc_layer: str | None = None,
    ) -> str:
        """The given task's address, or (without both) the ``master`` given to the constructor."""
        if task_type is not None and task_id is not None:
            address = self._cluster_spec.task_address(task_type, task_id)
        else:
            address = self._master
        return format_master_url(address, rpc_layer or self._rpc_layer)

    def num_accelerators(
        self,
        task_type: str | None = None,
        task_id: int | None = None,
        config_proto: Any = None,
    ) -> dict[str, int]:
        """The ``num_accelerators`` given to the constructor, or ``{}``."""
        del task_type, task_id, config_proto
        return dict(self._num_accelerators or {})
