"""Listing a TPU's devices and counting its cores, for ``TPUClusterResolver``.

Devices come as ``(name, device_type)`` pairs with TF-style names
(``/job:worker/replica:0/task:1/device:TPU:3``) from one of three places: a ``device_lister=``
callable, this process's JAX devices (``tpu='local'``), or the master worker's ``ListDevices``
RPC. Cores per host are counted by ``jaxcluster.devices`` and must be equal on every host.

Example::

    devices = call_lister(lambda: [("/job:worker/replica:0/task:0/device:TPU:0", "TPU")])
    core_counts(devices)    # ({0: [0]}, 1, 1): the map, total cores, cores per host
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, NamedTuple

__all__ = [
    "DeviceInfo",
    "DeviceLister",
    "TPUSystemMetadata",
    "call_lister",
    "check_lister",
    "core_counts",
    "list_devices_over_grpc",
    "local_jax_devices",
]

#: A callable taking no arguments and returning ``(name, device_type)`` pairs.
DeviceLister = Callable[[], Iterable[tuple[str, str]]]


class DeviceInfo(NamedTuple):
    """One device: its TF-style ``name`` and its ``device_type`` (``"TPU"``, ``"CPU"``...)."""

    name: str
    device_type: str


class TPUSystemMetadata(NamedTuple):
    """What ``TPUClusterResolver.get_tpu_system_metadata()`` returns (TF's field names).

    ``topology`` is the slice topology string the Cloud TPU API or the TPU VM reports (e.g.
    ``'2x2x2'``), or ``None`` when unknown; ``devices`` are :class:`DeviceInfo` pairs.
    """

    num_cores: int
    num_hosts: int
    num_of_cores_per_host: int
    topology: str | None
    devices: list[DeviceInfo]


def check_lister(lister: object) -> DeviceLister | None:
    if lister is not None and not callable(lister):
        raise TypeError(
            "device_lister must be a callable taking no arguments and returning "
            f"(name, device_type) pairs; got {type(lister).__name__}: {lister!r}"
        )
    return lister  # type: ignore[return-value]


def call_lister(lister: DeviceLister) -> list[DeviceInfo]:
    """Calls ``lister`` and checks that it returned ``(str, str)`` pairs.

    A lister that raises (a timeout, an unreachable worker) gives ``RuntimeError``, as TF's
    device listing does after its retries.
    """
    try:
        result = lister()
    except Exception as exc:
        raise RuntimeError(
            f"Cannot list the TPU's devices: device_lister {lister!r} raised "
            f"{type(exc).__name__}: {exc}"
        ) from exc
    try:
        items = list(result)
    except TypeError:
        raise TypeError(
            f"device_lister returned {type(result).__name__} {result!r}; expected an iterable "
            "of (name, device_type) pairs"
        ) from None
    devices = []
    for item in items:
        if (
            not isinstance(item, (tuple, list))
            or len(item) != 2
            or not all(isinstance(part, str) for part in item)
        ):
            raise TypeError(
                f"device_lister returned the item {item!r}; expected a (name, device_type) "
                "pair of strings such as ('/job:worker/replica:0/task:0/device:TPU:0', 'TPU')"
            )
        devices.append(DeviceInfo(item[0], item[1]))
    return devices


def local_jax_devices(job: str) -> list[DeviceInfo]:
    """Every JAX device visible to this process (all hosts once ``jax.distributed`` is up)."""
    import jax

    from jaxcluster.devices import tf_device_names

    devices = list(jax.devices())
    names = tf_device_names(devices, job=job)
    return [DeviceInfo(name, d.platform.upper()) for name, d in zip(names, devices, strict=True)]


def list_devices_over_grpc(master: str, timeout: float) -> list[DeviceInfo]:
    """Devices of the jaxcluster worker at ``master`` over its ``ListDevices`` RPC.

    The worker demands a bearer token; it is read from ``JAXCLUSTER_AUTH_TOKEN``, the same
    variable the worker and the coordinator use.
    """
    from jaxcluster._auth import AUTH_TOKEN_ENV, auth_token_from_env
    from jaxcluster._native import core
    from jaxcluster.errors import JaxClusterError

    if not master:
        raise ValueError(
            "Cannot list TPU devices: the resolver has no master address to ask (empty "
            "cluster); pass device_lister= or resolve a TPU first"
        )
    token = auth_token_from_env()
    try:
        client = core.WorkerClient(master, token, timeout, connect_timeout=timeout)
        listed = client.list_devices(timeout)
    except JaxClusterError as exc:
        raise RuntimeError(
            f"Cannot list the devices of the TPU worker at {master!r} over jaxcluster's "
            f"ListDevices RPC: {exc}. Check that `jaxcluster worker` runs there, that "
            f"{AUTH_TOKEN_ENV} holds its token, and that the port is reachable; or pass "
            "device_lister= to TPUClusterResolver."
        ) from exc
    return [DeviceInfo(d["name"], d["device_type"]) for d in listed]


def core_counts(devices: list[DeviceInfo]) -> tuple[dict[Any, list[Any]], int, int]:
    """``(host -> core ids, total cores, cores per host)`` of the TPU devices among ``devices``.

    ``RuntimeError`` naming the hosts when they do not all have the same number of cores.
    """
    from jaxcluster.devices import tpu_device_map, verify_same_core_count

    names = [d.name for d in devices if d.device_type == "TPU"]
    device_map, total = tpu_device_map(names)
    per_host = verify_same_core_count(device_map) if total else 0
    return dict(device_map), int(total), int(per_host)
