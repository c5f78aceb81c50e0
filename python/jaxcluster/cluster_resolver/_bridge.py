"""From a cluster spec and a task to the arguments of ``jax.distributed.initialize``.

Process ids number the tasks job by job: ``chief`` first, then the other jobs in the order the
cluster spec lists them, each job's tasks by index. Every process computes the same numbering
from the same spec, which is what lets them agree on ids without talking to each other.
"""

from __future__ import annotations

import os
from typing import Any

from jaxcluster.cluster_resolver._hints import did_you_mean, format_choices
from jaxcluster.cluster_spec import ClusterSpec

__all__ = [
    "JAX_COORDINATOR_PORT_ENV",
    "distributed_args",
    "parse_port",
    "process_order",
    "with_port",
]

JAX_COORDINATOR_PORT_ENV = "JAX_COORDINATOR_PORT"


def process_order(spec: ClusterSpec) -> list[tuple[str, int]]:
    """``(job, index)`` of every task, in process-id order."""
    jobs = spec.jobs
    if "chief" in jobs:
        jobs = ["chief"] + [job for job in jobs if job != "chief"]
    return [(job, index) for job in jobs for index in spec.task_indices(job)]


def parse_port(value: object, source: str) -> int:
    """A TCP port from an int or a decimal string; ``ValueError`` naming ``source`` if not."""
    if isinstance(value, bool):
        port = None
    elif isinstance(value, int):
        port = value
    elif isinstance(value, str) and value.strip().isdigit():
        port = int(value.strip())
    else:
        port = None
    if port is None or not 1 <= port <= 65535:
        raise ValueError(f"{source} is {value!r}; expected a TCP port number from 1 to 65535")
    return port


def _split_host_port(address: str) -> tuple[str, str | None]:
    if address.startswith("["):  # [v6]:port or [v6]
        end = address.find("]")
        if end == -1:
            raise ValueError(f"address {address!r} opens '[' for an IPv6 host but never closes it")
        rest = address[end + 1 :]
        return address[: end + 1], (rest[1:] if rest.startswith(":") else None)
    if address.count(":") == 1:
        host, port = address.split(":")
        return host, port
    # No colon, or a bare IPv6 address whose colons are not a port separator.
    return address, None


def with_port(address: str, port: int | None) -> str:
    """``address`` with its port replaced by ``port`` (kept when ``port`` is ``None``)."""
    if "://" in address:  # a scheme such as grpc:// is not part of the coordinator address
        address = address.split("://", 1)[1]
    host, old_port = _split_host_port(address)
    if port is None:
        if not old_port:
            raise ValueError(
                f"the coordinator address {address!r} has no port; pass coordinator_port= "
                f"or set {JAX_COORDINATOR_PORT_ENV}"
            )
        return address
    if ":" in host and not host.startswith("["):
        host = f"[{host}]"
    return f"{host}:{port}"


def distributed_args(
    spec: ClusterSpec,
    task_type: str | None,
    task_id: int | str | None,
    coordinator_port: int | str | None = None,
) -> dict[str, Any]:
    """``coordinator_address``, ``num_processes`` and ``process_id`` for one task of ``spec``."""
    order = process_order(spec)
    if not order:
        raise ValueError(
            "cannot derive jax.distributed arguments: the cluster spec has no tasks "
            f"({spec!r}); expected at least one job with one task"
        )
    if coordinator_port is not None:
        port: int | None = parse_port(coordinator_port, "coordinator_port")
    elif os.environ.get(JAX_COORDINATOR_PORT_ENV):
        port = parse_port(os.environ[JAX_COORDINATOR_PORT_ENV], JAX_COORDINATOR_PORT_ENV)
    else:
        port = None
    coordinator = with_port(spec.task_address(*order[0]), port)
    return {
        "coordinator_address": coordinator,
        "num_processes": len(order),
        "process_id": _process_id(spec, order, task_type, task_id),
    }


def _process_id(
    spec: ClusterSpec,
    order: list[tuple[str, int]],
    task_type: str | None,
    task_id: int | str | None,
) -> int:
    if task_type is None or task_id is None:
        if len(order) == 1:  # a one-task cluster: this process must be that task
            return 0
        raise ValueError(
            f"cannot tell which task this process is (task_type={task_type!r}, "
            f"task_id={task_id!r}) in a cluster of {len(order)} tasks "
            f"(jobs: {format_choices(spec.jobs)}); set task_type and task_id on the resolver"
        )
    if task_type not in spec.jobs:
        raise ValueError(
            f"task type {task_type!r} is not a job in the cluster "
            f"(jobs: {format_choices(spec.jobs)}){did_you_mean(task_type, spec.jobs)}"
        )
    try:
        index = int(task_id)
    except (TypeError, ValueError):
        raise ValueError(f"task id {task_id!r} is not an integer") from None
    try:
        return order.index((task_type, index))
    except ValueError:
        raise ValueError(
            f"job {task_type!r} has no task {index} "
            f"(indices: {format_choices(spec.task_indices(task_type))})"
        ) from None
