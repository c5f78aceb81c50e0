"""``SageMakerClusterResolver``: the training cluster of an Amazon SageMaker job.

SageMaker sets ``SM_HOSTS`` (a JSON list such as ``["algo-1", "algo-2"]``) and
``SM_CURRENT_HOST`` (``"algo-2"``) in every container. As in TF, the hosts are sorted by name,
each becomes one ``worker`` task on ``port``, and this process is the current host's task.
"""

from __future__ import annotations

import json
import os
from typing import Any

from jaxcluster.cluster_resolver.base import ClusterResolver, format_master_url
from jaxcluster.cluster_spec import ClusterSpec

__all__ = ["SM_CURRENT_HOST_ENV", "SM_HOSTS_ENV", "SageMakerClusterResolver"]

SM_HOSTS_ENV = "SM_HOSTS"
SM_CURRENT_HOST_ENV = "SM_CURRENT_HOST"


def _read_environment() -> tuple[list[str], str]:
    """Sorted hosts and the current host; ``ValueError`` naming the variable when bad."""
    missing = [name for name in (SM_HOSTS_ENV, SM_CURRENT_HOST_ENV) if name not in os.environ]
    if missing:
        raise ValueError(
            f"not a SageMaker environment: {' and '.join(missing)} "
            f"{'is' if len(missing) == 1 else 'are'} not set; expected {SM_HOSTS_ENV} "
            f"(e.g. '[\"algo-1\", \"algo-2\"]') and {SM_CURRENT_HOST_ENV} (e.g. 'algo-1')"
        )
    raw_hosts = os.environ[SM_HOSTS_ENV]
    if raw_hosts.strip() == "":
        hosts: Any = []
    else:
        try:
            hosts = json.loads(raw_hosts)
        except json.JSONDecodeError as exc:
            raise ValueError(
                f"{SM_HOSTS_ENV} is not valid JSON ({exc.msg} at column {exc.colno}): "
                f'{raw_hosts!r}; expected a list of host names like \'["algo-1", "algo-2"]\''
            ) from None
    if not isinstance(hosts, list) or not all(isinstance(h, str) for h in hosts):
        raise ValueError(
            f"{SM_HOSTS_ENV} is {raw_hosts!r}; expected a JSON list of host-name strings "
            'like \'["algo-1", "algo-2"]\''
        )
    return sorted(hosts), os.environ[SM_CURRENT_HOST_ENV]


class SageMakerClusterResolver(ClusterResolver):
    """One ``worker`` task per SageMaker host, read from ``SM_HOSTS``/``SM_CURRENT_HOST``.

    The environment is read on every call. When the current host is not in ``SM_HOSTS`` the
    cluster spec is empty and the task unknown, as in TF.

    Example::

        >>> os.environ.update(SM_HOSTS='["algo-1", "algo-2"]', SM_CURRENT_HOST="algo-2")
        >>> r = SageMakerClusterResolver(port=2223)
        >>> r.cluster_spec().as_dict(), r.task_type, r.task_id
        ({'worker': ['algo-1:2223', 'algo-2:2223']}, 'worker', 1)
    """

    def __init__(
        self,
        port: int = 2223,
        task_type: str | None = None,
        task_id: int | None = None,
        rpc_layer: str | None = None,
        environment: str | None = None,
    ) -> None:
        super().__init__()
        if isinstance(port, bool) or not isinstance(port, (int, str)) or not str(port).isdigit():
            raise ValueError(f"port is {port!r}; expected a TCP port number such as 2223")
        self._port = str(port)
        self._task_type = task_type
        self._task_id = task_id
        self._rpc_layer = rpc_layer
        self._environment = environment

    def _config(self) -> dict[str, Any]:
        hosts, current = _read_environment()
        if current not in hosts:
            return {}
        return {
            "cluster": {"worker": [f"{host}:{self._port}" for host in hosts]},
            "task": {"type": "worker", "index": hosts.index(current)},
        }

    @property
    def task_type(self) -> str | None:
        """``task_type`` if given, else ``'worker'`` when the current host is in ``SM_HOSTS``."""
        if self._task_type is not None:
            return str(self._task_type)
        task = self._config().get("task", {})
        return str(task["type"]) if "type" in task else None

    @task_type.setter
    def task_type(self, task_type: str | None) -> None:
        self._task_type = task_type

    @property
    def task_id(self) -> int | None:
        """``task_id`` if given, else the current host's position among the sorted hosts."""
        if self._task_id is not None:
            return int(self._task_id)
        task = self._config().get("task", {})
        return int(task["index"]) if "index" in task else None

    @task_id.setter
    def task_id(self, task_id: int | None) -> None:
        self._task_id = task_id

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
        """``{'worker': ['<host>:<port>', ...]}`` over the sorted hosts, or empty."""
        return ClusterSpec(self._config().get("cluster", {}))

    def master(
        self,
        task_type: str | None = None,
        task_id: int | None = None,
        rpc_layer: str | None = None,
    ) -> str:
        """The task's address as a master URL, or ``''`` when the task is unknown."""
        task_type = task_type if task_type is not None else self.task_type
        task_id = task_id if task_id is not None else self.task_id
        if task_type is None or task_id is None:
            return ""
        address = self.cluster_spec().task_address(task_type, task_id)
        return format_master_url(address, rpc_layer or self.rpc_layer)

    def jax_distributed_args(self, coordinator_port: int | str | None = None) -> dict[str, Any]:
        """As :meth:`ClusterResolver.jax_distributed_args`; says why when the host is missing."""
        hosts, current = _read_environment()
        if current not in hosts:
            raise ValueError(
                f"{SM_CURRENT_HOST_ENV} is {current!r}, which is not among {SM_HOSTS_ENV} "
                f"{hosts!r}; expected the current host to be one of the training hosts"
            )
        return super().jax_distributed_args(coordinator_port)
