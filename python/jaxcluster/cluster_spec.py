"""``ClusterSpec``: the jobs of a cluster and the network address of each task.

Same API and semantics as ``tf.train.ClusterSpec``, without a protobuf dependency.
"""

from __future__ import annotations

import operator
from collections.abc import Mapping
from typing import Any

__all__ = ["ClusterDef", "ClusterSpec", "JobDef"]

# What ``ClusterSpec(...)`` accepts for one job: dense list/tuple or sparse index -> address.
TaskContainer = list[str] | tuple[str, ...] | Mapping[Any, str]
# ``as_dict()`` shows dense jobs as lists and sparse or empty jobs as dicts.
JobTasks = list[str] | dict[int, str]


def _as_str(value: object, what: str) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, bytes):
        # TF accepts bytes here (compat.as_str); keep that so ported code still works.
        try:
            return value.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise TypeError(f"{what} {value!r} is bytes that are not valid UTF-8") from exc
    raise TypeError(f"{what} must be a string, got {type(value).__name__} {value!r}")


def _as_index(value: object, job: str) -> int:
    """Converts an int-like task index (``3``, ``"3"``, ``numpy.int64(3)``) to ``int``."""
    if isinstance(value, bool):
        raise TypeError(f"task index {value!r} of job {job!r} must be an integer, not a bool")
    if isinstance(value, str):
        text = value.strip()
        if not text.lstrip("-").isdigit():
            raise ValueError(
                f"task index {value!r} of job {job!r} is not an integer; "
                "expected a non-negative integer such as 0 or '0'"
            )
        index = int(text)
    else:
        try:
            index = operator.index(value)  # type: ignore[arg-type]
        except TypeError:
            raise TypeError(
                f"task index {value!r} of job {job!r} must be an integer, "
                f"got {type(value).__name__}"
            ) from None
    if index < 0:
        raise ValueError(f"task index {index} of job {job!r} is negative; expected >= 0")
    return index


class JobDef(dict[str, Any]):
    """One job of a :class:`ClusterDef`: ``{"name": str, "tasks": {index: address}}``, also
    readable as ``job.name`` and ``job.tasks`` like TF's ``JobDef`` message."""

    @property
    def name(self) -> str:
        return self["name"]  # type: ignore[no-any-return]

    @property
    def tasks(self) -> dict[int, str]:
        return self["tasks"]  # type: ignore[no-any-return]


class ClusterDef(dict[str, Any]):
    """What :meth:`ClusterSpec.as_cluster_def` returns: ``tf.train.ClusterDef``'s shape as plain
    data, ``{"job": [JobDef, ...]}`` sorted by job name and task index.

    It is a ``dict`` (compares with ``==``, serialises to JSON) whose ``job`` attribute lists
    the jobs as TF's message does, and ``ClusterSpec(cluster_def)`` rebuilds the spec.
    """

    @property
    def job(self) -> list[JobDef]:
        return self["job"]  # type: ignore[no-any-return]


def _cluster_def_jobs(cluster: object) -> list[tuple[object, object]] | None:
    """``[(name, tasks), ...]`` when ``cluster`` is a cluster def — ours, the same dict after a
    JSON round trip, or any object shaped like TF's ``ClusterDef`` message (``.job``, each
    with ``.name`` and ``.tasks``) — else ``None``.

    Unambiguous against a job literally named ``"job"``: that job's tasks would be address
    strings, never records with a name.
    """
    if isinstance(cluster, Mapping):
        if set(cluster) != {"job"}:
            return None
        jobs = cluster["job"]
        if not isinstance(jobs, (list, tuple)) or not jobs:
            return None
        if all(isinstance(j, Mapping) and "name" in j for j in jobs):
            return [(j["name"], j.get("tasks", {})) for j in jobs]
        return None
    jobs = getattr(cluster, "job", None)
    if jobs is None or isinstance(cluster, (str, bytes)):
        return None
    try:
        return [(j.name, dict(j.tasks)) for j in jobs]
    except (AttributeError, TypeError):
        return None


class ClusterSpec:
    """The jobs of a cluster, each a set of tasks with network addresses.

    Jobs are given as a list of addresses (dense: task ``i`` is the ``i``-th address) or a dict
    from task index to address (sparse). Comparison, ``as_dict()`` and ``job_tasks()`` follow
    ``tf.train.ClusterSpec``.

    Example::

        >>> spec = ClusterSpec({"chief": ["c0:2222"], "worker": {1: "w1:2222"}})
        >>> spec.jobs
        ['chief', 'worker']
        >>> spec.task_address("worker", 1)
        'w1:2222'
        >>> spec.job_tasks("worker")
        [None, 'w1:2222']
        >>> ClusterSpec(spec.as_dict()) == spec
        True
    """

    __slots__ = ("_cluster",)

    def __init__(self, cluster: ClusterSpec | Mapping[Any, TaskContainer]) -> None:
        self._cluster: dict[str, dict[int, str]] = {}
        if isinstance(cluster, ClusterSpec):
            self._cluster = {job: dict(tasks) for job, tasks in cluster._cluster.items()}
            return
        items = _cluster_def_jobs(cluster)
        if items is None:
            if not isinstance(cluster, Mapping):
                raise TypeError(
                    "ClusterSpec expects a dict mapping job names to lists (or index->address "
                    "dicts) of addresses, a cluster def (as_cluster_def()), or another "
                    f"ClusterSpec; got {type(cluster).__name__} {cluster!r}"
                )
            items = list(cluster.items())
        elif any(not isinstance(tasks, Mapping) for _, tasks in items):
            raise TypeError(
                "each job of a cluster def must map task indices to addresses, as "
                f"as_cluster_def() gives; got {cluster!r}"
            )
        for raw_job, tasks in items:
            job = _as_str(raw_job, "job name")
            if job in self._cluster:
                raise ValueError(f"job {job!r} is given twice (as {raw_job!r})")
            self._cluster[job] = self._parse_tasks(job, tasks)

    @staticmethod
    def _parse_tasks(job: str, tasks: object) -> dict[int, str]:
        if isinstance(tasks, (list, tuple)):
            return {
                i: _as_str(addr, f"address of task {i} of job {job!r}")
                for i, addr in enumerate(tasks)
            }
        if isinstance(tasks, Mapping):
            parsed: dict[int, str] = {}
            for raw_index, addr in tasks.items():
                index = _as_index(raw_index, job)
                if index in parsed:
                    raise ValueError(
                        f"job {job!r} gives task index {index} twice (last as {raw_index!r})"
                    )
                parsed[index] = _as_str(addr, f"address of task {index} of job {job!r}")
            return dict(sorted(parsed.items()))
        raise TypeError(
            f"the tasks of job {job!r} must be a list of addresses or a dict from task index "
            f"to address; got {type(tasks).__name__} {tasks!r}"
        )

    def _job(self, job_name: str) -> dict[int, str]:
        try:
            return self._cluster[job_name]
        except (KeyError, TypeError):
            known = ", ".join(self._cluster) or "none"
            raise ValueError(f"no job {job_name!r} in the cluster (jobs: {known})") from None

    @property
    def jobs(self) -> list[str]:
        """Job names, in the order they were given."""
        return list(self._cluster)

    def num_tasks(self, job_name: str) -> int:
        """Number of tasks in ``job_name``; ``ValueError`` if there is no such job."""
        return len(self._job(job_name))

    def task_indices(self, job_name: str) -> list[int]:
        """Sorted task indices of ``job_name``; ``ValueError`` if there is no such job."""
        return sorted(self._job(job_name))

    def task_address(self, job_name: str, task_index: int) -> str:
        """Address of one task; ``ValueError`` if the job or the index is unknown."""
        job = self._job(job_name)
        try:
            index = _as_index(task_index, job_name)
        except TypeError as exc:
            raise ValueError(str(exc)) from None
        try:
            return job[index]
        except KeyError:
            indices = ", ".join(map(str, sorted(job))) or "none"
            raise ValueError(
                f"no task with index {task_index!r} in job {job_name!r} (indices: {indices})"
            ) from None

    def job_tasks(self, job_name: str) -> list[str | None]:
        """Addresses of ``job_name`` by index, ``None`` where a sparse job has a hole."""
        job = self._job(job_name)
        if not job:
            return []
        tasks: list[str | None] = [None] * (max(job) + 1)
        for index, address in job.items():
            tasks[index] = address
        return tasks

    def as_dict(self) -> dict[str, JobTasks]:
        """Jobs as a plain dict: a list for indices 0..n-1, else (or when empty) a dict."""
        result: dict[str, JobTasks] = {}
        for job, tasks in self._cluster.items():
            if tasks and max(tasks) + 1 == len(tasks):
                result[job] = [tasks[i] for i in range(len(tasks))]
            else:
                result[job] = dict(tasks)
        return result

    def as_cluster_def(self) -> ClusterDef:
        """The spec in ``tf.train.ClusterDef``'s shape, jobs and tasks sorted.

        ``{"job": [{"name": "worker", "tasks": {0: "w0:2222"}}, ...]}`` — a :class:`ClusterDef`,
        plain data that compares with ``==``, serialises to JSON without protobuf, and turns
        back into this spec with ``ClusterSpec(cluster_def)``.
        """
        return ClusterDef(
            job=[
                JobDef(name=job, tasks=dict(sorted(tasks.items())))
                for job, tasks in sorted(self._cluster.items())
            ]
        )

    def __bool__(self) -> bool:
        return bool(self._cluster)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, ClusterSpec):
            return self._cluster == other._cluster
        if isinstance(other, Mapping):
            # TF compares against its internal dict; accept any dict ClusterSpec accepts.
            try:
                return self._cluster == ClusterSpec(other)._cluster
            except (TypeError, ValueError):
                return False
        return NotImplemented

    def __ne__(self, other: object) -> bool:
        equal = self.__eq__(other)
        return equal if equal is NotImplemented else not equal

    __hash__ = None  # type: ignore[assignment]  # mutable-looking value type, as in TF

    def __repr__(self) -> str:
        return f"ClusterSpec({self.as_dict()!r})"
