"""``TFConfigClusterResolver``: the cluster described by the ``TF_CONFIG`` environment variable.

``TF_CONFIG`` is JSON such as::

    {"cluster": {"chief": ["c0:2222"], "worker": ["w0:2222", "w1:2222"]},
     "task": {"type": "worker", "index": 1},
     "rpc_layer": "grpc", "session_master": "..."}

It is read again on every call, so a change in the environment is seen at once. With
``tf_config_file=PATH`` the same JSON is read from a file instead, also on every call: a file
that a scheduler rewrites (a mounted Kubernetes ConfigMap, a shared filesystem) is followed by
``ClusterCoordinator(..., refresh_interval=...)``.
"""

from __future__ import annotations

import json
import os
from typing import Any

from jaxcluster.cluster_resolver._bridge import distributed_args
from jaxcluster.cluster_resolver._hints import did_you_mean, format_choices
from jaxcluster.cluster_resolver.base import ClusterResolver, format_master_url
from jaxcluster.cluster_spec import ClusterSpec

__all__ = ["TF_CONFIG_ENV", "TFConfigClusterResolver"]

TF_CONFIG_ENV = "TF_CONFIG"
_CLUSTER_KEY = "cluster"
_TASK_KEY = "task"
_RPC_LAYER_KEY = "rpc_layer"
_SESSION_MASTER_KEY = "session_master"


def _shorten(text: str, limit: int = 200) -> str:
    return text if len(text) <= limit else text[:limit] + f"... ({len(text)} chars)"


def load_tf_config(path: str | os.PathLike[str] | None = None) -> dict[str, Any]:
    """``TF_CONFIG`` parsed (from the file ``path`` when given); ``{}`` when unset or empty,
    ``ValueError`` when malformed, ``OSError`` when the file cannot be read."""
    if path is None:
        source, raw = TF_CONFIG_ENV, os.environ.get(TF_CONFIG_ENV, "")
    else:
        source = f"{TF_CONFIG_ENV} file {os.fspath(path)}"
        with open(path, encoding="utf-8") as file:
            raw = file.read()
    if not raw.strip():
        return {}
    try:
        config = json.loads(raw)
    except json.JSONDecodeError as exc:
        start = max(exc.pos - 20, 0)
        raise ValueError(
            f"{source} is not valid JSON: {exc.msg} at line {exc.lineno} column "
            f"{exc.colno} (near {raw[start : exc.pos + 20]!r}); value: {_shorten(raw)!r}"
        ) from None
    if not isinstance(config, dict):
        raise ValueError(
            f"{source} must be a JSON object with 'cluster' and 'task' keys; got "
            f"{type(config).__name__} {_shorten(raw)!r}"
        )
    return config


def _task_info(path: str | os.PathLike[str] | None = None) -> dict[str, Any]:
    task = load_tf_config(path).get(_TASK_KEY) or {}
    if not isinstance(task, dict):
        raise ValueError(
            f'{TF_CONFIG_ENV} \'task\' must be an object like {{"type": "worker", '
            f'"index": 0}}; got {task!r}'
        )
    return task


def _as_task_id(value: object, source: str) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise ValueError(f"{source} is {value!r}; expected an integer task index such as 0")
    try:
        return int(value)
    except ValueError:
        raise ValueError(
            f"{source} is {value!r}; expected an integer task index such as 0"
        ) from None


class TFConfigClusterResolver(ClusterResolver):
    """Reads the cluster, this task, the RPC layer and the master from ``TF_CONFIG``.

    As ``tf.distribute.cluster_resolver.TFConfigClusterResolver``: constructor arguments
    override ``TF_CONFIG``; ``task_type`` is cast to ``str`` and ``task_id`` to ``int``.
    ``tf_config_file`` (not in TF) reads the same JSON from that file on every call instead
    of the environment, for a cluster a scheduler rewrites while the job runs.

    Example::

        >>> os.environ["TF_CONFIG"] = json.dumps({
        ...     "cluster": {"worker": ["127.0.0.1:2222", "127.0.0.1:2223"]},
        ...     "task": {"type": "worker", "index": 1}})
        >>> r = TFConfigClusterResolver()
        >>> r.task_type, r.task_id, r.master()
        ('worker', 1, '127.0.0.1:2223')
    """

    def __init__(
        self,
        task_type: str | None = None,
        task_id: int | None = None,
        rpc_layer: str | None = None,
        environment: str | None = None,
        tf_config_file: str | os.PathLike[str] | None = None,
    ) -> None:
        super().__init__()
        self._task_type = task_type
        self._task_id = task_id
        self._rpc_layer = rpc_layer
        self._environment = environment
        self._file = tf_config_file

    @property
    def task_type(self) -> str | None:
        """The constructor's or setter's ``task_type``, else ``TF_CONFIG``'s ``task.type``."""
        if self._task_type is not None:
            return str(self._task_type)
        task = _task_info(self._file)
        return str(task["type"]) if task.get("type") is not None else None

    @task_type.setter
    def task_type(self, task_type: str | None) -> None:
        self._task_type = task_type

    @property
    def task_id(self) -> int | None:
        """The constructor's or setter's ``task_id``, else ``TF_CONFIG``'s ``task.index``."""
        if self._task_id is not None:
            return _as_task_id(self._task_id, "task_id")
        task = _task_info(self._file)
        if task.get("index") is None:
            return None
        return _as_task_id(task["index"], f"{TF_CONFIG_ENV} task index")

    @task_id.setter
    def task_id(self, task_id: int | None) -> None:
        self._task_id = task_id

    @property
    def rpc_layer(self) -> str | None:
        """The constructor's ``rpc_layer``, else ``TF_CONFIG``'s ``rpc_layer``, else ``None``."""
        if self._rpc_layer is not None:
            return self._rpc_layer
        return load_tf_config(self._file).get(_RPC_LAYER_KEY)

    @rpc_layer.setter
    def rpc_layer(self, rpc_layer: str | None) -> None:
        self._rpc_layer = rpc_layer

    def num_accelerators(
        self,
        task_type: str | None = None,
        task_id: int | None = None,
        config_proto: Any = None,
    ) -> Any:
        """As :meth:`ClusterResolver.num_accelerators`, defaulting to this task."""
        task_type = self.task_type if task_type is None else task_type
        task_id = self.task_id if task_id is None else task_id
        return super().num_accelerators(task_type, task_id, config_proto)

    def cluster_spec(self) -> ClusterSpec:
        """``TF_CONFIG``'s ``cluster`` as a ClusterSpec; empty when there is none."""
        cluster = load_tf_config(self._file).get(_CLUSTER_KEY)
        if cluster is None:
            return ClusterSpec({})
        if not isinstance(cluster, dict):
            raise ValueError(
                f"{TF_CONFIG_ENV} 'cluster' must be an object mapping job names to address "
                f"lists; got {type(cluster).__name__} {cluster!r}"
            )
        try:
            return ClusterSpec(cluster)
        except (TypeError, ValueError) as exc:
            raise type(exc)(f"{TF_CONFIG_ENV} 'cluster' is invalid: {exc}") from None

    def master(
        self,
        task_type: str | None = None,
        task_id: int | None = None,
        rpc_layer: str | None = None,
    ) -> str:
        """``session_master`` if set; ``''`` for a one-task cluster; else the task's URL."""
        config = load_tf_config(self._file)
        session_master = config.get(_SESSION_MASTER_KEY)
        if session_master is not None:
            return str(session_master)
        spec = self.cluster_spec()
        jobs = spec.jobs
        # A cluster of one task needs no master: run in-process, as TF does.
        if not jobs or (len(jobs) == 1 and len(spec.job_tasks(jobs[0])) == 1):
            return ""
        task_type = task_type if task_type is not None else self.task_type
        task_id = task_id if task_id is not None else self.task_id
        rpc_layer = rpc_layer if rpc_layer is not None else self.rpc_layer
        return format_master_url(self._task_address(spec, task_type, task_id), rpc_layer)

    @staticmethod
    def _task_address(spec: ClusterSpec, task_type: str | None, task_id: int | None) -> str:
        if task_type is None or task_id is None:
            raise ValueError(
                f"cannot tell this process's task: task type {task_type!r}, task id {task_id!r}; "
                f'set {TF_CONFIG_ENV} \'task\' (e.g. {{"type": "worker", "index": 0}}) or '
                "pass task_type and task_id"
            )
        if task_type not in spec.jobs:
            raise ValueError(
                f"{TF_CONFIG_ENV} task type {task_type!r} is not a job in the cluster "
                f"(jobs: {format_choices(spec.jobs)}){did_you_mean(task_type, spec.jobs)}"
            )
        if int(task_id) not in spec.task_indices(task_type):
            raise ValueError(
                f"{TF_CONFIG_ENV} task index {task_id} is not a task of job {task_type!r} "
                f"(indices: {format_choices(spec.task_indices(task_type))})"
            )
        return spec.task_address(task_type, task_id)

    def jax_distributed_args(self, coordinator_port: int | str | None = None) -> dict[str, Any]:
        """As :meth:`ClusterResolver.jax_distributed_args`, naming ``TF_CONFIG`` in errors."""
        spec = self.cluster_spec()
        if not spec:
            if self._file is not None:
                source, seen = f"{TF_CONFIG_ENV} file {os.fspath(self._file)}", "empty"
            else:
                raw = os.environ.get(TF_CONFIG_ENV)
                source = TF_CONFIG_ENV
                seen = "unset" if raw is None else repr(_shorten(raw))
            raise ValueError(
                f"{source} describes no cluster (it is {seen}); expected JSON like "
                '{"cluster": {"worker": ["host0:port", "host1:port"]}, '
                '"task": {"type": "worker", "index": 0}}'
            )
        task_type, task_id = self.task_type, self.task_id
        if task_type is not None and task_id is not None:
            self._task_address(spec, task_type, task_id)  # raises naming TF_CONFIG
        return distributed_args(spec, task_type, task_id, coordinator_port)
