"""What a worker reports about its JAX runtime: devices, platform, versions."""

from __future__ import annotations

from typing import Any

__all__ = ["jax_runtime_info"]


def _tf_names(devices: list[Any], worker_index: int) -> list[str]:
    try:
        from jaxcluster.devices import tf_device_names
    except ImportError:
        tf_device_names = None
    if tf_device_names is not None:
        return list(tf_device_names(devices, job="worker"))
    # Same format, used until jaxcluster.devices is available in this build.
    return [
        f"/job:worker/replica:0/task:{worker_index}/device:{d.platform.upper()}:{d.id}"
        for d in devices
    ]


def jax_runtime_info(worker_index: int) -> dict[str, Any]:
    """``devices`` as ``(tf_name, device_type)`` pairs, ``platform`` and ``jax_version``.

    Imports JAX and initialises its default backend, as the closures will anyway.
    """
    import jax

    devices = list(jax.local_devices())
    names = _tf_names(devices, worker_index)
    return {
        "devices": [(name, d.platform.upper()) for name, d in zip(names, devices, strict=True)],
        "platform": jax.default_backend(),
        "jax_version": jax.__version__,
    }
