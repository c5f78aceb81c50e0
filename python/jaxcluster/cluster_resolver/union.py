"""``UnionClusterResolver``: the jobs of several resolvers merged into one cluster."""

from __future__ import annotations

from typing import Any

from jaxcluster.cluster_resolver.base import ClusterResolver, format_master_url
from jaxcluster.cluster_spec import ClusterSpec, JobTasks

__all__ = ["UnionClusterResolver", "UnionResolver"]


def _merge_specs(specs: list[ClusterSpec]) -> ClusterSpec:
    # First pass: a job stays a list only if every resolver gives it as a list; one sparse
    # (or empty) contribution turns it into an index -> address dict.
    as_dicts = [spec.as_dict() for spec in specs]
    merged: dict[str, JobTasks] = {}
    for cluster in as_dicts:
        for job, tasks in cluster.items():
            if isinstance(tasks, dict) or job not in merged:
                merged[job] = {} if isinstance(tasks, dict) else []
    for position, cluster in enumerate(as_dicts):
        for job, tasks in cluster.items():
            target = merged[job]
            if isinstance(target, list):
                assert isinstance(tasks, list)
                target.extend(tasks)
                continue
            incoming = dict(enumerate(tasks)) if isinstance(tasks, list) else tasks
            clash = sorted(set(incoming) & set(target))
            if clash:
                raise KeyError(
                    f"cannot merge job {job!r}: task indices {clash} are given both by resolver "
                    f"{position} ({[incoming[i] for i in clash]}) and by an earlier resolver "
                    f"({[target[i] for i in clash]}); sparse jobs must not overlap"
                )
            target.update(incoming)
    return ClusterSpec(merged)


class UnionClusterResolver(ClusterResolver):
    """Merges the cluster specs of several resolvers; the first one supplies the rest.

    Jobs given as lists by every resolver are concatenated in argument order. When any resolver
    gives a job as a sparse dict, the job is merged by task index and an index given twice
    raises ``KeyError``. ``task_type``, ``task_id``, ``rpc_layer`` default to the first
    resolver's unless given here (an explicit ``task_id=0`` is honoured).

    Example::

        >>> from jaxcluster import ClusterSpec
        >>> from jaxcluster.cluster_resolver import SimpleClusterResolver
        >>> a = SimpleClusterResolver(ClusterSpec({"worker": ["w0:2222"]}))
        >>> b = SimpleClusterResolver(ClusterSpec({"worker": ["w1:2222"], "ps": ["p0:2222"]}))
        >>> UnionClusterResolver(a, b).cluster_spec().as_dict()
        {'worker': ['w0:2222', 'w1:2222'], 'ps': ['p0:2222']}
    """

    def __init__(
        self,
        *args: ClusterResolver,
        task_type: str | None = None,
        task_id: int | None = None,
        rpc_layer: str | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__()
        if kwargs:
            raise ValueError(
                f"unexpected keyword arguments {sorted(kwargs)}; UnionClusterResolver accepts "
                "only task_type, task_id and rpc_layer"
            )
        if not args:
            raise ValueError("UnionClusterResolver needs at least one ClusterResolver; got none")
        for position, resolver in enumerate(args):
            if not isinstance(resolver, ClusterResolver):
                raise TypeError(
                    f"argument {position} of UnionClusterResolver must be a ClusterResolver; "
                    f"got {type(resolver).__name__} {resolver!r}"
                )
        self._cluster_resolvers = tuple(args)
        self._task_type = task_type
        self._task_id = task_id
        self._rpc_layer = rpc_layer
        #: An environment set on this resolver (``None``: the first resolver's).
        self._environment_set: str | None = None

    def cluster_spec(self) -> ClusterSpec:
        """The merged cluster spec, re-resolved from every resolver on each call."""
        return _merge_specs([r.cluster_spec() for r in self._cluster_resolvers])

    def slices(self) -> list[list[str]] | None:
        """Every resolver's slices in argument order, when each resolver that has workers
        knows its slices (several ``TPUClusterResolver`` s: one slice per TPU); else
        ``None``, and the coordinator groups the workers by ``hosts_per_slice``."""
        grouped: list[list[str]] = []
        for resolver in self._cluster_resolvers:
            known = getattr(resolver, "slices", None)
            spec = resolver.cluster_spec()
            has_workers = "worker" in spec.jobs and bool(list(spec.job_tasks("worker")))
            if not callable(known):
                if has_workers:
                    return None
                continue
            mine = known()
            if has_workers and not mine:
                return None
            grouped.extend(mine or [])
        return grouped or None

    def master(
        self,
        task_type: str | None = None,
        task_id: int | None = None,
        rpc_layer: str | None = None,
    ) -> str:
        """The given task's address in the merged spec, else the first resolver's master."""
        if task_type is not None and task_id is not None:
            address = self.cluster_spec().task_address(task_type, task_id)
            return format_master_url(address, rpc_layer or self.rpc_layer)
        return self._cluster_resolvers[0].master(rpc_layer=rpc_layer)

    # `is None` checks, not `or`: TF's `or` drops an explicit task_id=0 override.
    @property
    def task_type(self) -> str | None:
        """The ``task_type`` given here, else the first resolver's."""
        if self._task_type is not None:
            return self._task_type
        return self._cluster_resolvers[0].task_type

    @task_type.setter
    def task_type(self, task_type: str | None) -> None:
        self._task_type = task_type

    @property
    def task_id(self) -> int | None:
        """The ``task_id`` given here (``0`` included), else the first resolver's."""
        if self._task_id is not None:
            return self._task_id
        return self._cluster_resolvers[0].task_id

    @task_id.setter
    def task_id(self, task_id: int | None) -> None:
        self._task_id = task_id

    @property
    def rpc_layer(self) -> str | None:
        """The ``rpc_layer`` given here, else the first resolver's."""
        if self._rpc_layer is not None:
            return self._rpc_layer
        return self._cluster_resolvers[0].rpc_layer

    @rpc_layer.setter
    def rpc_layer(self, rpc_layer: str | None) -> None:
        self._rpc_layer = rpc_layer

    @property
    def environment(self) -> str | None:
        """The environment set here, else the first resolver's."""
        if self._environment_set is not None:
            return self._environment_set
        return self._cluster_resolvers[0].environment

    @environment.setter
    def environment(self, environment: str | None) -> None:
        self._environment_set = environment

    def num_accelerators(
        self,
        task_type: str | None = None,
        task_id: int | None = None,
        config_proto: Any = None,
    ) -> Any:
        """The first resolver's accelerator count."""
        return self._cluster_resolvers[0].num_accelerators(task_type, task_id, config_proto)


UnionResolver = UnionClusterResolver
"""Alias, as in TF."""
