"""TF-style names for JAX devices, and the TPU layout read off device names.

TF code and TPU tooling speak in device names such as
``/job:worker/replica:0/task:3/device:TPU:7``; JAX speaks in ``jax.Device`` objects. This
module converts the latter to the former and re-exports the Rust-backed helpers that read a
TPU system's shape from names.

Example::

    from jaxcluster.devices import tf_device_names, tpu_device_map, verify_same_core_count

    names = tf_device_names()  # e.g. ['/job:worker/replica:0/task:0/device:CPU:0']
    cores_by_host, total_cores = tpu_device_map(names)
    cores_per_host = verify_same_core_count(cores_by_host)
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, NamedTuple, Protocol

from jaxcluster._native import core

if TYPE_CHECKING:
    from jaxcluster._core import DeviceSpec as DeviceSpec
    from jaxcluster._core import tpu_device_map as tpu_device_map
    from jaxcluster._core import verify_same_core_count as verify_same_core_count
else:
    DeviceSpec = core.DeviceSpec
    tpu_device_map = core.tpu_device_map
    verify_same_core_count = core.verify_same_core_count

__all__ = [
    "DeviceLike",
    "DeviceSpec",
    "LogicalDevice",
    "device_type",
    "device_types",
    "export_platform",
    "list_logical_devices",
    "tf_device_name",
    "tf_device_names",
    "tpu_device_map",
    "verify_same_core_count",
]


class DeviceLike(Protocol):
    """What the converters read from a device: ``jax.Device`` has all three."""

    @property
    def platform(self) -> str: ...

    @property
    def id(self) -> int: ...

    @property
    def process_index(self) -> int: ...


# JAX reports NVIDIA and AMD GPUs as "gpu" but some versions and plugins say "cuda"/"rocm";
# TF calls all of them GPU.
_TF_TYPES = {"cpu": "CPU", "gpu": "GPU", "cuda": "GPU", "rocm": "GPU", "tpu": "TPU"}


def device_type(device: DeviceLike) -> str:
    """The TF device type of a JAX device: ``CPU``, ``GPU``, ``TPU``, or the upper-cased
    platform name for anything else."""
    platform = _attribute(device, "platform")
    if not isinstance(platform, str) or not platform or "/" in platform or ":" in platform:
        raise ValueError(
            f"device {device!r} has platform {platform!r}; expected a non-empty name without "
            "'/' or ':' such as 'cpu', 'gpu' or 'tpu'"
        )
    return _TF_TYPES.get(platform.lower(), platform.upper())


def tf_device_name(device: DeviceLike, job: str = "worker") -> str:
    """``/job:<job>/replica:0/task:<process_index>/device:<TYPE>:<id>`` for one device."""
    _check_job(job)
    kind = device_type(device)
    task = _index(device, "process_index")
    index = _index(device, "id")
    return f"/job:{job}/replica:0/task:{task}/device:{kind}:{index}"


def tf_device_names(devices: Iterable[DeviceLike] | None = None, job: str = "worker") -> list[str]:
    """TF-style names of ``devices`` (default: ``jax.devices()``), in the same order."""
    return [name for name, _ in device_types(devices, job)]


def device_types(
    devices: Iterable[DeviceLike] | None = None, job: str = "worker"
) -> list[tuple[str, str]]:
    """``(name, device_type)`` pairs for ``devices`` (default: ``jax.devices()``).

    This is the shape a TPU resolver's ``device_lister`` returns, e.g.
    ``[('/job:worker/replica:0/task:0/device:TPU:0', 'TPU'), ...]``.
    """
    _check_job(job)
    if devices is None:
        import jax  # deferred: importing JAX costs about a second

        devices = jax.devices()
    return [(tf_device_name(device, job), device_type(device)) for device in devices]


class LogicalDevice(NamedTuple):
    """``tf.config.LogicalDevice``: a device's TF-style name and its TF device type."""

    name: str
    device_type: str


def list_logical_devices(device_type: str | None = None) -> list[LogicalDevice]:
    """This process's JAX devices as ``tf.config.list_logical_devices`` lists them, named
    ``/job:localhost/replica:0/task:<process>/device:<TYPE>:<id>``; only ``device_type``'s
    (``'GPU'``, ``'TPU'``, ``'CPU'``) when given. A resolver's ``num_accelerators()`` counts
    this list, naming ``localhost`` as the resolver's own task. Imports JAX.

    Example::

        list_logical_devices("GPU")
        # [LogicalDevice(name='/job:localhost/replica:0/task:0/device:GPU:0', device_type='GPU')]
    """
    import jax  # deferred: importing JAX costs about a second

    pairs = device_types(jax.local_devices(), job="localhost")
    return [LogicalDevice(name, kind) for name, kind in pairs if device_type in (None, kind)]


def _check_job(job: object) -> None:
    if not isinstance(job, str) or not job or "/" in job or ":" in job:
        raise ValueError(
            f"job {job!r} cannot appear in a device name; expected a non-empty str without "
            "'/' or ':' such as 'worker'"
        )


def _attribute(device: object, name: str) -> object:
    try:
        return getattr(device, name)
    except AttributeError:
        raise TypeError(
            f"{device!r} ({type(device).__name__}) has no attribute {name!r}; expected a "
            "jax.Device or an object with platform, id and process_index"
        ) from None


def _index(device: DeviceLike, name: str) -> int:
    value = _attribute(device, name)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"device {device!r} has {name} {value!r}; expected a non-negative int")
    return value


def export_platform(backend: str | None = None) -> str:
    """This process's JAX backend named as ``jax.export`` names platforms.

    JAX calls an NVIDIA or AMD backend ``"gpu"``, but ``jax.export`` lowers for ``"cuda"``
    or ``"rocm"`` and refuses ``"gpu"`` on a machine without one: a coordinator with no GPU
    can export for ``"cuda"`` workers only if they report ``"cuda"``. Other backends
    (``"cpu"``, ``"tpu"``) are named the same by both. Imports JAX.

    Example::

        export_platform()   # 'cpu' here, 'cuda' on an NVIDIA GPU worker, 'tpu' on a TPU VM
    """
    import jax

    platform = jax.default_backend() if backend is None else backend
    if platform != "gpu":
        return platform
    try:  # JAX's own alias resolution ("gpu" -> the GPU platform present)
        from jax._src import xla_bridge

        return str(xla_bridge.canonicalize_platform(platform))
    except Exception:  # a JAX without that private helper: ask the backend what it runs on
        version = str(getattr(jax.devices()[0].client, "platform_version", "")).lower()
        return "rocm" if "rocm" in version else "cuda"
