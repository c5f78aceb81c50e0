"""What a worker reports about its JAX runtime: devices, platform, versions."""

from __future__ import annotations

from typing import Any

from jaxcluster.devices import device_type, export_platform

__all__ = ["jax_runtime_info"]


def _named(devices: list[Any], worker_index: int) -> list[tuple[str, str]]:
    # A worker is task <worker_index> of the `worker` job whatever JAX's process_index says
    # (each worker is its own single-process JAX runtime, so that is 0 everywhere); naming
    # the task by worker index keeps the names of different workers' devices distinct, which
    # is what TPU device maps group hosts by.
    named = []
    for device in devices:
        kind = device_type(device)
        named.append((f"/job:worker/replica:0/task:{worker_index}/device:{kind}:{device.id}", kind))
    return named


def jax_runtime_info(worker_index: int) -> dict[str, Any]:
    """``devices`` as ``(tf_name, device_type)`` pairs, their ``device_kind``, ``platform``
    (as ``jax.export`` names it: ``cuda``/``rocm`` where JAX says ``gpu``) and
    ``jax_version``.

    Imports JAX and initialises its default backend, as the closures will anyway.
    """
    import jax

    devices = list(jax.local_devices())
    return {
        "devices": _named(devices, worker_index),
        "device_kind": str(getattr(devices[0], "device_kind", "")) if devices else "",
        "platform": export_platform(),
        "jax_version": jax.__version__,
    }
